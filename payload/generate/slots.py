"""The slot gate: how many prompts may hold a slot (a request in flight, or a throttled
prompt waiting on a kept slot), and who waits for one.

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

    def _allowed(self) -> int:
        return max(self.min_window, min(self.max_in_flight, int(self.window)))

    @property
    def allowed(self) -> int:
        """Requests (and waiting throttled prompts) the window lets in now."""
        return self._allowed()

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

    def stop(self) -> None:
        """The run stops: nobody waits for a slot any more (callers check the stop)."""
        self._stopped = True
        while self._waiters:
            self._wake_one()
        self.close()

    def close(self) -> None:
        if self._probe_timer is not None:
            self._probe_timer.cancel()
            self._probe_timer = None
