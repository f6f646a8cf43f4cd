"""The slot gate: how many prompts may hold a slot (a request in flight, or a throttled
prompt waiting on a kept slot: a `Hold`), who waits for one, and who waits for a free
place at the server (`place`).

The gate knows nothing of why the window is what it is (that is limiter.py, which
subclasses it and moves `window`); it only keeps the count honest under asyncio:
a waiter woken for a free slot has it spoken for (`_woken`) until it runs, so a newcomer
cannot take it and no more waiters are woken than there are free slots; a cancelled
waiter that had been woken hands its wake-up on. While the outage breaker is open the gate
lets exactly one probe through, when the breaker says the next probe is due.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

from payload.generate.outage import Breaker

# A request waits for a free place at the server at most max(this, two round trips)
# (see `place`).
PLACE_MAX_S = 1.0
# A throttled prompt keeps its slot through a wait up to this; a longer Retry-After (a
# rate limit for minutes) gives the slot to prompts that may go now.
HOLD_MAX_S = 5.0
# What the limiter answers a throttled prompt (Limiter.answered):
HOLD = "hold"  # the throttled prompt keeps its slot while it waits (a Hold)
RELEASE = "release"  # the slot was given back: the wait is too long to hold it
YIELD = "yield"  # the slot was given back: it is beyond the window (the window shrank)


class Hold(str):
    """HOLD for one throttled prompt: the slot it keeps while it waits. The limiter takes
    it back (`revoked`) if the window falls below the requests at the server when the
    prompt was refused: it was refused for a window too large, and keeping it would leave
    the server under-used until its wait ends. Ask `Limiter.resumed` when the wait ends."""

    n_send: int | None
    revoked: bool


class Slots:
    def __init__(self, max_in_flight: int, *, initial_window: int, min_window: int,
                 breaker: Breaker | None) -> None:
        self.max_in_flight = max_in_flight
        self.initial_window = min(initial_window, max_in_flight)
        self.window = float(self.initial_window)
        self.min_window = min(min_window, max_in_flight)
        self.breaker = breaker or Breaker()
        self.in_flight = 0  # slots taken: requests in flight + throttled prompts waiting
        self._woken = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._probe_timer: asyncio.TimerHandle | None = None
        self._stopped = False
        self.at_server = 0  # requests sent and not yet answered (waiting prompts are not)
        self.srtt = 0.0  # smoothed latency of successful answers
        # Requests waiting for a free place at the server (`place`), and those woken for
        # one that have not been sent yet (their places are spoken for).
        self._place_waiters: collections.deque[asyncio.Future[bool]] = collections.deque()
        self._place_woken = 0

    def _allowed(self) -> int:
        return max(self.min_window, min(self.max_in_flight, int(self.window)))

    @property
    def allowed(self) -> int:
        """Requests (and waiting throttled prompts) the window lets in now."""
        return self._allowed()

    @property
    def unclaimed(self) -> int:
        """Free slots that no prompt is waiting for: where the window is open but every
        worker is busy elsewhere (waiting out a throttle without a slot), the run starts
        more workers (run.py)."""
        if self._waiters or self.breaker.is_open:
            return 0
        return max(0, self._allowed() - self.in_flight - self._woken)

    def _free(self) -> bool:
        """A slot is free for a newcomer (none taken by a woken waiter that has not run)."""
        return self.in_flight + self._woken < self._allowed()

    async def acquire(self) -> bool:
        """Take a slot (waits out a full window and an outage). True when the slot is the
        outage probe: the one request that tests whether the server is back."""
        woken = False
        while True:
            if self._stopped:  # the run is stopping: let every caller see it at once
                self.in_flight += 1
                return False
            if self.breaker.is_open:
                if self.breaker.take_probe(self.breaker.clock()):
                    self.in_flight += 1
                    return True
                self._arm_probe_timer()
            elif self._free() and (woken or not self._waiters):
                self.in_flight += 1
                return False
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._woken -= 1
                    self._wake()  # hand the wake-up we got to the next waiter
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(fut)
                raise
            self._woken -= 1
            woken = True

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        if self.breaker.is_open:
            self._arm_probe_timer()
            return
        while self._waiters and self._free():
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self._woken += 1
                return

    def _arm_probe_timer(self) -> None:
        if self._probe_timer is not None or self.breaker.probe_busy:
            return
        loop = asyncio.get_running_loop()
        self._probe_timer = loop.call_at(max(loop.time(), self.breaker.next_probe_at),
                                         self._probe_due)

    def _probe_due(self) -> None:
        self._probe_timer = None
        if self.breaker.is_open and not self.breaker.probe_busy and self._woken == 0:
            self._wake_one()

    # -- places at the server ------------------------------------------------------------------
    def _place_limit(self) -> float:
        """A request goes when it would be sent with fewer than this many of ours at the
        server (the limiter's full level once it has found a capacity; here: no limit)."""
        return float("inf")

    def returned(self) -> None:
        """A request sent is back (answered, failed or cancelled): no longer at the server."""
        self.at_server -= 1
        self._wake_places()

    def _wake_places(self) -> None:
        """Wake the requests waiting for a place that the place limit now lets go."""
        if self._place_waiters:
            limit = self._place_limit()
            while self._place_waiters and self.at_server + self._place_woken + 1 < limit:
                fut = self._place_waiters.popleft()
                if not fut.done():
                    fut.set_result(True)
                    self._place_woken += 1

    async def place(self) -> None:
        """A request (a prompt's first or a retry) about to be sent, its slot taken: wait
        until the server has a free place for it (`_place_limit`), i.e. until an answer
        frees one. Once the limiter has found a capacity, a request sent into a full
        server is refused and its prompt waits a whole Retry-After (or a round trip): the
        window's probe margin then sits here, on our side, instead of being refused at the
        server about once per wait, and a run's end has no tail of prompts refused in its
        last second. Waits at most max(PLACE_MAX_S, two round trips), then goes anyway."""
        if self._stopped or self.at_server + self._place_woken + 1 < self._place_limit():
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._place_waiters.append(fut)
        timer = loop.call_later(max(PLACE_MAX_S, 2.0 * self.srtt), _expire, fut)
        try:
            if await fut:
                self._place_woken -= 1
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result():
                self._place_woken -= 1
            raise
        finally:
            timer.cancel()

    def stop(self) -> None:
        """The run stops: nobody waits for a slot any more (callers check the stop)."""
        self._stopped = True
        while self._waiters:
            self._wake_one()
        while self._place_waiters:
            fut = self._place_waiters.popleft()
            if not fut.done():
                fut.set_result(False)
        self.close()

    def close(self) -> None:
        if self._probe_timer is not None:
            self._probe_timer.cancel()
            self._probe_timer = None


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)
