"""Shared rate-limit pause and an AIMD in-flight window.

When the API throttles, 2000 workers each sleeping their own backoff would keep hammering
it in waves. Instead all workers share ONE pause (set from Retry-After, or from a short
growing delay without one), and the number of requests allowed in flight is an AIMD
window: it is cut multiplicatively on throttle signals (429, 503, 529, 402 with
Retry-After) at most once per `decrease_interval`, and grows additively with each success
back up to `--concurrency`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time


class Limiter:
    def __init__(self, max_in_flight: int, *, min_window: int = 4, decrease_factor: float = 0.7,
                 increase_per_success: float = 0.25, decrease_interval: float = 1.0,
                 max_pause: float = 300.0) -> None:
        self.max_in_flight = max_in_flight
        self.window = float(max_in_flight)
        self.min_window = min(min_window, max_in_flight)
        self.decrease_factor = decrease_factor
        self.increase_per_success = increase_per_success
        self.decrease_interval = decrease_interval
        self.max_pause = max_pause
        self.in_flight = 0
        self.pause_until = 0.0
        self.throttle_streak = 0
        self._last_decrease = 0.0
        self._woken = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def _allowed(self) -> int:
        return max(self.min_window, int(self.window))

    async def acquire(self) -> None:
        """Take an in-flight slot: waits out a shared pause and a full window."""
        while True:
            delay = self.pause_until - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            if self.in_flight + self._woken < self._allowed():
                self.in_flight += 1
                return
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._woken -= 1
                    self._wake()  # hand the slot we were woken for to the next waiter
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(fut)
                raise
            self._woken -= 1
            if time.monotonic() >= self.pause_until:
                self.in_flight += 1  # the slot we were woken for is ours: take it now
                return
            # A pause began after we were woken: pass the wake-up on and sleep through it.
            self._wake()

    def _wake(self) -> None:
        # `_woken` counts waiters woken but not yet running: their slots are spoken for, so a
        # newcomer cannot take them, and no more are woken than there are free slots.
        while self._waiters and self.in_flight + self._woken < self._allowed():
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self._woken += 1

    def release(self, *, success: bool = False, throttled: bool = False,
                retry_after: float | None = None) -> None:
        self.in_flight -= 1
        now = time.monotonic()
        if throttled:
            self.throttle_streak += 1
            if now - self._last_decrease >= self.decrease_interval:
                self.window = max(float(self.min_window), self.window * self.decrease_factor)
                self._last_decrease = now
            pause = retry_after if retry_after is not None else min(
                30.0, 0.25 * 2 ** min(self.throttle_streak, 8)) * random.random()
            self.pause_until = max(self.pause_until, now + min(pause, self.max_pause))
        elif success:
            self.throttle_streak = 0
            self.window = min(float(self.max_in_flight), self.window + self.increase_per_success)
        self._wake()


def backoff_delay(attempt: int, base: float, cap: float = 60.0,
                  retry_after: float | None = None) -> float:
    """Full-jitter exponential backoff; never shorter than the server's Retry-After."""
    delay = random.uniform(0.0, min(cap, base * 2 ** max(0, attempt - 1)))
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay
