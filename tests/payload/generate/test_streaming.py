"""One streamed attempt (payload/generate/streaming.py) against small aiohttp SSE servers on
loopback: the assembled answer classified exactly as its non-streaming body, and every way a
stream ends (done, error event, cut, reset, stall, comments only, cancelled)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from payload.generate import client, streaming
from payload.generate.client import Kind
from payload.generate.streaming import Timeouts, Watchdog

pytestmark = pytest.mark.timeout(60)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DEFAULTS = Timeouts()

ANSWER: dict[str, Any] = {
    "id": "gen-77", "object": "chat.completion", "created": 1, "model": "moonshotai/kimi-k2.5",
    "provider": "Moonshot AI",
    "choices": [{"index": 0, "finish_reason": "length", "native_finish_reason": "max_tokens",
                 "message": {"role": "assistant", "content": "Bonjour, ça va ? \u2603",
                             "reasoning": "think: 2+2\nis 4"},
                 "token_ids": [5, 6, 7, 8, 9, 10]}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 6, "total_tokens": 17, "cost": 0.00042,
              "completion_tokens_details": {"reasoning_tokens": 3}}}


def sse_of(answer: dict[str, Any], *, comments: int = 2, ending: str = "\n") -> bytes:
    """The answer as OpenRouter streams it: keep-alive comments, a role chunk, reasoning
    then content deltas (with their token ids), the finish, the usage chunk, [DONE]."""
    ch = answer["choices"][0]
    msg, ids = ch["message"], ch.get("token_ids")
    head = {k: answer[k] for k in ("id", "object", "created", "model", "provider")}
    head["object"] = "chat.completion.chunk"
    field = "reasoning" if "reasoning" in msg else "reasoning_content"
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{field: msg[field][:5]}, {field: msg[field][5:]}]
    deltas += [{"content": msg["content"][:4]}, {"content": msg["content"][4:]}]
    id_parts = [ids[0:2], ids[2:3], ids[3:5], ids[5:]] if ids is not None else []
    events = [": OPENROUTER PROCESSING"] * comments
    for i, d in enumerate(deltas):
        c: dict[str, Any] = {"index": 0, "delta": d, "finish_reason": None}
        if id_parts and i:
            c["token_ids"] = id_parts[i - 1]
        if i == len(deltas) - 1:
            c["finish_reason"], c["native_finish_reason"] = ch["finish_reason"], \
                ch["native_finish_reason"]
        events.append("data: " + json.dumps({**head, "choices": [c]}))
    events.append("data: " + json.dumps({**head, "choices": [], "usage": answer["usage"]}))
    events.append("data: [DONE]")
    return "".join(e + ending + ending for e in events).encode()


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        await runner.cleanup()


def streamed_by(raw: bytes, pieces: int = 1, gap: float = 0.0, *, eof: bool = True) -> Handler:
    """A handler writing `raw` as an event stream in `pieces` writes, `gap` s apart."""
    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Generation-Id": "gen-header"})
        await resp.prepare(request)
        step = max(1, -(-len(raw) // pieces))
        for i in range(0, len(raw), step):
            await resp.write(raw[i:i + step])
            if gap:
                await asyncio.sleep(gap)
        if eof:
            await resp.write_eof()
        return resp
    return handle


async def one(handler: Handler, t: Timeouts = DEFAULTS, *, tick: float = 0.02
              ) -> client.Outcome:
    async with serving(handler) as url, aiohttp.ClientSession() as session:
        return await streaming.attempt(session, url, b"{}", {}, Watchdog(t, tick))


def record_of(o: client.Outcome) -> str:
    return json.dumps([o.kind.value, o.type, o.status, o.result, o.cost, o.usage, o.cut],
                      sort_keys=False)


NON_STREAMED = client.classify_body(200, json.dumps(ANSWER).encode(), None, "application/json")


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
@pytest.mark.parametrize("pieces", [1, 3, 97, 10_000])
def test_the_streamed_answer_is_the_non_streamed_one(ending, pieces):
    """Byte for byte, however the stream is cut into writes and whatever its line ends."""
    assert NON_STREAMED.kind is Kind.OK and NON_STREAMED.result["response_token_ids"]
    got = asyncio.run(one(streamed_by(sse_of(ANSWER, ending=ending), pieces)))
    assert record_of(got) == record_of(NON_STREAMED)


def test_vllm_reasoning_content_and_no_usage_cost():
    """vLLM's older reasoning field, no provider, no cost: still the non-streaming record."""
    answer = json.loads(json.dumps(ANSWER))
    msg = answer["choices"][0]["message"]
    msg["reasoning_content"] = msg.pop("reasoning")
    answer["provider"] = None
    del answer["usage"]["cost"]
    raw = sse_of(answer)
    want = client.classify_body(200, json.dumps(answer).encode(), None)
    got = asyncio.run(one(streamed_by(raw, 5)))
    assert got.result["reasoning"] == "think: 2+2\nis 4"
    assert record_of(got) == record_of(want)


def test_a_json_answer_to_a_stream_request_is_read_as_such():
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(ANSWER)
    assert record_of(asyncio.run(one(handle))) == record_of(NON_STREAMED)


def test_an_error_status_is_classified_as_without_streaming():
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"code": 429, "message": "slow down"}}, status=429,
                                 headers={"Retry-After": "3"})
    got = asyncio.run(one(handle))
    assert (got.kind, got.type, got.throttled, got.retry_after) == (
        Kind.RETRY, "rate_limited", True, 3.0)


def test_a_mid_stream_error_event_is_retried_by_its_code():
    raw = sse_of(ANSWER).split(b"\n\n")
    err = {"id": "gen-77", "object": "chat.completion.chunk",
           "error": {"code": 502, "message": "Provider returned error"},
           "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]}
    stream = b"\n\n".join(raw[:4]) + b"\n\ndata: " + json.dumps(err).encode() + b"\n\n"
    got = asyncio.run(one(streamed_by(stream, 2)))
    assert (got.kind, got.status, got.type, got.server_failure) == (
        Kind.RETRY, 502, "bad_gateway", True)
    assert not got.result


@pytest.mark.parametrize("upto", [1, 3, 5, 6])
def test_a_stream_cut_before_its_end_is_a_retried_failure_never_a_partial_answer(upto):
    """Cut after the comments, the role chunk, some deltas, every delta but the finish."""
    raw = b"\n\n".join(sse_of(ANSWER).split(b"\n\n")[:upto]) + b"\n\n"
    got = asyncio.run(one(streamed_by(raw, 3)))  # a clean end of the body, no [DONE]
    assert (got.kind, got.type, got.server_failure, got.result) == (
        Kind.RETRY, "stream_cut", True, {})


def test_a_reset_mid_stream_is_a_cut():
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse_of(ANSWER)[:300])
        assert request.transport is not None
        request.transport.abort()
        return resp
    got = asyncio.run(one(handle))
    assert (got.kind, got.type, got.server_failure) == (Kind.RETRY, "stream_cut", True)


def test_a_finish_then_eof_without_done_is_whole():
    raw = sse_of(ANSWER).replace(b"data: [DONE]\n\n", b"")
    assert record_of(asyncio.run(one(streamed_by(raw, 4)))) == record_of(NON_STREAMED)


def test_an_answer_longer_than_every_timeout_but_the_cap_is_recorded_whole():
    """Scaled time: 60 writes 0.05 s apart (3 s) under an idle timeout of 0.5 s and a first
    token timeout of 1 s: the old wall would have cut it; the stream shows it is alive."""
    t0 = time.monotonic()
    got = asyncio.run(one(streamed_by(sse_of(ANSWER, comments=0), 60, 0.05),
                          Timeouts(idle=0.5, first_token=1.0, total=30.0)))
    assert time.monotonic() - t0 > 2.5
    assert record_of(got) == record_of(NON_STREAMED)


def stalling(after: int, *, comments_every: float | None = None) -> Handler:
    """Writes the first `after` bytes, then nothing (or only comments) for a minute."""
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(sse_of(ANSWER, comments=0)[:after])
        for _ in range(600):
            await asyncio.sleep(comments_every or 0.1)
            if request.transport is None or request.transport.is_closing():
                break  # the client gave up
            if comments_every:
                await resp.write(b": OPENROUTER PROCESSING\n\n")
        return resp
    return handle


def test_a_stall_past_the_idle_timeout_is_its_own_retried_kind():
    t0 = time.monotonic()
    got = asyncio.run(one(stalling(400), Timeouts(idle=0.3, first_token=5.0, total=30.0)))
    assert (got.kind, got.type, got.server_failure) == (Kind.RETRY, "idle_timeout", True)
    assert "--idle-timeout" in got.message and time.monotonic() - t0 < 2.0


def test_comments_keep_a_stream_alive_only_until_the_first_token_timeout():
    """Comments every 0.05 s, well inside the idle timeout, but no data event: given up at
    the first-token timeout."""
    t0 = time.monotonic()
    got = asyncio.run(one(stalling(0, comments_every=0.05),
                          Timeouts(idle=0.2, first_token=0.6, total=30.0)))
    assert (got.kind, got.type, got.server_failure) == (
        Kind.RETRY, "first_token_timeout", True)
    assert 0.55 < time.monotonic() - t0 < 2.0


def test_no_headers_within_the_first_token_timeout():
    async def handle(request: web.Request) -> web.StreamResponse:
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.05)  # until the client gives up
        return web.Response()
    got = asyncio.run(one(handle, Timeouts(idle=0.2, first_token=0.3, total=30.0)))
    assert (got.kind, got.type) == (Kind.RETRY, "first_token_timeout")


def test_the_request_timeout_caps_a_stream_that_never_stops():
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
        for _ in range(3000):
            await resp.write(chunk)
            await asyncio.sleep(0.01)
        return resp
    got = asyncio.run(one(handle, Timeouts(idle=0.3, first_token=0.3, total=0.8)))
    assert (got.kind, got.type, got.status) == (Kind.RETRY, "timeout", None)
    assert "--request-timeout" in got.message


def test_cancelling_the_attempt_closes_the_connection_at_once():
    """A stop cancels the task: CancelledError comes out, and the server sees the
    connection go within a moment (not after the answer: it is closed, not drained)."""
    gone = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for _ in range(1000):
                await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n')
                await asyncio.sleep(0.01)
        except (ConnectionError, asyncio.CancelledError):
            gone.set()
            raise
        return resp

    async def main() -> float:
        async with serving(handle) as url, aiohttp.ClientSession() as session:
            task = asyncio.create_task(streaming.attempt(session, url, b"{}", {}, Watchdog(
                Timeouts(), 0.05)))
            await asyncio.sleep(0.3)
            task.cancel()
            t0 = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(gone.wait(), 2.0)
            return time.monotonic() - t0

    assert asyncio.run(main()) < 1.0


def test_the_watchdog_task_ends_with_the_last_stream():
    async def main() -> None:
        dog = Watchdog(Timeouts(), 0.01)
        async with serving(streamed_by(sse_of(ANSWER), 3)) as url, \
                aiohttp.ClientSession() as session:
            outcomes = await asyncio.gather(*(streaming.attempt(session, url, b"{}", {}, dog)
                                              for _ in range(20)))
            assert all(o.kind is Kind.OK for o in outcomes)
            await asyncio.sleep(0.05)
            assert dog._task is None and not dog._open
    asyncio.run(main())


def test_null_usage_members_are_left_out_streamed_or_not():
    """vLLM's plain usage has `"prompt_tokens_details": null`; its stream's usage chunk
    leaves nulls out (`exclude_none`): both record the same usage."""
    plain = json.loads(json.dumps(ANSWER))
    plain["usage"].update(prompt_tokens_details=None, completion_tokens_details={
        "reasoning_tokens": 3, "audio_tokens": None})
    streamed = json.loads(json.dumps(ANSWER))
    want = client.classify_body(200, json.dumps(plain).encode(), None)
    assert "prompt_tokens_details" not in want.result["usage"]
    assert want.result["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
    got = asyncio.run(one(streamed_by(sse_of(streamed), 2)))
    assert record_of(got) == record_of(want)


@pytest.mark.parametrize(("odd", "kept"), [([True], False), (["7"], False), ([-1], False),
                                           ([2**70], True), ([2**63 - 1], True)])
def test_odd_ids_are_judged_as_when_plain(odd, kept):
    """A chunk's `token_ids` with a bool, a string, a negative, a number past 64 bits: the
    streamed record keeps or drops the ids exactly as client.sampled_ids does for the same
    list in a plain answer."""
    answer = json.loads(json.dumps(ANSWER))
    answer["choices"][0]["token_ids"] = [5, 6, 7, *odd, 9, 10]
    want = client.classify_body(200, json.dumps(answer).encode(), None)
    assert ("response_token_ids" in want.result) is kept
    got = asyncio.run(one(streamed_by(sse_of(answer), 3)))
    assert record_of(got) == record_of(want)


def test_a_long_answer_of_many_deltas_is_joined_whole():
    """10,000 content deltas (the text kept 64 deltas to a string while it streams)."""
    answer = json.loads(json.dumps(ANSWER))
    words = [f"w{i} " for i in range(10_000)]
    answer["choices"][0]["message"]["content"] = "".join(words)
    del answer["choices"][0]["token_ids"]
    head = {"id": "gen-77", "model": answer["model"], "provider": answer["provider"]}
    events = [{**head, "choices": [{"index": 0, "delta": {"reasoning": "think: 2+2\nis 4"}}]}]
    events += [{**head, "choices": [{"index": 0, "delta": {"content": w}}]} for w in words]
    events.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length",
                                        "native_finish_reason": "max_tokens"}]})
    events.append({**head, "choices": [], "usage": answer["usage"]})
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    got = asyncio.run(one(streamed_by(raw + b"data: [DONE]\n\n", 50)))
    want = client.classify_body(200, json.dumps(answer).encode(), None)
    assert record_of(got) == record_of(want)
