"""Capped servers for the capacity benchmark, written from the providers' documented
behaviour, not from the limiter's model.

A provider with a concurrency cap serves at most K requests at once and refuses the rest:
- OpenRouter's limits and errors pages: a rate limit answers `429 Too Many Requests`,
  with `Retry-After` when the server knows when to come back (and often without it);
  the in-flight spending budget answers `402` with `error.metadata.limit_source:
  "openrouter_in_flight_budget"` and a `Retry-After` header ("transient");
- HTTP (RFC 9110 10.2.3): `Retry-After` is an integer of seconds (delta-seconds).

This server knows nothing of any client: it counts the requests it is answering (from the
moment a request's headers arrive until its answer is written) and refuses every request
that would make them more than K, at once, with the shape's status and headers. Shapes:

    429-ra    429 with `Retry-After: 1`
    429       429 without Retry-After
    402-ra    402 in_flight_budget_exhausted with `Retry-After: 1`
    changing  429 with `Retry-After: 1`, and K halves from --change-at s after the first
              request until --change-for s later, then recovers
    random-ra no cap: each request refused with probability --refuse-share (429 with
              `Retry-After: 1`), independently of everything else, as an upstream rate
              limiter shared with other users does; the rest answered after --latency
              (0: as fast as the process's CPU allows, a CPU-bound mock)
    random    the same without Retry-After
    clean     the same server refusing nothing (the random shapes' baseline)

Run it in its own process (its CPU is then nobody's): `python -m benchmarks.capped --shape
429 --capacity 500 --latency 0.5` prints `base_url=http://127.0.0.1:PORT/api/v1`; `GET
/_capped/stats` returns the counters and a 100 ms timeline of [arrivals, served, refused,
peak answering].
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

from aiohttp import web

SHAPES = ("429-ra", "429", "402-ra", "changing", "random-ra", "random", "clean")
RANDOM = ("random-ra", "random", "clean")


class Capped:
    def __init__(self, shape: str, capacity: int, latency: float, change_at: float,
                 change_for: float, refuse_share: float = 0.0, seed: int = 1) -> None:
        if shape not in SHAPES:
            raise SystemExit(f"--shape {shape!r}: one of {', '.join(SHAPES)}")
        self.shape = shape
        self.capacity = capacity
        self.latency = latency
        self.change = (change_at, change_at + change_for) if shape == "changing" else None
        self.refuse_share = refuse_share if shape in ("random-ra", "random") else 0.0
        self.rng = random.Random(seed)
        self.answering = 0
        self.t0: float | None = None
        self.requests = self.served = self.refused = self.peak = 0
        self.timeline: dict[int, list[int]] = {}

    def cap(self, now: float) -> int:
        if self.shape in RANDOM:
            return 1 << 30
        if (self.change is not None and self.t0 is not None
                and self.change[0] <= now - self.t0 < self.change[1]):
            return self.capacity // 2
        return self.capacity

    def _row(self, now: float) -> list[int]:
        assert self.t0 is not None
        return self.timeline.setdefault(int((now - self.t0) * 10), [0, 0, 0, 0])

    def _refusal(self) -> web.Response:
        if self.shape == "402-ra":
            body = {"error": {"code": 402, "message": "Request would exceed your in-flight "
                              "budget; retry shortly",
                              "metadata": {"limit_source": "openrouter_in_flight_budget"}}}
            return web.json_response(body, status=402, headers={"Retry-After": "1"})
        body = {"error": {"code": 429, "message": "Rate limit exceeded: too many concurrent "
                          "requests"}}
        headers = {} if self.shape in ("429", "random") else {"Retry-After": "1"}
        return web.json_response(body, status=429, headers=headers)

    async def chat(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        self.requests += 1
        self.answering += 1
        try:
            row = self._row(now)
            row[0] += 1
            body = await request.json()
            if self.answering > self.cap(now) or (
                    self.refuse_share and self.rng.random() < self.refuse_share):
                self.refused += 1
                self._row(time.monotonic())[2] += 1
                return self._refusal()
            self.peak = max(self.peak, self.answering)
            row[3] = max(row[3], self.answering)
            if self.latency > 0:
                await asyncio.sleep(self.latency)
            self.served += 1
            self._row(time.monotonic())[1] += 1
            n = len(json.dumps(body.get("messages", "")))
            return web.json_response({
                "id": f"gen-{self.requests}", "object": "chat.completion",
                "model": body.get("model"), "provider": "Capped",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {
                    "role": "assistant", "content": "A short answer about the topic."}}],
                "usage": {"prompt_tokens": n // 4, "completion_tokens": 8,
                          "total_tokens": n // 4 + 8}})
        finally:
            self.answering -= 1

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({
            "shape": self.shape, "capacity": self.capacity, "change": self.change,
            "requests": self.requests, "served": self.served, "refused": self.refused,
            "peak": self.peak, "timeline": self.timeline})


async def serve(args: argparse.Namespace) -> None:
    capped = Capped(args.shape, args.capacity, args.latency, args.change_at, args.change_for,
                    args.refuse_share, args.seed)
    app = web.Application(client_max_size=1 << 24)
    app.router.add_post("/api/v1/chat/completions", capped.chat)
    app.router.add_get("/_capped/stats", capped.stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=4096)
    await site.start()
    server: Any = site._server
    port = server.sockets[0].getsockname()[1]
    print(f"base_url=http://127.0.0.1:{port}/api/v1", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="429-ra", choices=SHAPES)
    ap.add_argument("--capacity", type=int, default=500)
    ap.add_argument("--latency", type=float, default=0.5)
    ap.add_argument("--change-at", type=float, default=6.0)
    ap.add_argument("--change-for", type=float, default=8.0)
    ap.add_argument("--refuse-share", type=float, default=0.05,
                    help="random shapes: the share of requests refused")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
