"""Unit tests of the generator's parts: error taxonomy and answer shapes, the limiter (slow
start, throttling, outage gate), the outage breaker, the budget, the systematic-error
detector, and the resume index."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from payload.generate.budget import Budget, BudgetReached, Prices, parse_prices
from payload.generate.client import (
    MAX_RETRY_AFTER_S,
    Kind,
    Outcome,
    classify_body,
    parse_retry_after,
)
from payload.generate.journal import (
    drop_failures,
    encode_record,
    id_hash,
    load_index,
    truncate_torn_tail,
)
from payload.generate.limiter import HOLD, RELEASE, Limiter, backoff_delay
from payload.generate.outage import Breaker
from payload.generate.preflight import endpoint_allowed
from payload.generate.run import MaxFailed, parse_max_failed, provider_for
from payload.generate.systematic import Held, SystematicError

pytestmark = pytest.mark.timeout(30)


def ok_body(content: object = "hi", finish: str = "stop", **extra) -> bytes:
    choice = {"index": 0, "finish_reason": finish,
              "message": {"role": "assistant", "content": content}, **extra}
    return json.dumps({"choices": [choice], "usage": {"cost": 0.5}, "provider": "P",
                       "model": "m"}).encode()


def err_body(code: int, **meta) -> bytes:
    err = {"code": code, "message": f"e{code}"}
    if meta:
        err["metadata"] = meta
    return json.dumps({"error": err}).encode()


@pytest.mark.parametrize(("status", "body", "retry_after", "kind", "etype"), [
    (200, ok_body(), None, Kind.OK, "ok"),
    (200, ok_body("partial", "length"), None, Kind.OK, "ok"),  # truncated but has content
    (200, ok_body("", "length"), None, Kind.RETRY, "empty_content"),
    (200, ok_body(None), None, Kind.RETRY, "empty_content"),
    (200, ok_body("  \n"), None, Kind.RETRY, "empty_content"),
    (200, ok_body("x", "error"), None, Kind.RETRY, "provider_error"),
    (200, ok_body(None, error={"code": 502, "message": "up"}), None, Kind.RETRY,
     "provider_error"),
    (200, b'{"choices": [', None, Kind.RETRY, "malformed_json"),
    (200, b'{"id": 1}', None, Kind.RETRY, "malformed_json"),
    # OpenRouter's integer error.code inside a 200 decides, not the status.
    (200, err_body(429), 2.0, Kind.RETRY, "rate_limited"),
    (200, err_body(401), None, Kind.AUTH, "unauthorized"),
    (401, err_body(401), None, Kind.AUTH, "unauthorized"),
    (402, err_body(402), None, Kind.CREDIT, "payment_required"),
    (402, err_body(402), 1.0, Kind.RETRY, "inflight_limited"),
    (400, err_body(400), None, Kind.PERMANENT, "bad_request"),
    (403, err_body(403), None, Kind.PERMANENT, "forbidden"),
    (404, err_body(404, reason="constraint_filtered"), None, Kind.PERMANENT, "not_found"),
    (404, err_body(404, retryable=True), None, Kind.RETRY, "not_found"),
    (408, err_body(408), None, Kind.RETRY, "timeout"),
    (409, err_body(409), None, Kind.RETRY, "conflict"),  # retried, as the openai SDK does
    (413, err_body(413), None, Kind.PERMANENT, "payload_too_large"),
    (429, err_body(429), None, Kind.RETRY, "rate_limited"),
    (500, b"<html>oops</html>", None, Kind.RETRY, "server_error"),
    (502, err_body(502), None, Kind.RETRY, "bad_gateway"),
    (503, err_body(503), None, Kind.RETRY, "unavailable"),
    (504, err_body(504), None, Kind.RETRY, "gateway_timeout"),
    (524, err_body(524), None, Kind.RETRY, "edge_timeout"),
    (529, err_body(529), None, Kind.RETRY, "overloaded"),
    # Shapes of other servers (issue 13).
    (429, json.dumps({"error": {"message": "quota", "type": "insufficient_quota",
                                "code": "insufficient_quota"}}).encode(), None, Kind.CREDIT,
     "insufficient_quota"),
    (400, json.dumps({"error": {"message": "Invalid model name", "code": "400"}}).encode(),
     None, Kind.PERMANENT, "bad_request"),  # LiteLLM's string codes
    (200, b"data: {\"choices\": []}\n\ndata: [DONE]\n\n", None, Kind.PERMANENT,
     "streaming_only"),
])
def test_error_taxonomy(status, body, retry_after, kind, etype):
    outcome = classify_body(status, body, retry_after)
    assert (outcome.kind, outcome.type) == (kind, etype)
    # Throttled: the server asks for less load. Server failure: it may be down as a whole.
    assert outcome.throttled == (etype in ("rate_limited", "inflight_limited"))
    assert outcome.server_failure == (kind is Kind.RETRY and status >= 500
                                      and etype != "provider_error")
    if retry_after is not None and kind is Kind.RETRY:
        assert outcome.retry_after == retry_after


def test_shapes_of_other_servers():
    # "error": null beside a valid choice is no error (it was a permanent failure "None").
    body = json.loads(ok_body("hi"))
    body["error"] = None
    assert classify_body(200, json.dumps(body).encode(), None).kind is Kind.OK
    # content as a list of text parts is joined.
    parts = ok_body([{"type": "text", "text": "ab"}, {"type": "image_url", "image_url": {}},
                     {"type": "text", "text": "cd"}])
    o = classify_body(200, parts, None)
    assert o.kind is Kind.OK and o.result["response"] == "abcd"
    # FastAPI's {"detail": ...} keeps its message.
    d = classify_body(422, json.dumps({"detail": [{"msg": "field required"}]}).encode(), None)
    assert (d.kind, d.message) == (Kind.PERMANENT, "field required")
    d = classify_body(404, b'{"detail": "Not Found"}', None)
    assert d.message == "Not Found"
    # An SSE body recognised from the content type too.
    sse = classify_body(200, b"event: x", None, "text/event-stream; charset=utf-8")
    assert sse.type == "streaming_only"


def test_retry_after_forms_and_cap():
    assert parse_retry_after("86400") == MAX_RETRY_AFTER_S == 300.0  # issue 13 case 7
    assert parse_retry_after(None, "1500") == 1.5  # retry-after-ms wins
    assert parse_retry_after("9", "250") == 0.25
    assert parse_retry_after("2", "nan") == 2.0
    assert parse_retry_after("inf") is None
    import email.utils
    soon = parse_retry_after(email.utils.formatdate(time.time() + 30, usegmt=True))
    assert soon is not None and 25 < soon <= 30
    far = parse_retry_after(email.utils.formatdate(time.time() + 86400 * 3, usegmt=True))
    assert far == 300.0


def test_ok_outcome_carries_the_record_fields():
    o = classify_body(200, json.dumps({"choices": [{"finish_reason": "stop", "message": {
        "content": "a", "reasoning": "r"}}], "usage": {"cost": 0.25, "prompt_tokens": 3},
        "provider": "P", "model": "m"}).encode(), None)
    assert o.cost == 0.25
    assert o.result == {"usage": {"cost": 0.25, "prompt_tokens": 3}, "finish_reason": "stop",
                        "provider": "P", "model": "m", "response": "a", "reasoning": "r"}


def test_backoff():
    assert all(0 <= backoff_delay(3, 1.0) <= 4.0 for _ in range(100))
    assert all(backoff_delay(1, 1.0, retry_after=7) >= 7 for _ in range(20))
    assert max(backoff_delay(30, 1.0) for _ in range(200)) <= 60


OK = Outcome(Kind.OK)


def throttle(retry_after: float | None = 1.0) -> Outcome:
    return Outcome(Kind.RETRY, 429, "rate_limited", retry_after=retry_after, throttled=True)


def fail() -> Outcome:
    return Outcome(Kind.RETRY, 503, "unavailable", server_failure=True)


def test_slow_start_doubles_per_round_trip_up_to_the_concurrency():
    """Each success adds two slots while prompts wait for one: the window triples every
    round trip (32, 96, 288, ...) and stops at --concurrency."""
    async def scenario() -> None:
        lim = Limiter(300)
        answers = 0

        async def worker() -> None:
            nonlocal answers
            for _ in range(3):
                await lim.acquire()
                await asyncio.sleep(0.001)
                lim.answered(OK)
                answers += 1
                if answers <= (300 - 32) // 2:
                    assert lim.allowed == 32 + 2 * answers  # +2 per success
                lim.release()

        assert lim.allowed == 32
        await asyncio.gather(*(worker() for _ in range(400)))
        assert lim.allowed == 300
    asyncio.run(scenario())


def test_throttled_prompts_hold_their_slot_unless_the_wait_is_long():
    """Capacity and sporadic throttling, over time, are checked on the model
    (test_limiter_model.py); here the per-answer decisions."""
    async def scenario() -> None:
        lim = Limiter(100)
        for _ in range(10):
            await lim.acquire()
        assert lim.answered(throttle(1.0)) == HOLD and lim.in_flight == 10  # slot kept
        assert lim.answered(throttle(60.0)) == RELEASE and lim.in_flight == 9  # too long
        assert lim.answered(throttle(None)) == HOLD
        assert lim.answered(throttle(1.0), repeat=True) == HOLD  # no evidence yet: undecided
    asyncio.run(scenario())


def test_throttle_wait_honours_retry_after_else_grows_with_the_share():
    lim = Limiter(10)
    assert lim.throttle_wait(7.5, 1) == 7.5
    assert all(0.025 <= lim.throttle_wait(None, 1) <= 0.05 for _ in range(50))
    assert all(lim.throttle_wait(None, 9) <= 0.11 for _ in range(50))  # a few % throttled
    lim.share_slow = 0.99  # nearly everything is throttled: wait much longer
    assert max(lim.throttle_wait(None, 12) for _ in range(50)) > 5


def test_breaker_opens_on_a_run_of_server_failures_and_only_a_probe_closes_it():
    b = Breaker(open_after=4, probe_first_s=0.0)
    assert [b.record(True) for _ in range(3)] == [None] * 3
    assert b.record(False) is None and b.streak == 0  # anything else breaks the run
    events = [b.record(True) for _ in range(4)]
    assert events[-1] == "opened" and b.is_open and b.generation == 1
    assert b.record(False) is None and b.is_open  # a straggler's success proves nothing
    now = time.monotonic()
    assert b.take_probe(now) and not b.take_probe(now)  # one probe at a time
    assert b.record(True, probe=True) is None and b.is_open  # still down
    assert b.next_probe_at > now
    assert b.take_probe(b.next_probe_at)
    assert b.record(False, probe=True) == "closed" and not b.is_open
    # A failure before an outage was declared is free if one was declared before its retry.
    assert b.free_failure(0, was_open=False) and not b.free_failure(1, was_open=False)


def test_limiter_outage_gate_lets_one_probe_through_then_restarts_small():
    async def scenario() -> None:
        lim = Limiter(1000, breaker=Breaker(open_after=4, probe_first_s=0.05, probe_max_s=0.05))
        lim.window = lim.ssthresh = 600.0  # a window found before the outage
        for _ in range(4):
            await lim.acquire()
            lim.answered(fail())
            lim.release()
        assert lim.breaker.is_open
        waiters = [asyncio.create_task(lim.acquire()) for _ in range(50)]
        await asyncio.sleep(0.02)
        assert not any(w.done() for w in waiters)  # nobody dispatches during the outage
        await asyncio.sleep(0.1)
        probes = [w for w in waiters if w.done()]
        assert len(probes) == 1 and probes[0].result() is True  # one probe, marked as such
        lim.answered(OK, probe=True)
        lim.release()
        assert not lim.breaker.is_open and 32 <= lim.allowed <= 34  # restart small...
        assert lim.ssthresh == 600  # ...growing back to where it was
        await asyncio.sleep(0)
        assert sum(w.done() for w in waiters) == 1 + lim.allowed  # the probe + the window
        lim.stop()
        await asyncio.gather(*waiters)
    asyncio.run(scenario())


def test_budget_expectation_from_costs_seen():
    async def scenario() -> None:
        b = Budget(1.0, first_expectation=0.05)
        for _ in range(20):  # 20 x $0.05 expected fill $1
            await b.admit()
        blocked = asyncio.create_task(b.admit())
        await asyncio.sleep(0)
        assert not blocked.done()
        b.settle(0.01)  # answers cost $0.01: the expectation drops, more fit
        await asyncio.wait_for(blocked, 1)
        assert b.expectation == pytest.approx((0.05 + 0.01) / 2)
        for _ in range(20):
            b.settle(0.01)
        assert b.spent == pytest.approx(0.21) and b.in_flight == 0
        b.settle_unknown = None
        await b.admit()
        b.settle(None, unknown=True)  # a timeout: may have been billed, counted as expected
        assert b.spent == pytest.approx(0.21 + b.expectation)
    asyncio.run(scenario())

    async def reached() -> None:
        b = Budget(0.02, already_spent=0.015, first_expectation=0.01)
        with pytest.raises(BudgetReached, match=r"budget \$0.02 reached"):
            await b.admit()
        nobudget = Budget(None)
        await nobudget.admit()
    asyncio.run(reached())
    assert Prices(1e-6, 2e-6, 0.01).expected(100, 1000) == pytest.approx(0.0121)
    assert Prices(1e-6, 2e-6, 0.01).of({"prompt_tokens": 10, "completion_tokens": 5}) == \
        pytest.approx(0.01002)
    assert Prices(1e-6, 2e-6).of({"cost": 1}) is None
    assert parse_prices("0.6,2.5") == Prices(0.6e-6, 2.5e-6, 0.0)
    with pytest.raises(ValueError, match="PROMPT,COMPLETION"):
        parse_prices("1")


def held(n: int, message: str = "Invalid model", sent: int = 0) -> Held:
    return Held(prompt=n, outcome=Outcome(Kind.PERMANENT, 400, "bad_request", message),
                attempts=1, sent=sent)


def test_systematic_error_first_answers_and_runs():
    written: list[Held] = []
    det = SystematicError(written.append, first_answers=8, run_of_answers=64)
    assert not any(det.permanent(held(i)) for i in range(7))
    assert det.permanent(held(7)) and not written  # the first 8 answers: all the same
    assert "the first 8 answers were all the same error: 400 bad_request" in det.describe()

    written.clear()
    det = SystematicError(written.append, first_answers=8, run_of_answers=64)
    for i in range(5):
        det.permanent(held(i, sent=10 + i))
    det.success(sent=3)  # sent before the refusals began: proves nothing
    assert not written
    det.success(sent=20)  # a later request went through: those were per-prompt failures
    assert len(written) == 5
    assert not any(det.permanent(held(i, sent=30 + i)) for i in range(63))
    det.permanent(held(99, "another message", sent=99))  # a different error breaks the run
    assert len(written) == 5 + 63
    assert not det.at_end() and len(written) == 5 + 63 + 1

    # Every answer of a small run the same error: systematic at the end too.
    det = SystematicError(written.append)
    det.permanent(held(1))
    det.permanent(held(2))
    assert det.at_end()


def test_max_failed_and_provider_rules():
    assert parse_max_failed("2%") == MaxFailed(fraction=0.02)
    assert parse_max_failed("50").allowed(10) == 50
    assert parse_max_failed("1%").allowed(20000) == 200
    assert parse_max_failed("1%").allowed(30) == 0
    with pytest.raises(ValueError):
        parse_max_failed("-1")
    routing = {"only": ["x"]}
    assert provider_for("https://openrouter.ai/api/v1", routing, explicit=False) == routing
    assert provider_for("https://eu.openrouter.ai/api/v1", routing, explicit=False) == routing
    assert provider_for("https://api.openai.com/v1", routing, explicit=False) is None
    assert provider_for("http://127.0.0.1:9/v1", routing, explicit=True) == routing
    assert provider_for("https://openrouter.ai/api/v1", None, explicit=True) is None


def test_endpoint_filter():
    ep = {"provider_name": "Fireworks", "tag": "fireworks/int4", "quantization": "int4"}
    assert endpoint_allowed(ep, {"quantizations": ["int4"]})
    assert not endpoint_allowed(ep, {"quantizations": ["fp8"]})
    assert not endpoint_allowed(ep, {"ignore": ["fireworks"]})
    assert not endpoint_allowed(ep, {"only": ["deepinfra"]})
    assert endpoint_allowed(ep, {"order": ["deepinfra"]})  # order alone still falls back
    assert not endpoint_allowed(ep, {"order": ["deepinfra"], "allow_fallbacks": False})
    assert endpoint_allowed(ep, None)


def write_records(path: Path, ids: list, *, cost: float = 0.01) -> None:
    with path.open("wb") as fh:
        for i in ids:
            fh.write(encode_record({"id": i, "usage": {"prompt_tokens": 2,
                                                       "completion_tokens": 3, "cost": cost},
                                    "response": "x" * 50, "messages": []}))


def test_resume_index_fast_path_fallback_and_torn_tail(tmp_path):
    out, err = tmp_path / "o.jsonl", tmp_path / "o.errors.jsonl"
    write_records(out, [1, "a", 'q"uo\\te', "ünï"])
    with out.open("ab") as fh:
        # Written by something else: id not first. The full-parse fallback still finds it.
        fh.write(json.dumps({"response": "y", "id": 77, "usage": {"cost": 1.0}}).encode()
                 + b"\n")
        fh.write(b'{"id": 5, "usage": {"cost": 0.01}, "resp')  # torn by kill -9
    err.write_bytes(encode_record({"id": 9, "error": {"status": 400}, "attempts": 1}))
    index = load_index(out, err)
    assert index.truncated_bytes > 0 and out.read_bytes().endswith(b"\n")
    keys = ("1", "a", 'q"uo\\te', "ünï", "77")
    assert len(index.done) == 5 and all(id_hash(k) in index.done for k in keys)
    assert len(index.failed) == 1 and id_hash("9") in index.failed
    assert index.cost == pytest.approx(1.04)
    assert (index.prompt_tokens, index.completion_tokens) == (8, 12)


def test_truncate_keeps_complete_files(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"a\nb\n")
    assert truncate_torn_tail(p) == 0
    p.write_bytes(b"no newline at all")
    assert truncate_torn_tail(p) == 17 and p.read_bytes() == b""


def test_drop_failures_rewrites_atomically(tmp_path):
    err = tmp_path / "o.errors.jsonl"
    err.write_bytes(b"".join(encode_record({"id": i, "error": {}, "attempts": 1})
                             for i in range(10)))
    assert drop_failures(err, lambda key: int(key) % 2 == 0) == 5
    assert [json.loads(x)["id"] for x in err.read_text().splitlines()] == [1, 3, 5, 7, 9]
    assert not list(tmp_path.glob("*.tmp"))


def test_idset_is_exact_across_merges():
    from payload.generate.journal import IdSet
    ids = IdSet()
    ids.MERGE_AT = 100  # type: ignore[misc]
    for i in range(1050):
        ids.add(id_hash(str(i)))
    assert len(ids) == 1050
    assert all(id_hash(str(i)) in ids for i in range(1050))
    assert not any(id_hash(str(i)) in ids for i in range(1050, 3000))
