"""How many requests may be in flight: slow start, throttling, outages.

The window starts small (`initial_window`, tens) and grows by two per success (tripling
every round trip) up to `--concurrency`, so a run whose every answer is an error has
sent a few dozen requests, not 2000, before it stops. A window nobody fills does not grow.

Throttling (429, or 402 with Retry-After) spends no attempt; the prompt waits as told.
The question is whether to keep its *slot* while it waits, and whether the window should
shrink. A server at capacity refuses at the door, so a slot given back during the wait
would be refilled at once and refused again (a refusal storm at CPU speed); a server that
throttles at random (even half of all answers) is not helped by a smaller window at all.
Both answer 429: what tells them apart is the retry. A prompt that waited and asks again
is refused again almost always when the server is full (its free places go to requests
already running), but only as often as any request when throttling is random. So:

- HOLD (undecided, or the server looks full): the throttled prompt keeps its slot while it
  waits, so dispatch slows in proportion to the share of throttled answers;
- YIELD: a retry refused again, while repeats are refused far more often than answers in
  general (the server is full): the slot is given up for good, the window shrinks by one
  and grows back by one per round trip only (ssthresh), settling at the capacity;
- RELEASE: retries fare like any request (sporadic throttling, judged on a few of them):
  the waiting prompt gives its slot back and the window never shrinks.

Slow start is also damped by the share of answers carrying Retry-After, and stops growing fast
when that share is high, so a start against a full server does not overshoot by 2x.

The outage breaker (outage.py) gates the same slots: while it is open only one probe is in
flight, and when the server answers again the window restarts from `initial_window` and
grows back (slow start) to where it was, instead of releasing 2000 requests at once.

tests/payload/test_limiter_model.py checks these rules on a virtual-time model of a
provider (capacity, outages, sporadic 429s); the benchmark measures them for real.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random

from .client import Kind, Outcome
from .outage import Breaker

INITIAL_WINDOW = 32
# Slow start stops doubling once this share of answers (EWMA over ~64) says "Retry-After":
# far above the noise of a few percent of sporadic 429s.
SLOW_START_EXIT_SHARE = 0.3
# Slots added per success in slow start: the window triples every round trip (32, 96,
# 288, ...), reaching 2000 in four round trips; a start against a full server is damped.
SLOW_START_GAIN = 2.0
# Retries after a throttle needed before throttling may be judged sporadic.
REPEAT_EVIDENCE = 8
HOLD = "hold"  # keep the slot while waiting: the server may be full (or it is undecided)
RELEASE = "release"  # the slot was given back: throttling is sporadic, others may go now
YIELD = "yield"  # the slot was given back for good: the server is full, the window shrank


class Limiter:
    def __init__(self, max_in_flight: int, *, initial_window: int = INITIAL_WINDOW,
                 min_window: int = 1, breaker: Breaker | None = None) -> None:
        self.max_in_flight = max_in_flight
        self.initial_window = min(initial_window, max_in_flight)
        self.window = float(self.initial_window)
        self.ssthresh = float(max_in_flight)  # slow start below it, +1 per round trip above
        self.min_window = min(min_window, max_in_flight)
        self.breaker = breaker or Breaker()
        self.in_flight = 0  # slots taken: requests in flight + throttled prompts waiting
        # Share of throttled answers (EWMA over answers): all throttles, and those that came
        # with Retry-After (the server said how long: that share damps slow start).
        self.share = 0.0
        self.share_ra = 0.0
        self.share_slow = 0.0  # over ~256 answers: the few unlucky prompts of a run's tail
        #                        must not read as "the server refuses everything"
        # How often a prompt that waited after a throttle is throttled again (EWMA).
        self.repeat_rate = 0.25
        self.repeat_samples = 0
        self.capacity_events = 0
        self._pre_outage_window = float(max_in_flight)
        self._woken = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._probe_timer: asyncio.TimerHandle | None = None
        self._stopped = False

    # -- slots ---------------------------------------------------------------------------------
    def _allowed(self) -> int:
        return max(self.min_window, min(self.max_in_flight, int(self.window)))

    @property
    def allowed(self) -> int:
        """Requests (and waiting throttled prompts) the window lets in now."""
        return self._allowed()

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
            elif self.in_flight + self._woken < self._allowed() and (woken or not self._waiters):
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
        # `_woken` counts waiters woken but not yet running: their slots are spoken for, so a
        # newcomer cannot take them, and no more are woken than there are free slots.
        if self.breaker.is_open:
            self._arm_probe_timer()
            return
        while self._waiters and self.in_flight + self._woken < self._allowed():
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

    # -- feedback ------------------------------------------------------------------------------
    def answered(self, outcome: Outcome, *, probe: bool = False, repeat: bool = False
                 ) -> str | None:
        """Learn from one answer (the slot is still held). For a throttled answer, returns
        HOLD (wait holding the slot), RELEASE or YIELD (the slot was given back)."""
        event = self.breaker.record(outcome.server_failure, probe=probe)
        if event == "opened":
            # Flapping (down again within seconds of coming back) keeps the window from before.
            if self.breaker.clock() - self.breaker.closed_at > 10.0:
                # Where to grow back to: the capacity found before, else (still in slow start)
                # as far as before, then on by slow start up to --concurrency.
                self._pre_outage_window = max(min(self.ssthresh, self.max_in_flight),
                                              float(self.initial_window))
        elif event == "closed":
            # Back from an outage: restart small and grow back to where we were.
            self.ssthresh = self._pre_outage_window
            self.window = float(self.initial_window)
            self.share = self.share_ra = self.share_slow = 0.0
            self._wake()
        throttled = outcome.throttled
        self.share += (float(throttled) - self.share) / 32
        self.share_slow += (float(throttled) - self.share_slow) / 256
        self.share_ra += (float(throttled and outcome.retry_after is not None)
                          - self.share_ra) / 64
        if outcome.kind is Kind.OK:
            # Grow only a window that is used: prompts wait for a slot, or all are taken.
            if self._waiters or self.in_flight + self._woken >= self._allowed() - 1:
                if self.window < self.ssthresh:
                    self.window += SLOW_START_GAIN * max(0.0, 1.0 - 2.0 * self.share_ra)
                else:
                    self.window += 1.0 / self.window
                self.window = min(self.window, float(self.max_in_flight))
            return None
        if not throttled:
            return None
        if (self.share_ra > SLOW_START_EXIT_SHARE and self.window < self.ssthresh
                and not self.sporadic):
            # Told to wait by a growing share of answers: stop growing fast until the retries
            # tell a full server from sporadic throttling.
            self.ssthresh = self.window
        if repeat:
            self._learn_repeat(refused=True)
            if self.repeat_rate > max(1.5 * self.share, self.share + 0.2):
                # Refused again after waiting, far more often than answers in general: the
                # server is full. Give this slot up for good.
                self.capacity_events += 1
                self.window = max(float(self.min_window), self.window - 1.0)
                self.ssthresh = min(self.ssthresh, max(self.window, float(self.min_window)))
                self.in_flight -= 1
                self._wake()
                return YIELD
        if self.sporadic:
            self.in_flight -= 1  # the wait does not need the slot: others may go now
            self._wake()
            return RELEASE
        return HOLD

    @property
    def sporadic(self) -> bool:
        """Retries after a throttle fare about as well as any request: throttling is
        sporadic, not a full server."""
        return (self.repeat_samples >= REPEAT_EVIDENCE and self.share < 0.15
                and self.repeat_rate < min(0.25, self.share + 0.1))

    def retried_ok(self) -> None:
        """A prompt that waited after a throttle (holding its slot, or released as sporadic)
        got through: repeats are not (all) refused. Not after a YIELD: that retry got a slot
        only once the window had shrunk to fit, and proves nothing about throttling."""
        self._learn_repeat(refused=False)

    def _learn_repeat(self, *, refused: bool) -> None:
        self.repeat_samples += 1
        self.repeat_rate += (float(refused) - self.repeat_rate) / 16
        if self.sporadic:
            # A slow-start exit was a false alarm: grow again as fast as before.
            self.ssthresh = float(self.max_in_flight)

    def throttle_wait(self, retry_after: float | None, throttles_in_a_row: int) -> float:
        """How long a throttled prompt waits: the server's Retry-After (already capped), else a
        short jittered exponential delay whose ceiling grows with the share of throttled
        answers (0.1 s at a few percent, 0.2 s at half, 10 s when 99% are, 30 s at most)."""
        if retry_after is not None:
            return retry_after
        ceiling = min(30.0, 0.1 / max(0.003, 1.0 - self.share_slow))
        delay = min(ceiling, 0.05 * 2 ** min(throttles_in_a_row - 1, 16))
        return delay * random.uniform(0.5, 1.0)

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


def backoff_delay(attempt: int, base: float, cap: float = 60.0,
                  retry_after: float | None = None) -> float:
    """Full-jitter exponential backoff; never shorter than the server's Retry-After."""
    delay = random.uniform(0.0, min(cap, base * 2 ** max(0, attempt - 1)))
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay
