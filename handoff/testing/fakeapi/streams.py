"""The fake OpenRouter's streaming: an answer asked with `"stream": true` sent as SSE.

The stream is a *rendering* of the very answer the non-streaming path builds (server.py makes
the same `chat.completion` dict either way), so a client can prove its streamed and
non-streamed records equal: same text, reasoning, usage, cost, provider, finish reasons,
id (with `stable_ids`) and token ids. `StreamPlan` says how it is paced and broken; `Streamer`
sends it and counts, in `FakeStats`, the completion tokens "billed" (sent) and who ended
each stream, so a test can prove that closing the connection stops the bill.

On the wire (OpenRouter's reference, "Streaming", and vLLM's `return_token_ids`):
`: OPENROUTER PROCESSING` comments while queued; a first chunk with `delta.role` (and vLLM's
top-level `prompt_token_ids` when asked); then `chat.completion.chunk`s of 1-4 tokens,
`delta.reasoning` before `delta.content`, each with its `token_ids` when asked; the last
choice chunk carries `finish_reason` / `native_finish_reason`; a usage chunk
(`choices: []`); `data: [DONE]`. The generation id is in `X-Generation-Id`.

Time: every duration in a `StreamPlan` is in the fake's time except `write_every_s`; real
seconds are fake seconds / `time_scale`, so a 15-minute answer can take a second of real time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from handoff.testing.fakeapi.faults import FakeStats, StreamRecord

STREAM_TROUBLES = ("error", "cut", "stall", "none")

_encode = json.encoder.encode_basestring_ascii  # C, fast: a delta's text as a JSON string
_COMMENT = b": OPENROUTER PROCESSING\n\n"
_WORDS: dict[int, re.Pattern[str]] = {}  # k -> k words, each with the space before it


@dataclass
class StreamPlan:
    """How streams are paced and broken. Fake seconds (real = fake / `time_scale`) except
    `write_every_s`, which is real: the least gap between two writes to one stream (chunks that
    fall due in between go out in one write, which keeps thousands of streams cheap: ~2.5 µs
    of the fake's CPU an event at 2000 streams and 0.25 s, benchmarks/fake_stream.py).

    `tokens_per_s` is the mean of a per-request decode rate drawn log-normal (`rate_sigma`);
    `queue_s` the mean time before the first token (log-normal, `queue_sigma`), during which a
    comment goes out at once and then every `comment_every_s`. Trouble per stream, drawn by
    share or forced: `error` (a mid-stream `error` event, `finish_reason: "error"`, no
    `[DONE]`), `cut` (the connection closed before `[DONE]`), `stall` (no byte for `stall_s`,
    then the rest; `stall_s=None`: until the client gives up; `stall_comments`: comment lines
    go on meanwhile, a stall a client must not take for progress); each strikes after a uniform
    share of the answer's tokens (at least one chunk in). `schedule` forces it on the n-th
    stream (1-based), `first_attempt` on every prompt's first stream."""

    chunk_tokens: tuple[int, int] = (1, 4)
    tokens_per_s: float = 40.0
    rate_sigma: float = 0.0
    queue_s: float = 0.0
    queue_sigma: float = 0.0
    comment_every_s: float = 5.0
    time_scale: float = 1.0
    write_every_s: float = 0.02
    error_share: float = 0.0
    cut_share: float = 0.0
    stall_share: float = 0.0
    stall_s: float | None = 30.0
    stall_comments: bool = False  # comments go on through a stall, as OpenRouter's keep-alive
    schedule: dict[int, str] = field(default_factory=dict)
    first_attempt: str | None = None
    usage_always: bool = True  # OpenRouter always sends it; vLLM only with include_usage
    seed: int | None = None

    def __post_init__(self) -> None:
        lo, hi = self.chunk_tokens
        if not 1 <= lo <= hi:
            raise ValueError("chunk_tokens is (least, most), 1 <= least <= most")
        if self.tokens_per_s <= 0 or self.time_scale <= 0 or self.comment_every_s <= 0:
            raise ValueError("tokens_per_s, time_scale and comment_every_s are > 0")
        if self.error_share + self.cut_share + self.stall_share > 1.0 + 1e-9:
            raise ValueError("stream trouble shares sum to more than 1")
        for kind in [*self.schedule.values(), *([self.first_attempt] if self.first_attempt
                                                else [])]:
            if kind not in STREAM_TROUBLES:
                raise ValueError(f"unknown stream trouble {kind!r}; known: "
                                 f"{', '.join(STREAM_TROUBLES)}")

    @classmethod
    def from_json(cls, text: str) -> StreamPlan:
        raw = json.loads(text)
        if "chunk_tokens" in raw:
            raw["chunk_tokens"] = tuple(raw["chunk_tokens"])
        if "schedule" in raw:
            raw["schedule"] = {int(k): v for k, v in raw["schedule"].items()}
        return cls(**raw)


def lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    """A log-normal draw whose *mean* is `mean` (not its median); sigma 0: `mean` itself."""
    if sigma <= 0 or mean <= 0:
        return mean
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def chunked(text: str, n: int, sizes: Iterator[int]) -> Iterator[tuple[str, int, bool]]:
    """`text` as n tokens, in chunks of next(sizes) tokens: (piece, tokens, last) triples whose
    pieces concatenate to `text`. A token is a word (with the space before it) when the text
    has exactly n words, else an even share of its characters (empty when it is shorter than
    n); a text given no token at all is one (text, 0, True). One regex match or slice per
    chunk, not per token: thousands of streams are cut up at once."""
    if n <= 0:
        if text:
            yield text, 0, True
        return
    left = n
    if not text[-1:].isspace() and len(text.split()) == n:
        pos = 0
        while left:
            k = min(next(sizes), left)
            words = _WORDS.get(k) or _WORDS.setdefault(k, re.compile(rf"(?:\s*\S+){{{k}}}"))
            end = words.match(text, pos).end()  # type: ignore[union-attr]  # n words are there
            left -= k
            yield text[pos:end], k, not left
            pos = end
        return
    size, t = len(text), 0
    while t < n:
        k = min(next(sizes), n - t)
        yield text[t * size // n:(t + k) * size // n], k, t + k == n
        t += k


def _text(value: Any) -> str:
    """A message field as the text a delta carries (content parts joined)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(p.get("text", "") for p in value if isinstance(p, dict))
    return ""


def token_plan(result: dict[str, Any]) -> tuple[str, int, str, int]:
    """(reasoning, its tokens, content, its tokens) of a chat.completion, in the order a model
    produced them: the reasoning's count is `completion_tokens_details.reasoning_tokens` (one
    for a reasoning given no count), the content has the rest of `completion_tokens`."""
    choice = result["choices"][0]
    message = choice.get("message") or {}
    reasoning, content = _text(message.get("reasoning")), _text(message.get("content"))
    usage = result.get("usage") or {}
    completion = int(usage.get("completion_tokens") or 0)
    details = usage.get("completion_tokens_details") or {}
    r_n = int(details.get("reasoning_tokens") or (1 if reasoning else 0)) if reasoning else 0
    r_n = min(r_n, completion)
    return reasoning, r_n, content, completion - r_n


class _Frames:
    """One answer's SSE events, from templates made once per stream: a chunk costs one JSON
    string encoding of its text and a few concatenations, never a json.dumps of a dict."""

    def __init__(self, result: dict[str, Any]) -> None:
        choice = result["choices"][0]
        head = "data: {"
        if "id" in result:
            head += '"id":' + json.dumps(str(result["id"])) + ","
        head += ('"object":"chat.completion.chunk","created":' + str(int(result["created"])) +
                 ',"model":' + json.dumps(result.get("model")) + ',"provider":' +
                 json.dumps(result.get("provider")))
        self.head = head
        opening = head + ',"choices":[{"index":0,"delta":{'
        self.open = {"reasoning": opening + '"reasoning":', "content": opening + '"content":'}
        first = head
        if "prompt_token_ids" in result:  # vLLM: in the first chunk only
            first += ',"prompt_token_ids":' + json.dumps(result["prompt_token_ids"],
                                                         separators=(",", ":"))
        self.first = (first + ',"choices":[{"index":0,"delta":{"role":"assistant",'
                      '"content":""},"finish_reason":null}]}\n\n')
        self.middle = '},"finish_reason":null,"native_finish_reason":null'
        self.last = ('},"finish_reason":' + json.dumps(choice.get("finish_reason")) +
                     ',"native_finish_reason":' + json.dumps(choice.get("native_finish_reason")))
        error = choice.get("error")  # a choice's error: OpenRouter puts it at the top level
        self.close_last = "}]" + ("" if error is None else ',"error":' + json.dumps(error))
        self.ids: list[int] | None = choice.get("token_ids")

    def chunk(self, field_: str, text: str, start: int, count: int, last: bool) -> str:
        out = self.open[field_] + _encode(text) + (self.last if last else self.middle)
        if self.ids is not None:
            out += ',"token_ids":[' + ",".join(map(str, self.ids[start:start + count])) + "]"
        return out + (self.close_last if last else "}]") + "}\n\n"

    def usage(self, usage: dict[str, Any]) -> str:
        return (self.head + ',"choices":[],"usage":' + json.dumps(usage, separators=(",", ":"))
                + "}\n\n")

    def error_event(self) -> str:
        return (self.head + ',"error":{"code":502,"message":"Provider returned error: the '
                'upstream stream failed (fake)"},"choices":[{"index":0,"delta":{"content":""},'
                '"finish_reason":"error","native_finish_reason":"error"}]}\n\n')


class Streamer:
    """Sends answers as SSE under a `StreamPlan` and counts them in `FakeStats`."""

    def __init__(self, plan: StreamPlan, stats: FakeStats) -> None:
        self.plan = plan
        self.stats = stats
        self.rng = random.Random(plan.seed)
        self._seen_prompts: set[str] = set()
        self._size_tables: dict[tuple[int, int], list[int]] = {}

    def _trouble(self, number: int, prompt_id: str) -> str | None:
        plan = self.plan
        first = prompt_id not in self._seen_prompts
        self._seen_prompts.add(prompt_id)
        kind: str | None = plan.schedule.get(number)
        if kind is None and first and plan.first_attempt is not None:
            kind = plan.first_attempt
        if kind is None:
            x = self.rng.random()
            for name, share in (("error", plan.error_share), ("cut", plan.cut_share),
                                ("stall", plan.stall_share)):
                if x < share:
                    kind = name
                    break
                x -= share
        return None if kind == "none" else kind

    def _sizes(self) -> Iterator[int]:
        """Chunk sizes: a table drawn once per `chunk_tokens`, cycled from a random start (a
        draw per chunk would cost more than the rest of the chunk)."""
        table = self._size_tables.get(self.plan.chunk_tokens)
        if table is None:
            lo, hi = self.plan.chunk_tokens
            table = [self.rng.randint(lo, hi) for _ in range(1024)]
            self._size_tables[self.plan.chunk_tokens] = table
        return itertools.islice(itertools.cycle(table), self.rng.randrange(1024), None)

    async def serve(self, request: web.Request, body: dict[str, Any], result: dict[str, Any],
                    *, header_id: str, prompt_id: str) -> web.StreamResponse:
        """Send `result` (a chat.completion) as a stream; returns once it ended either way.
        Chunk k is due when its last token is, `queue + tokens / rate` fake seconds in; what
        is due goes out in one write, writes at least `write_every_s` apart."""
        plan, stats, rng = self.plan, self.stats, self.rng
        stats.streams_started += 1
        number = stats.streams_started
        completion = int((result.get("usage") or {}).get("completion_tokens") or 0)
        record = StreamRecord(number=number, prompt=prompt_id, started=time.monotonic(),
                              tokens_total=completion)
        stats.stream_log.append(record)
        trouble = self._trouble(number, prompt_id)
        strike_at = rng.randint(1, max(1, completion - 1)) if trouble else 0
        rate = lognormal(rng, plan.tokens_per_s, plan.rate_sigma)
        queue = lognormal(rng, plan.queue_s, plan.queue_sigma) if plan.queue_s > 0 else 0.0
        scale, every = plan.time_scale, plan.write_every_s
        frames = _Frames(result)
        resp = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
            "X-Generation-Id": header_id})
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            await resp.prepare(request)
            if queue > 0 and not await self._comments(request, resp, record, t0, queue):
                return resp  # the client left while queued
            base, per = t0 + queue / scale, 1.0 / (rate * scale)  # loop time of token 1; a token
            buf: list[str] = [frames.first]
            buf_tokens = sent = 0  # sent: tokens written or in buf
            now, last_write = loop.time(), -math.inf
            reasoning, r_n, content, c_n = token_plan(result)
            fields = [(f, text, n) for f, text, n in (("reasoning", reasoning, r_n),
                                                       ("content", content, c_n)) if text or n]
            sizes, ids, middle = self._sizes(), frames.ids, frames.middle + "}]}\n\n"
            for i, (field_, whole, n) in enumerate(fields):
                opening, final_field = frames.open[field_], i == len(fields) - 1
                for text, count, end in chunked(whole, n, sizes):
                    if trouble and sent >= strike_at:
                        if buf and not await self._write(request, resp, record, "".join(buf),
                                                         buf_tokens):
                            return resp
                        buf, buf_tokens = [], 0
                        if trouble != "stall":
                            return await self._break(request, resp, record, trouble, frames)
                        trouble = None
                        stats.streams_stalled += 1
                        record.stalled = True
                        if plan.stall_comments:
                            alive = await self._comments(request, resp, record, loop.time(),
                                                         plan.stall_s)
                        else:
                            alive = await self._sleep_until(request, record, None if (
                                plan.stall_s is None) else loop.time() + plan.stall_s / scale)
                        if not alive:
                            return resp
                        base += (plan.stall_s or 0) / scale  # the rest keeps its pace after it
                    due = base + max(sent + count - 1, 0) * per
                    if due > now and (now := loop.time()) < due:
                        if buf:
                            if not await self._write(request, resp, record, "".join(buf),
                                                     buf_tokens):
                                return resp
                            buf, buf_tokens, last_write = [], 0, now
                        if not await self._sleep_until(request, record,
                                                       max(due, last_write + every)):
                            return resp
                        now = loop.time()
                    if ids is None and not (end and final_field):  # the common case, inline
                        buf.append(opening + _encode(text) + middle)
                    else:
                        buf.append(frames.chunk(field_, text, sent, count, end and final_field))
                    buf_tokens += count
                    sent += count
            if not fields:  # no token and no text at all: one empty final chunk
                buf.append(frames.chunk("content", "", 0, 0, True))
            include = plan.usage_always or bool(
                (body.get("stream_options") or {}).get("include_usage"))
            if include and result.get("usage") is not None:
                buf.append(frames.usage(result["usage"]))
            buf.append("data: [DONE]\n\n")
            if not await self._write(request, resp, record, "".join(buf), buf_tokens):
                return resp
            await resp.write_eof()
            stats.streams_completed += 1
            record.outcome = "completed"
            return resp
        except (ConnectionError, asyncio.CancelledError):
            if not record.outcome:
                record.outcome = "aborted"  # the server stopped under it
            raise
        finally:
            record.ended = time.monotonic()

    async def _break(self, request: web.Request, resp: web.StreamResponse,
                     record: StreamRecord, trouble: str, frames: _Frames
                     ) -> web.StreamResponse:
        """A mid-stream `error` event then the end of the body (no [DONE]); or a cut."""
        if trouble == "error":
            self.stats.streams_errored += 1
            record.outcome = "error"
            if await self._write(request, resp, record, frames.error_event(), 0):
                await resp.write_eof()
            return resp
        self.stats.streams_cut += 1
        record.outcome = "cut"
        transport = request.transport
        if transport is not None:
            transport.close()  # EOF inside the chunked body: the client sees it incomplete
        return resp

    async def _write(self, request: web.Request, resp: web.StreamResponse,
                     record: StreamRecord, data: str | bytes, tokens: int) -> bool:
        """Write and bill `tokens`; False (counted as cancelled) once the client has gone."""
        transport = request.transport
        if transport is None or transport.is_closing():
            self._gone(record)
            return False
        try:
            await resp.write(data.encode() if isinstance(data, str) else data)
        except ConnectionError:
            self._gone(record)
            return False
        if tokens:
            self.stats.bill(tokens)
            record.tokens_billed += tokens
        return True

    async def _comments(self, request: web.Request, resp: web.StreamResponse,
                        record: StreamRecord, start: float, span: float | None) -> bool:
        """`: OPENROUTER PROCESSING` at once and every comment_every_s (fake) for `span` fake
        seconds from loop time `start` (None: until the client leaves); False once it has."""
        every, scale, t = self.plan.comment_every_s, self.plan.time_scale, 0.0
        while span is None or t < span:
            t = t + every if span is None else min(t + every, span)
            if not (await self._write(request, resp, record, _COMMENT, 0)
                    and await self._sleep_until(request, record, start + t / scale)):
                return False
        return True

    def _gone(self, record: StreamRecord) -> None:
        """The client closed the connection before the stream's end: cancelled by it."""
        self.stats.streams_cancelled_by_client += 1
        record.outcome = "cancelled"

    async def _sleep_until(self, request: web.Request, record: StreamRecord,
                           until: float | None) -> bool:
        """Sleep to loop time `until` (None: forever); False (counted as cancelled) once the
        client has gone (polled every 0.25 s real, so a stalled stream's end is seen too)."""
        loop = asyncio.get_running_loop()
        while True:
            transport = request.transport
            if transport is None or transport.is_closing():
                self._gone(record)
                return False
            left = math.inf if until is None else until - loop.time()
            if left <= 0:
                return True
            await asyncio.sleep(min(left, 0.25))


__all__ = ["STREAM_TROUBLES", "StreamPlan", "Streamer", "chunked", "lognormal", "token_plan"]
