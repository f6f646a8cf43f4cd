"""Unit tests of the generator's parts: error taxonomy, AIMD limiter, budget, resume index."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from payload.generate.budget import Budget, BudgetReached, Prices
from payload.generate.client import Kind, classify_body, parse_retry_after
from payload.generate.journal import (
    drop_failures,
    encode_record,
    id_hash,
    load_index,
    truncate_torn_tail,
)
from payload.generate.limiter import Limiter, backoff_delay
from payload.generate.preflight import endpoint_allowed

pytestmark = pytest.mark.timeout(30)


def ok_body(content: str | None = "hi", finish: str = "stop", **extra) -> bytes:
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
    (413, err_body(413), None, Kind.PERMANENT, "payload_too_large"),
    (500, b"<html>oops</html>", None, Kind.RETRY, "server_error"),
    (502, err_body(502), None, Kind.RETRY, "bad_gateway"),
    (503, err_body(503), None, Kind.RETRY, "unavailable"),
    (504, err_body(504), None, Kind.RETRY, "gateway_timeout"),
    (524, err_body(524), None, Kind.RETRY, "edge_timeout"),
    (529, err_body(529), None, Kind.RETRY, "overloaded"),
])
def test_error_taxonomy(status, body, retry_after, kind, etype):
    outcome = classify_body(status, body, retry_after)
    assert (outcome.kind, outcome.type) == (kind, etype)
    if kind is Kind.RETRY and status in (429, 503, 529):
        assert outcome.throttled
    if retry_after is not None and kind is Kind.RETRY:
        assert outcome.retry_after == retry_after


def test_ok_outcome_carries_the_record_fields():
    o = classify_body(200, json.dumps({"choices": [{"finish_reason": "stop", "message": {
        "content": "a", "reasoning": "r"}}], "usage": {"cost": 0.25, "prompt_tokens": 3},
        "provider": "P", "model": "m"}).encode(), None)
    assert o.cost == 0.25
    assert o.result == {"usage": {"cost": 0.25, "prompt_tokens": 3}, "finish_reason": "stop",
                        "provider": "P", "model": "m", "response": "a", "reasoning": "r"}


def test_retry_after_and_backoff():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("garbage") is None
    assert 0 <= parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") < 1  # in the past
    assert all(0 <= backoff_delay(3, 1.0) <= 4.0 for _ in range(100))
    assert all(backoff_delay(1, 1.0, retry_after=7) >= 7 for _ in range(20))
    assert max(backoff_delay(30, 1.0) for _ in range(200)) <= 60


def test_limiter_aimd_window_drops_under_throttling_and_recovers():
    async def scenario() -> None:
        lim = Limiter(100, decrease_interval=0.0)
        for _ in range(5):
            await lim.acquire()
            lim.release(throttled=True, retry_after=0.0)
        assert lim.window < 100 * 0.7 ** 4
        low = lim.window
        for _ in range(400):
            await lim.acquire()
            lim.release(success=True)
        assert lim.window == 100 > low
    asyncio.run(scenario())


def test_limiter_caps_in_flight_and_shares_one_pause():
    async def scenario() -> None:
        lim = Limiter(10)
        peak = 0
        started: list[float] = []

        async def job(i: int) -> None:
            nonlocal peak
            await lim.acquire()
            started.append(time.monotonic())
            peak = max(peak, lim.in_flight)
            await asyncio.sleep(0.01)
            # The first completion is a 429 with Retry-After 0.3: everyone waits it out.
            lim.release(throttled=i == 0, retry_after=0.3 if i == 0 else None)

        t0 = time.monotonic()
        await asyncio.gather(*(job(i) for i in range(60)))
        assert peak <= 10
        late = [t - t0 for t in started[10:]]
        assert late and min(late) >= 0.3  # nobody started during the shared pause
    asyncio.run(scenario())


def test_budget_reserves_worst_case_and_waits_for_settlement():
    async def scenario() -> None:
        b = Budget(1.0)
        r1 = await b.reserve(0.4)
        r2 = await b.reserve(0.4)
        third = asyncio.create_task(b.reserve(0.4))
        await asyncio.sleep(0.01)
        assert not third.done()  # 0.4 + 0.4 + 0.4 could exceed $1
        b.settle(r1, 0.1)
        assert await asyncio.wait_for(third, 1) == 0.4
        b.settle(r2, 0.4)
        b.settle(0.4, 0.4)
        assert b.spent == pytest.approx(0.9)
        with pytest.raises(BudgetReached):
            await b.reserve(0.2)
        assert await Budget(None).reserve(99) == 0.0
    asyncio.run(scenario())
    assert Prices(1e-6, 2e-6, 0.01).worst_case(100, 1000) == pytest.approx(0.0121)


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
