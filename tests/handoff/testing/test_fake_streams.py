"""The fake OpenRouter's streaming on its own, read by a raw aiohttp client on loopback: the
stream rebuilt equals the non-streaming answer to the same request; comments while queued;
a mid-stream error event; a cut stream; a stall; the bill stops growing once the client
closes; scaled time; thinking-size answers."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from handoff.testing.fakeapi import FakeOpenRouter, StreamPlan
from handoff.testing.fakeapi.streams import chunked, token_plan

KEY = "sk-or-v1-fake-stream-test-key"


@dataclass
class Read:
    """What a stream sent: comments and data events with their arrival (monotonic) times,
    whether `[DONE]` came, and how the body ended."""

    status: int
    headers: dict[str, str]
    comments: list[tuple[float, str]] = field(default_factory=list)
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    done: bool = False
    after_done: bytes = b""
    failure: str | None = None  # the client error that ended the body, if any


async def read_stream(resp: aiohttp.ClientResponse, *, stop_after: int | None = None,
                      idle_s: float | None = None) -> Read:
    """Parse SSE by hand (comments, `data:` lines, blank-line event ends). `stop_after` events:
    close the connection then; `idle_s`: close after that long without a byte."""
    out = Read(resp.status, dict(resp.headers))
    buf, data = b"", []
    try:
        while True:
            read = resp.content.readany()
            chunk = await (asyncio.wait_for(read, idle_s) if idle_s else read)
            if not chunk:
                break
            buf += chunk
            now = time.monotonic()
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode().rstrip("\r")
                if out.done:
                    out.after_done += line + b"\n"
                elif text.startswith(":"):
                    out.comments.append((now, text))
                elif text.startswith("data:"):
                    data.append(text[5:].lstrip(" "))
                elif text == "" and data:
                    joined = "\n".join(data)
                    data = []
                    if joined == "[DONE]":
                        out.done = True
                    else:
                        out.events.append((now, json.loads(joined)))
                        if stop_after is not None and len(out.events) >= stop_after:
                            resp.close()
                            return out
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        out.failure = type(exc).__name__
    except asyncio.TimeoutError:
        out.failure = "idle"
        resp.close()
    return out


def rebuild(read: Read) -> dict[str, Any]:
    """The chat.completion a client would assemble from the stream's events."""
    reasoning: list[str] = []
    content: list[str] = []
    ids: list[int] = []
    result: dict[str, Any] = {}
    finish: dict[str, Any] = {}
    for _, ev in read.events:
        for k in ("id", "model", "provider"):
            if k in ev:
                result[k] = ev[k]
        if "prompt_token_ids" in ev:
            result["prompt_token_ids"] = ev["prompt_token_ids"]
        if "usage" in ev:
            result["usage"] = ev["usage"]
        for ch in ev["choices"]:
            delta = ch.get("delta", {})
            reasoning.append(delta.get("reasoning") or "")
            content.append(delta.get("content") or "")
            ids.extend(ch.get("token_ids") or [])
            if ch.get("finish_reason") is not None:
                finish = {"finish_reason": ch["finish_reason"],
                          "native_finish_reason": ch.get("native_finish_reason")}
    result["message"] = {"content": "".join(content), "reasoning": "".join(reasoning) or None}
    result.update(finish)
    if ids:
        result["token_ids"] = ids
    return result


def flatten(answer: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming answer in rebuild()'s shape."""
    choice = answer["choices"][0]
    content = choice["message"]["content"]
    if isinstance(content, list):
        content = "".join(p["text"] for p in content)
    out: dict[str, Any] = {k: answer[k] for k in ("id", "model", "provider", "usage") if k in answer}
    out["message"] = {"content": content or "", "reasoning": choice["message"]["reasoning"]}
    out["finish_reason"] = choice["finish_reason"]
    out["native_finish_reason"] = choice["native_finish_reason"]
    if "token_ids" in choice:
        out["token_ids"] = choice["token_ids"]
    if "prompt_token_ids" in answer:
        out["prompt_token_ids"] = answer["prompt_token_ids"]
    return out


def body(prompt: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "moonshotai/kimi-k2.5", "messages": [{"role": "user", "content": prompt}],
            **extra}


def serve(fake: FakeOpenRouter,
          work: Callable[[aiohttp.ClientSession, str], Awaitable[Any]]) -> Any:
    """Run the fake and `work(session, chat_url)` in one event loop."""
    async def main() -> Any:
        await fake.start()
        try:
            headers = {"Authorization": f"Bearer {KEY}"}
            async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(
                    limit=0)) as session:
                return await work(session, fake.base_url + "/chat/completions")
        finally:
            await fake.stop()
    return asyncio.run(main())


async def stream(session: aiohttp.ClientSession, url: str, request: dict[str, Any],
                 **kw: Any) -> Read:
    async with session.post(url, json={**request, "stream": True}) as resp:
        return await read_stream(resp, **kw)


FAST = StreamPlan(tokens_per_s=5000.0, rate_sigma=0.5, seed=3)


@pytest.mark.parametrize("settings", [
    {},
    {"thinking": "field", "reasoning_tokens": 300, "token_ids": True},
    {"thinking": "tags", "reasoning_tokens": 40},
    {"thinking": "field", "reasoning_tokens": 300, "providers": ["A", "B", "C"],
     "content_parts": True},
    {"token_ids": True, "generation_header": True, "body_id": False},
])
def test_the_stream_is_the_non_streaming_answer(settings: dict[str, Any]) -> None:
    """Same text, reasoning, usage (cost, reasoning tokens), provider, finish reasons, id and
    token ids, for a whole answer and for one cut by max_tokens; in OpenRouter's framing."""
    fake = FakeOpenRouter(api_key=KEY, stable_ids=True, stream=FAST, **settings)

    async def work(session: aiohttp.ClientSession, url: str) -> None:
        extras: list[dict[str, Any]] = [{}, {"return_token_ids": True}, {"max_tokens": 7},
                                        {"max_tokens": 290}]
        for i, extra in enumerate(extras):
            request = body(f"prompt {i}", **extra)
            async with session.post(url, json=request) as resp:
                whole = await resp.json()
                header = resp.headers.get("X-Generation-Id")
            read = await stream(session, url, request)
            assert read.status == 200 and read.failure is None and read.done
            assert read.headers["Content-Type"] == "text/event-stream"
            assert read.after_done == b"" and read.comments == []
            expected = flatten(whole)
            if not fake.body_id:  # the id only in the header (gen-h-<request no.>) either way
                assert "id" not in whole and "id" not in read.events[0][1]
                assert header and header.startswith("gen-h-")
                assert read.headers["X-Generation-Id"].startswith("gen-h-")
                rebuilt = rebuild(read)
            else:
                assert read.headers["X-Generation-Id"] == whole["id"]
                rebuilt = rebuild(read)
            assert rebuilt == expected
            events = [ev for _, ev in read.events]
            assert all(ev["object"] == "chat.completion.chunk" for ev in events)
            assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert events[-1]["choices"] == [] and "usage" in events[-1]
            finals = [ev for ev in events[:-1] if ev["choices"][0]["finish_reason"]]
            assert finals == [events[-2]]  # the finish reason on the last choice chunk only
            if "token_ids" in expected:  # 1-4 tokens a chunk, each with its own ids
                sizes = [len(ev["choices"][0]["token_ids"]) for ev in events[1:-1]]
                assert all(1 <= n <= 4 for n in sizes) and len(sizes) > 1
    serve(fake, work)
    assert fake.stats.streams_started == fake.stats.streams_completed == 4
    assert fake.stats.tokens_billed == sum(r.tokens_total for r in fake.stats.stream_log)


def test_usage_only_when_asked_for_a_vllm_shaped_server() -> None:
    fake = FakeOpenRouter(api_key=KEY, stream=StreamPlan(tokens_per_s=5000, usage_always=False))

    async def work(session: aiohttp.ClientSession, url: str) -> tuple[Read, Read]:
        return (await stream(session, url, body()),
                await stream(session, url, body(stream_options={"include_usage": True})))
    bare, asked = serve(fake, work)
    assert all("usage" not in ev for _, ev in bare.events) and bare.done
    assert "usage" in asked.events[-1][1] and asked.done


def test_comments_while_queued_then_tokens() -> None:
    """Queued for 0.5 s: a comment at once and every 0.1 s, then the first token."""
    plan = StreamPlan(queue_s=0.5, comment_every_s=0.1, tokens_per_s=2000)
    fake = FakeOpenRouter(api_key=KEY, stream=plan)

    async def work(session: aiohttp.ClientSession, url: str) -> tuple[float, Read]:
        t0 = time.monotonic()
        return t0, await stream(session, url, body())
    t0, read = serve(fake, work)
    assert read.done and [c for _, c in read.comments] == [": OPENROUTER PROCESSING"] * 5
    first_data = read.events[0][0]
    assert all(t < first_data for t, _ in read.comments)
    assert first_data - t0 >= 0.45
    assert read.comments[-1][0] - read.comments[0][0] >= 0.35  # spread out, not one burst


def test_a_mid_stream_error_event_after_some_chunks() -> None:
    """HTTP 200 already sent: the error arrives as a data event, `finish_reason: "error"`, no
    [DONE]; the next stream (not scheduled) is whole."""
    fake = FakeOpenRouter(api_key=KEY, thinking="field", reasoning_tokens=200,
                          stream=StreamPlan(tokens_per_s=5000, schedule={1: "error"}))

    async def work(session: aiohttp.ClientSession, url: str) -> tuple[Read, Read]:
        return await stream(session, url, body()), await stream(session, url, body())
    broken, whole = serve(fake, work)
    assert broken.status == 200 and not broken.done and broken.failure is None
    last = broken.events[-1][1]
    assert last["error"]["code"] == 502 and last["error"]["message"]
    assert last["choices"][0]["finish_reason"] == "error"
    assert len(broken.events) >= 3  # the role chunk, some tokens, the error
    assert whole.done and fake.stats.streams_errored == 1
    assert fake.stats.streams_completed == 1
    billed = fake.stats.stream_log[0].tokens_billed
    assert 0 < billed < fake.stats.stream_log[0].tokens_total


def test_a_cut_stream_ends_before_done() -> None:
    fake = FakeOpenRouter(api_key=KEY, thinking="field", reasoning_tokens=200,
                          stream=StreamPlan(tokens_per_s=5000, cut_share=1.0))

    async def work(session: aiohttp.ClientSession, url: str) -> Read:
        return await stream(session, url, body())
    read = serve(fake, work)
    assert read.status == 200 and not read.done and read.failure is not None
    assert read.events and all("error" not in ev for _, ev in read.events)
    assert fake.stats.streams_cut == 1 and fake.stats.stream_log[0].outcome == "cut"


def test_first_attempt_of_every_prompt_fails_then_streams_whole() -> None:
    fake = FakeOpenRouter(api_key=KEY, stream=StreamPlan(tokens_per_s=5000,
                                                         first_attempt="error"))

    async def work(session: aiohttp.ClientSession, url: str) -> list[bool]:
        return [(await stream(session, url, body(p))).done for p in ("a", "b", "a", "b")]
    assert serve(fake, work) == [False, False, True, True]


def test_a_stall_then_the_rest_and_a_stall_the_client_gives_up_on() -> None:
    """stall_s=0.6: no byte for 0.6 s mid-stream, then the answer whole. stall_s=None: the
    client closes after 0.4 s idle and the fake counts it cancelled by the client."""
    plan = StreamPlan(tokens_per_s=1000, stall_share=1.0, stall_s=0.6, seed=1)
    fake = FakeOpenRouter(api_key=KEY, thinking="field", reasoning_tokens=200, stream=plan)

    async def work(session: aiohttp.ClientSession, url: str) -> tuple[Read, Read]:
        first = await stream(session, url, body())
        plan.stall_s = None
        second = await stream(session, url, body(), idle_s=0.4)
        await asyncio.sleep(0.6)  # the fake notices the close within 0.25 s
        return first, second
    first, second = serve(fake, work)
    gaps = [b[0] - a[0] for a, b in zip(first.events, first.events[1:], strict=False)]
    assert first.done and max(gaps) >= 0.55
    assert rebuild(first)["message"]["reasoning"] == " ".join(f"r{i}" for i in range(200))
    assert second.failure == "idle" and not second.done
    log = fake.stats.stream_log
    assert fake.stats.streams_stalled == 2 and log[1].stalled
    assert log[1].outcome == "cancelled" and fake.stats.streams_cancelled_by_client == 1


def test_a_stall_with_comments_sends_only_comments_meanwhile() -> None:
    """stall_comments: the keep-alive goes on through the stall (0.1 s apart for 0.6 s), no
    token; a client that takes comments for progress would wait forever on stall_s=None."""
    plan = StreamPlan(tokens_per_s=2000, stall_share=1.0, stall_s=0.6, stall_comments=True,
                      comment_every_s=0.1, seed=1)
    fake = FakeOpenRouter(api_key=KEY, thinking="field", reasoning_tokens=200, stream=plan)

    async def work(session: aiohttp.ClientSession, url: str) -> Read:
        return await stream(session, url, body())
    read = serve(fake, work)
    times = [t for t, _ in read.events]
    gap = max(range(len(times) - 1), key=lambda i: times[i + 1] - times[i])
    inside = [t for t, _ in read.comments if times[gap] <= t <= times[gap + 1]]
    assert read.done and times[gap + 1] - times[gap] >= 0.55
    assert len(inside) == len(read.comments) == 6
    assert rebuild(read)["message"]["reasoning"] == " ".join(f"r{i}" for i in range(200))


def test_the_bill_stops_when_the_client_closes() -> None:
    """A 4000-token answer at 2000 tokens/s: the client closes after 40 events; the fake bills
    nothing after that moment (give or take the write in flight), also read over HTTP."""
    fake = FakeOpenRouter(api_key=KEY, thinking="field", reasoning_tokens=4000,
                          stream=StreamPlan(tokens_per_s=2000, seed=2))

    async def work(session: aiohttp.ClientSession, url: str) -> tuple[Read, int, int]:
        read = await stream(session, url, body(), stop_after=40)
        stopped = time.monotonic()
        billed_then = fake.stats.tokens_billed
        await asyncio.sleep(0.6)
        async with session.get(fake.base_url.rsplit("/api", 1)[0] + "/_fake/stats",
                               params={"billed_after": str(stopped)}) as r:
            over_http = (await r.json())["tokens_billed_after"]
        return read, billed_then, over_http
    read, billed_then, over_http = serve(fake, work)
    stats = fake.stats
    assert len(read.events) == 40 and not read.done
    assert stats.streams_cancelled_by_client == 1 and stats.streams_completed == 0
    assert stats.stream_log[0].outcome == "cancelled"
    # at most the one write already on its way when the client closed
    assert stats.tokens_billed - billed_then <= max(stats.bill_tokens)
    assert max(stats.bill_tokens) < 200  # (writes are batches of what fell due: 20 ms here)
    assert over_http == stats.tokens_billed - billed_then
    assert 40 <= stats.tokens_billed < 4000 // 4


@pytest.mark.serial
def test_scaled_time_an_answer_past_the_old_wall_in_about_a_second() -> None:
    """3000 tokens at 4 tokens/s is 750 fake seconds; at time_scale 750 it takes ~1 s, paced
    (not one burst), and the stream log's duration says so."""
    plan = StreamPlan(tokens_per_s=4.0, time_scale=750.0, queue_s=30, comment_every_s=10)
    fake = FakeOpenRouter(api_key=KEY, thinking="field", reasoning_tokens=3000,
                          completion_tokens=0, stream=plan)

    async def work(session: aiohttp.ClientSession, url: str) -> tuple[float, Read]:
        t0 = time.monotonic()
        read = await stream(session, url, body())
        return time.monotonic() - t0, read
    wall, read = serve(fake, work)
    assert read.done and len(read.comments) == 3  # at 0, 10 and 20 fake seconds
    fake_s = (3000 - 1) / 4.0 + 30
    assert fake_s > 600 and 0.9 * fake_s / 750 <= wall <= fake_s / 750 + 1.5
    times = [t for t, _ in read.events]
    assert times[len(times) // 2] - times[0] >= 0.3  # paced across the second


def test_thinking_size_answers() -> None:
    """reasoning_sigma: each prompt's length log-normal around the mean (the same every time it
    is asked); one of ~3,500 tokens streams as 1,000+ events."""
    fake = FakeOpenRouter(api_key=KEY, thinking="field", reasoning_tokens=3500,
                          reasoning_sigma=0.8, stream=StreamPlan(tokens_per_s=1e6))
    lengths = [fake._reasoning_length(body(f"p{i}")["messages"]) for i in range(3000)]
    assert 3150 <= statistics.mean(lengths) <= 3850
    assert min(lengths) < 1000 and max(lengths) > 15000
    assert lengths[:5] == [fake._reasoning_length(body(f"p{i}")["messages"]) for i in range(5)]
    prompt = next(f"p{i}" for i, n in enumerate(lengths) if 3300 <= n <= 3700)

    async def work(session: aiohttp.ClientSession, url: str) -> Read:
        return await stream(session, url, body(prompt))
    read = serve(fake, work)
    assert read.done and len(read.events) >= 1000
    usage = read.events[-1][1]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == lengths[int(prompt[1:])]


@pytest.mark.serial
def test_many_streams_at_once_are_each_whole() -> None:
    """300 concurrent streams, each paced over ~0.5 s: all complete, each its own answer."""
    plan = StreamPlan(tokens_per_s=600, rate_sigma=0.3, write_every_s=0.05, seed=4)
    fake = FakeOpenRouter(api_key=KEY, thinking="field", reasoning_tokens=300, stream=plan)

    async def work(session: aiohttp.ClientSession, url: str) -> list[Read]:
        return list(await asyncio.gather(*(stream(session, url, body(f"q{i}"))
                                           for i in range(300))))
    reads = serve(fake, work)
    assert all(r.done for r in reads) and fake.stats.streams_completed == 300
    assert fake.stats.peak_concurrency >= 250
    for i, r in enumerate(reads):
        assert rebuild(r)["message"]["content"].startswith("answer ")
        assert rebuild(r)["message"]["content"] == f"answer {flatten_digest(f'q{i}')}"


def flatten_digest(prompt: str) -> str:
    from handoff.testing.fakeapi import answer_digest
    return answer_digest(body(prompt)["messages"])


def test_chunked_and_the_token_plan() -> None:
    """Chunks concatenate to the text and carry n tokens in all; words when there are n."""
    rng = random.Random(5)
    for _ in range(300):
        text = "".join(rng.choice("ab  \n") for _ in range(rng.randint(0, 30)))
        n = rng.randint(0, 40)
        sizes = iter([rng.randint(1, 4) for _ in range(50)])
        got = list(chunked(text, n, sizes))
        assert "".join(p for p, _, _ in got) == text
        assert sum(c for _, c, _ in got) == n and all(c <= 4 for _, c, _ in got)
        assert [last for _, _, last in got] == [False] * (len(got) - 1) + [True] * bool(got)
    assert list(chunked("r0 r1 r2 r3", 4, iter([1, 2, 3]))) == [
        ("r0", 1, False), (" r1 r2", 2, False), (" r3", 1, True)]
    assert list(chunked("hi", 0, iter([1]))) == [("hi", 0, True)]
    answer = {"choices": [{"message": {"reasoning": "r0 r1", "content": "hi"}}],
              "usage": {"completion_tokens": 5,
                        "completion_tokens_details": {"reasoning_tokens": 2}}}
    assert token_plan(answer) == ("r0 r1", 2, "hi", 3)


def test_tokens_billed_after_a_moment() -> None:
    """The bill log answers "how many tokens after t" to within a millisecond's writes."""
    from handoff.testing.fakeapi import FakeStats
    stats = FakeStats()
    before = time.monotonic()
    stats.bill(3)
    stats.bill(4)
    time.sleep(0.01)
    middle = time.monotonic()
    time.sleep(0.01)
    stats.bill(5)
    assert stats.tokens_billed == 12 and len(stats.bill_times) <= 3
    assert stats.tokens_billed_after(before) == 12
    assert stats.tokens_billed_after(middle) == 5
    assert stats.tokens_billed_after(time.monotonic()) == 0
    assert "bill_times" not in stats.as_dict() and stats.as_dict()["tokens_billed"] == 12


def test_fault_answers_stream_as_they_answer() -> None:
    """A choice error, an empty answer and one cut empty by length, asked streamed: the same
    answers as SSE (the choice's error at the chunk's top level, as OpenRouter sends it)."""
    from handoff.testing.fakeapi import FaultPlan
    fake = FakeOpenRouter(api_key=KEY, stream=FAST, faults=FaultPlan(schedule={
        1: "choice_error", 2: "empty", 3: "length_empty"}))

    async def work(session: aiohttp.ClientSession, url: str) -> list[Read]:
        return [await stream(session, url, body(str(i))) for i in range(3)]
    error, empty, cut = serve(fake, work)
    last = error.events[-2][1]
    assert last["error"]["code"] == 502 and last["choices"][0]["finish_reason"] == "error"
    assert rebuild(empty)["message"] == {"content": "", "reasoning": None}
    assert rebuild(empty)["finish_reason"] == "stop" and rebuild(cut)["finish_reason"] == "length"
    assert all(r.done for r in (error, empty, cut))
