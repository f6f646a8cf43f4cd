"""A lean streaming chat-completions server for benchmarks/stream.py: thinking-size answers
as OpenRouter streams them, for thousands of streams at once on a small share of a core.

Why not the project's fake (handoff/testing/fakeapi): the benchmark measures the CLIENT's
CPU per SSE event, so the server must emit ~1,000 events an answer for 2000 answers at once
without becoming the bottleneck on the same 2 cores. Here one ticker (no task per stream)
writes each stream's due events straight to its transport (no coroutine per write), and
requests are parsed by a minimal HTTP/1.1 protocol (keep-alive, Content-Length bodies).
Its CPU and how late its ticks ran are in `GET /_stream/stats`, so a run can say whether
the server kept its schedule.

An answer is decided by the prompt alone (seeded by a hash of the request's messages), so
every client in a run gets the same answers: a log-normal length in tokens (median and
sigma below, cut at max_tokens with finish_reason "length"), 80% reasoning then content,
sent in chunks of 1-4 tokens; a log-normal time to first token and a log-normal decode
rate per answer. `--time-scale` divides every duration (2.0: twice as fast as real).

The wire shape is OpenRouter's ("Streaming" in its API reference): a `: OPENROUTER
PROCESSING` comment while the answer is queued, `data:` chunks whose `choices[0].delta`
carries `reasoning` (with `reasoning_details`, as OpenRouter sends both) or `content`, a
chunk with `finish_reason`, a final chunk with `usage` and empty `choices`, then `data:
[DONE]`; `X-Generation-Id` as a header. Events that fall due in the same tick go out in
one write (at the default rates and tick, one event a write, as over a real network).
A request without `"stream": true` gets the same answer as one JSON body once the stream
would have ended.

    python -m benchmarks.sse_server --port 0 --time-scale 1
    # prints base_url=http://127.0.0.1:PORT/api/v1
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import json
import math
import random
import resource
import time
from dataclasses import dataclass, field
from typing import Any

WORDS = ["the", "model", "considers", "each", "step", "of", "the", "problem", "before", "it",
         "writes", "an", "answer", "and", "checks", "whether", "the", "earlier", "result",
         "still", "holds", "when", "the", "case", "is", "larger", "or", "the", "input", "is",
         "empty", "so", "that", "nothing", "is", "missed"]


@dataclass
class Knobs:
    # Log-normal length: mean ~3,450 tokens (the seed's run averaged ~3,500), 2% cut at
    # max_tokens ("length"). The cap bounds the benchmark's tail (max_tokens / the slowest
    # rate), which costs wall time and no CPU worth measuring.
    tokens_median: float = 3100.0
    tokens_sigma: float = 0.5
    max_tokens: int = 8192
    rate_median: float = 50.0  # tokens/s an answer decodes at (real time)
    rate_sigma: float = 0.2
    ttft_median: float = 1.0  # seconds to the first token (real time)
    ttft_sigma: float = 0.5
    chunk_min: int = 1
    chunk_max: int = 4
    reasoning_share: float = 0.8
    reasoning_details: bool = True
    time_scale: float = 1.0
    tick: float = 0.01
    # A stream whose connection holds this much unsent is paused (as TCP's window would
    # stall a real server's writes), so a client that reads slower than the schedule is
    # not buffered for without bound.
    max_buffer: int = 256 * 1024
    seed: int = 0


def lognormal_mu(median: float) -> float:
    return math.log(median)


@dataclass
class Answer:
    """One answer's schedule: chunk texts with the time each is due (seconds after the
    request arrived), and its totals."""

    events: list[tuple[float, bool, str]]  # (due, is_reasoning, text)
    tokens: int
    reasoning_tokens: int
    finish: str
    duration: float


def plan_answer(messages_key: bytes, max_tokens: int | None, k: Knobs) -> Answer:
    rng = random.Random(hashlib.sha256(messages_key + str(k.seed).encode()).digest())
    tokens = max(8, round(rng.lognormvariate(lognormal_mu(k.tokens_median), k.tokens_sigma)))
    cap = min(k.max_tokens, max_tokens or k.max_tokens)
    finish = "stop"
    if tokens > cap:
        tokens, finish = cap, "length"
    reasoning_tokens = int(tokens * k.reasoning_share)
    rate = rng.lognormvariate(lognormal_mu(k.rate_median), k.rate_sigma) * k.time_scale
    t = rng.lognormvariate(lognormal_mu(k.ttft_median), k.ttft_sigma) / k.time_scale
    events: list[tuple[float, bool, str]] = []
    sent = 0
    n_words = len(WORDS)
    while sent < tokens:
        size = min(rng.randint(k.chunk_min, k.chunk_max), tokens - sent)
        text = "".join(" " + WORDS[(sent + j) % n_words] for j in range(size))
        events.append((t, sent < reasoning_tokens, text))
        sent += size
        t += size / rate
    return Answer(events, tokens, reasoning_tokens, finish, t)


@dataclass(order=True)
class Stream:
    due: float
    seq: int
    conn: Any = field(compare=False)
    answer: Answer = field(compare=False)
    started: float = field(compare=False)
    gen_id: str = field(compare=False)
    model: str = field(compare=False)
    prompt_tokens: int = field(compare=False)
    stream: bool = field(compare=False)
    usage_chunk: bool = field(compare=False)
    next: int = field(default=0, compare=False)


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Server:
    def __init__(self, knobs: Knobs) -> None:
        self.k = knobs
        self.heap: list[Stream] = []
        self.seq = 0
        self.open = 0
        self.t0: float | None = None
        self.requests = self.answered = self.cancelled = self.events = 0
        self.bytes = 0
        self.lags: list[float] = []
        self.max_buffer = 0
        self.last_arrival = 0.0
        self.paused = 0  # ticks a stream waited for its client to read (max_buffer)
        self.timeline: list[tuple[float, int]] = []  # (s since first request, open)
        self.created = int(time.time())

    # -- requests ------------------------------------------------------------------------------
    def start(self, conn: Conn, body: bytes) -> None:
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        self.requests += 1
        self.last_arrival = now - self.t0
        req = json.loads(body)
        messages = req.get("messages") or []
        key = json.dumps(messages, sort_keys=True).encode()
        answer = plan_answer(key, req.get("max_tokens"), self.k)
        stream = bool(req.get("stream"))
        self.seq += 1
        s = Stream(now + (answer.events[0][0] if stream else answer.duration), self.seq, conn,
                   answer, now, f"gen-{self.created}-{self.seq}", str(req.get("model")),
                   len(key) // 4, stream,
                   True)  # OpenRouter sends usage on every stream; include_usage is moot
        self.open += 1
        conn.busy = s
        if stream:
            conn.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                       b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                       b"X-Generation-Id: " + s.gen_id.encode() + b"\r\n\r\n"
                       + chunked(b": OPENROUTER PROCESSING\n\n"))
        heapq.heappush(self.heap, s)

    def _usage(self, s: Stream) -> dict[str, Any]:
        a = s.answer
        return {"prompt_tokens": s.prompt_tokens, "completion_tokens": a.tokens,
                "total_tokens": s.prompt_tokens + a.tokens,
                "cost": round((s.prompt_tokens * 0.5 + a.tokens * 2.5) * 1e-6, 8),
                "completion_tokens_details": {"reasoning_tokens": a.reasoning_tokens}}

    def _head(self, s: Stream) -> str:
        return (f'{{"id":"{s.gen_id}","provider":"Bench","model":"{s.model}",'
                f'"object":"chat.completion.chunk","created":{self.created},')

    def _event(self, s: Stream, reasoning: bool, text: str) -> bytes:
        if reasoning:
            details = (f',"reasoning_details":[{{"type":"reasoning.text","text":"{text}",'
                       f'"format":"unknown","index":0}}]' if self.k.reasoning_details else "")
            delta = f'"content":"","reasoning":"{text}"{details}'
        else:
            delta = f'"content":"{text}","reasoning":null'
        return (f'data: {self._head(s)}"choices":[{{"index":0,"delta":{{"role":"assistant",'
                f'{delta}}},"finish_reason":null,"native_finish_reason":null,"logprobs":null'
                f'}}]}}\n\n').encode()

    def _tail(self, s: Stream) -> bytes:
        a = s.answer
        native = "max_tokens" if a.finish == "length" else "stop"
        end = (f'data: {self._head(s)}"choices":[{{"index":0,"delta":{{"role":"assistant",'
               f'"content":""}},"finish_reason":"{a.finish}","native_finish_reason":'
               f'"{native}","logprobs":null}}]}}\n\n')
        usage = (f'data: {self._head(s)}"choices":[],"usage":'
                 f'{json.dumps(self._usage(s), separators=(",", ":"))}}}\n\n')
        return (end + usage + "data: [DONE]\n\n").encode()

    def _whole(self, s: Stream) -> bytes:
        a = s.answer
        reasoning = "".join(t for _, r, t in a.events if r)
        content = "".join(t for _, r, t in a.events if not r)
        body = json.dumps({
            "id": s.gen_id, "provider": "Bench", "model": s.model, "object": "chat.completion",
            "created": self.created, "choices": [{
                "index": 0, "logprobs": None, "finish_reason": a.finish,
                "native_finish_reason": "max_tokens" if a.finish == "length" else "stop",
                "message": {"role": "assistant", "content": content,
                            "reasoning": reasoning or None}}],
            "usage": self._usage(s)}, separators=(",", ":")).encode()
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"X-Generation-Id: %s\r\n\r\n%s" % (len(body), s.gen_id.encode(), body))

    # -- the ticker ----------------------------------------------------------------------------
    async def tick(self) -> None:
        next_sample = 0.0
        planned = time.monotonic()
        while True:
            planned += self.k.tick
            await asyncio.sleep(max(0.0, planned - time.monotonic()))
            now = time.monotonic()
            self.lags.append(now - planned)
            if now - planned > 1.0:  # far behind: do not try to catch up tick by tick
                planned = now
            heap = self.heap
            while heap and heap[0].due <= now:
                s = heapq.heappop(heap)
                if s.conn.busy is not s:  # the client went away: it was counted then
                    continue
                self._serve(s, now)
            if self.t0 is not None and now - self.t0 >= next_sample:
                self.timeline.append((round(now - self.t0, 2), self.open))
                next_sample = now - self.t0 + 0.1

    def _serve(self, s: Stream, now: float) -> None:
        conn = s.conn
        if conn.buffered() > self.k.max_buffer:
            self.paused += 1
            s.due = now + self.k.tick
            heapq.heappush(self.heap, s)
            return
        if not s.stream:
            conn.write(self._whole(s))
            self._finish(s)
            return
        events = s.answer.events
        since = now - s.started
        i = s.next
        parts = []
        while i < len(events) and events[i][0] <= since:
            _, reasoning, text = events[i]
            parts.append(self._event(s, reasoning, text))
            i += 1
        self.events += i - s.next
        s.next = i
        if i == len(events):
            parts.append(self._tail(s))
        data = b"".join(parts)
        conn.write(chunked(data) + (b"0\r\n\r\n" if i == len(events) else b""))
        self.max_buffer = max(self.max_buffer, conn.buffered())
        if i == len(events):
            self._finish(s)
        else:
            s.due = s.started + events[i][0]
            heapq.heappush(self.heap, s)

    def _finish(self, s: Stream) -> None:
        self.answered += 1
        self.open -= 1
        s.conn.busy = None
        s.conn.next_request()

    def lost(self, s: Stream) -> None:
        self.cancelled += 1
        self.open -= 1

    def stats(self) -> dict[str, Any]:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        lags = sorted(self.lags) or [0.0]
        return {"requests": self.requests, "answered": self.answered,
                "cancelled": self.cancelled, "events": self.events, "bytes": self.bytes,
                "open": self.open, "cpu_s": ru.ru_utime + ru.ru_stime,
                "peak_rss_mb": ru.ru_maxrss / 1024, "max_write_buffer": self.max_buffer,
                "paused": self.paused,
                "last_arrival_s": self.last_arrival,
                "lag_p50_s": lags[len(lags) // 2], "lag_p99_s": lags[int(len(lags) * 0.99)],
                "lag_max_s": lags[-1], "ticks": len(self.lags), "timeline": self.timeline}


class Conn(asyncio.Protocol):
    """One client connection: requests parsed in turn (keep-alive), one at a time."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = b""
        self.busy: Stream | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.busy is not None:
            self.server.lost(self.busy)
            self.busy = None
        self.transport = None

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)
            self.server.bytes += len(data)

    def buffered(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.busy is None:
            self.next_request()

    def next_request(self) -> None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.transport is None:
            return
        head = self.buf[:end].decode("latin-1").split("\r\n")
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4:end + 4 + length]
        self.buf = self.buf[end + 4 + length:]
        method, path = [*head[0].split(" "), "", ""][:2]
        if method == "POST" and path.endswith("/chat/completions"):
            self.server.start(self, body)
            return
        if method == "GET" and path == "/_stream/stats":
            self._reply(200, json.dumps(self.server.stats()).encode())
        else:
            self._reply(404, b'{"error":{"code":404,"message":"not served here"}}')
        self.next_request()

    def _reply(self, status: int, body: bytes) -> None:
        self.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d"
                   b"\r\n\r\n%s" % (status, len(body), body))


async def serve(args: argparse.Namespace) -> None:
    knobs = Knobs(**{f: getattr(args, f) for f in Knobs.__dataclass_fields__})
    server = Server(knobs)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: Conn(server), "127.0.0.1", args.port, backlog=4096)
    port = srv.sockets[0].getsockname()[1]
    print(f"base_url=http://127.0.0.1:{port}/api/v1", flush=True)
    await server.tick()


def add_knobs(ap: argparse.ArgumentParser) -> None:
    for name, default in Knobs().__dict__.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            ap.add_argument(flag, type=lambda v: v.lower() in ("1", "true", "on", "yes"),
                            default=default)
        else:
            ap.add_argument(flag, type=type(default), default=default)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    add_knobs(ap)
    args = ap.parse_args()
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
