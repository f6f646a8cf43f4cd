"""A deterministic model of the generator's flow control, run on virtual time.

The real limiter (payload.generate.limiter.Limiter, with its outage Breaker) drives a
modelled server: a provider that serves at most K at once and refuses the rest at the door
(429 + Retry-After), random throttling with or without Retry-After, and outage windows
(every request 503). The event loop's clock is virtual: `asyncio.sleep(0.5)` takes no real
time, so a 20,000-prompt run with a 30 s outage is simulated in a second or two, with the
same result every time (seeded). The end-to-end tests and the benchmark run the real
payload against the real fake API; this model lets the controller's rules be checked
exactly, free of a busy machine's noise.

`prompt()` mirrors `Attempts._attempts` (payload/generate/attempts.py) for what matters to flow
control: a slot per prompt, HOLD/RELEASE/YIELD after a throttle, the wait the limiter asks
for, and a slot given back during a backoff or an outage.
"""

from __future__ import annotations

import asyncio
import random
import selectors
from dataclasses import dataclass, field
from typing import Any

from payload.generate.client import Kind, Outcome
from payload.generate.limiter import Limiter
from payload.generate.outage import Breaker
from payload.generate.slots import HOLD, HOLD_MAX_S

DOOR_S = 0.002  # how long a refusal at the door takes


class _VirtualSelector(selectors.BaseSelector):
    """Never waits: a select() with a timeout moves the clock forward by that timeout."""

    def __init__(self) -> None:
        self.now = 0.0
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, 0, events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout:
            self.now += timeout
        return []

    def get_map(self) -> Any:
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._vsel = _VirtualSelector()
        super().__init__(selector=self._vsel)

    def time(self) -> float:
        return self._vsel.now


@dataclass
class Server:
    """The modelled provider. Timeline: per 100 ms, [arrivals, successes, refusals, peak]."""

    latency: float = 0.5
    jitter: float = 0.2  # each answer takes latency x uniform(1 - jitter, 1 + jitter)
    capacity: int | None = None
    capacity_retry_after: float | None = 1.0
    capacity_status: int = 429  # 402: OpenRouter's in-flight budget (with Retry-After)
    halved: tuple[float, float] | None = None  # the capacity halves between these seconds
    throttle_share: float = 0.0
    throttle_retry_after: float | None = None
    outage: tuple[float, float] | None = None  # (start, end) in seconds
    # A CPU-bound server (a mock answering as fast as its CPU allows): one request at a
    # time, each `service` s of its CPU, refusals included (they are parsed too), in
    # arrival order; `latency` and `jitter` are then not used.
    service: float | None = None
    # A loaded client machine: answers are read only when the client's loop runs, at
    # ticks this far apart at most (uniform), not when the server wrote them.
    read_gap: float = 0.0
    # Answers read out of send order: a concurrent server's answers on many connections
    # reach the client's loop in whatever order its poll returns them, each up to this
    # much later than written (uniform).
    shuffle: float = 0.0
    seed: int = 1
    serving: int = 0
    requests: int = 0
    refusals: int = 0
    successes: int = 0
    timeline: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._cpu_free_at = 0.0  # (service) when the server's CPU is next free
        self._next_read = 0.0  # (read_gap) the client's next tick

    async def _queue(self, loop: asyncio.AbstractEventLoop) -> float:
        """(service) Wait for the CPU and use it for one request; returns the time taken."""
        assert self.service is not None
        now = loop.time()
        start = max(now, self._cpu_free_at)
        self._cpu_free_at = start + self.service * self.rng.uniform(0.8, 1.2)
        await asyncio.sleep(self._cpu_free_at - now)
        return self._cpu_free_at - now

    async def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        """(read_gap) The answer is read at the client's next tick."""
        now = loop.time()
        while self._next_read <= now:
            self._next_read += self.rng.uniform(0.0, self.read_gap)
        await asyncio.sleep(self._next_read - now)

    def cap(self, now: float) -> int:
        assert self.capacity is not None
        if self.halved and self.halved[0] <= now < self.halved[1]:
            return self.capacity // 2
        return self.capacity

    def _row(self, now: float) -> list[int]:
        return self.timeline.setdefault(int(now * 10), [0, 0, 0, 0])

    async def request(self, loop: asyncio.AbstractEventLoop) -> Outcome:
        now = loop.time()
        self.requests += 1
        row = self._row(now)
        row[0] += 1
        row[3] = max(row[3], self.serving + 1)
        if self.outage and self.outage[0] <= now < self.outage[1]:
            await asyncio.sleep(DOOR_S)
            return Outcome(Kind.RETRY, 503, "unavailable", server_failure=True,
                           latency_s=DOOR_S)
        if self.capacity is not None and self.serving >= self.cap(now):
            self.refusals += 1
            row[2] += 1
            await asyncio.sleep(DOOR_S)
            kind = "inflight_limited" if self.capacity_status == 402 else "rate_limited"
            return Outcome(Kind.RETRY, self.capacity_status, kind,
                           retry_after=self.capacity_retry_after, throttled=True,
                           latency_s=DOOR_S)
        if self.service is not None:
            return await self._cpu_bound(loop, now)
        if self.throttle_share and self.rng.random() < self.throttle_share:
            self.refusals += 1
            row[2] += 1
            await asyncio.sleep(DOOR_S)
            return Outcome(Kind.RETRY, 429, "rate_limited", retry_after=self.throttle_retry_after,
                           throttled=True, latency_s=DOOR_S)
        self.serving += 1
        took = self.latency * self.rng.uniform(1 - self.jitter, 1 + self.jitter)
        try:
            await asyncio.sleep(took)
        finally:
            self.serving -= 1
        self.successes += 1
        self._row(loop.time())[1] += 1
        return Outcome(Kind.OK, 200, "ok", latency_s=took)


    async def _cpu_bound(self, loop: asyncio.AbstractEventLoop, sent: float) -> Outcome:
        self.serving += 1
        try:
            await self._queue(loop)
        finally:
            self.serving -= 1
        refused = bool(self.throttle_share) and self.rng.random() < self.throttle_share
        # (the client measures the latency as it parses the answer; a busy loop then gets
        # to the limiter later: the answer's time less its latency is not its send time)
        took = loop.time() - sent
        if self.shuffle:
            await asyncio.sleep(self.rng.uniform(0.0, self.shuffle))
            took = loop.time() - sent
        if self.read_gap:
            await self._read(loop)
        if refused:
            self.refusals += 1
            self._row(loop.time())[2] += 1
            return Outcome(Kind.RETRY, 429, "rate_limited", retry_after=self.throttle_retry_after,
                           throttled=True, latency_s=took)
        self.successes += 1
        self._row(loop.time())[1] += 1
        return Outcome(Kind.OK, 200, "ok", latency_s=took)


@dataclass
class Result:
    wall: float
    done: int
    requests: int
    refusals: int
    server: Server
    limiter: Limiter

    def rate_after(self, t: float, seconds: float = 1.0) -> float:
        tl = self.server.timeline
        b0 = int(t * 10)
        return sum(tl.get(b, [0, 0])[1] for b in range(b0, b0 + int(seconds * 10))) / seconds

    def first_second_after(self, t: float) -> tuple[int, int]:
        """(peak requests in the server, arrivals) in the second after t."""
        rows = [self.server.timeline.get(b, [0, 0, 0, 0]) for b in range(int(t * 10),
                                                                          int(t * 10) + 10)]
        return max(r[3] for r in rows), sum(r[0] for r in rows)

    def back_to(self, t: float, rate: float) -> float:
        """Seconds after t until a 1 s window runs at `rate` or more."""
        for i in range(0, 1200):
            if self.rate_after(t + i / 10) >= rate:
                return i / 10 + 1.0
        return float("inf")


def simulate(n: int, concurrency: int, server: Server, *, seed: int = 1,
             trace: float = 0.0) -> Result:
    """Run n prompts; `trace` > 0 prints the limiter's state every `trace` virtual seconds."""
    loop = VirtualLoop()
    rng = random.Random(seed)
    try:
        return loop.run_until_complete(_run(loop, rng, n, concurrency, server, trace))
    finally:
        loop.close()


async def _run(loop: asyncio.AbstractEventLoop, rng: random.Random, n: int, concurrency: int,
               server: Server, trace: float) -> Result:
    import payload.generate.limiter as limiter_module
    limiter_module.random.seed(rng.random())  # the limiter's jitter, reproducible too
    lim = Limiter(concurrency, breaker=Breaker(clock=loop.time),
                  left=lambda: n - done)  # as run.py tells it
    queue: asyncio.Queue[int | None] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    workers = concurrency + concurrency // 4 + 8
    for _ in range(workers):
        queue.put_nowait(None)
    done = 0

    async def prompt() -> None:
        nonlocal done
        probe = await lim.acquire()
        held = True
        throttles = 0
        try:
            while True:
                if lim.capped and not probe:
                    await lim.place()  # attempts.py: at a capacity, a free place first
                n_send = lim.sending()
                try:
                    o = await server.request(loop)
                finally:
                    lim.returned()
                decision = lim.answered(o, probe=probe, n_send=n_send)
                probe = False
                if o.kind is Kind.OK:
                    done += 1
                    return
                if o.throttled:
                    throttles += 1
                    wait = lim.throttle_wait(o.retry_after, throttles)
                    if decision != HOLD or wait > HOLD_MAX_S:
                        if lim.resumed(decision):
                            lim.release()
                        held = False
                        start_spares()  # attempts.py: slot_left
                        await asyncio.sleep(wait)
                        probe, held = await lim.acquire(), True
                    else:
                        await asyncio.sleep(wait)
                        held = lim.resumed(decision)
                        if not held:  # taken back: queue for a slot
                            probe, held = await lim.acquire(), True
                    continue
                throttles = 0
                lim.release()
                held = False
                start_spares()
                await asyncio.sleep(rng.uniform(0, 0.02))  # run.py: backoff_delay, base 0.02
                probe, held = await lim.acquire(), True
        finally:
            if held:
                lim.release()

    async def worker() -> None:
        while (item := await queue.get()) is not None:
            del item
            await prompt()

    async def tracer() -> None:
        while True:
            await asyncio.sleep(trace)
            print(f"t={loop.time():6.1f} window {lim.window:7.1f} ssthresh {lim.ssthresh:7.1f} "
                  f"capped {lim.capped:d} level {lim.full_level:6.0f} "
                  f"slots {lim.in_flight:5d} holds {len(lim._holds):4d} at server "
                  f"{lim.at_server:5d} serving {server.serving:5d} "
                  f"share {lim.evidence.share:.2f} done {done} refusals {server.refusals}")

    spares: list[asyncio.Future[None]] = []

    async def spare() -> None:  # run.py's work_spare
        while not queue.empty() and queue._queue[0] is not None:  # type: ignore[attr-defined]
            queue.get_nowait()
            await prompt()

    def start_spares() -> None:  # run.py's _start_spares
        for _ in range(min(lim.unclaimed, queue.qsize() - workers)):
            spares.append(asyncio.ensure_future(spare()))

    async def spawner() -> None:  # run.py's _spawn_spares
        while True:
            await asyncio.sleep(0.02)
            start_spares()

    tracing = asyncio.ensure_future(tracer()) if trace else None
    spawning = asyncio.ensure_future(spawner())
    await asyncio.gather(*(worker() for _ in range(workers)))
    while spares:
        await spares.pop()
    spawning.cancel()
    if tracing is not None:
        tracing.cancel()
    lim.close()
    return Result(loop.time(), done, server.requests, server.refusals, server, lim)
