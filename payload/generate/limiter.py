"""How many requests may be in flight: slow start, throttling, outages.

The window starts small (`initial_window`, tens) and grows by two per success (tripling
every round trip) up to `--concurrency`, so a run whose every answer is an error has
sent a few dozen requests, not 2000, before it stops. A window nobody fills does not grow.

Throttling (429, or 402 with Retry-After) spends no attempt: the prompt waits as told,
and keeps its *slot* while it waits (up to HOLD_MAX_S). That is what slows dispatch in
proportion to the share of throttled answers, and what keeps a full server from being
flooded: a slot given back during the wait would be refilled at once and refused again,
a refusal storm at CPU speed.

Telling a capacity limit from sporadic throttling. Both answer 429 (or 402 with
Retry-After); what differs is the retry. A prompt that waited and asks again is refused
again far more often than a first try when the server is full (a fresh request goes out
when a success has just freed a place; a retry lands whenever its wait ends), but about as
often when throttling is random. Each refused retry, while retries are refused at least
half the time and twice as often as first tries by more than chance gives a few dozen
answers, or three times in four where the server says Retry-After, or nine times in ten
on 32 retries where it does not, gives its slot up for good (YIELD): the window shrinks by
one and from then on grows by one per round trip only (ssthresh), settling at the
capacity. Only a slot inside the window shrinks it: one already beyond it (the window
shrank while its prompt waited) is given back and that is all, or the waiters of one
overshoot, refused one after another, would take the window far below the capacity. A
window twice what the server serves or more (successes answered over the last round trip:
Little's law, never below the server's own concurrency) is halved at a yield, once a
round trip, but never below that: a start that overshot on a loaded machine, where
refusals come back seconds late, comes down in a few round trips instead of one slot per
refusal. Random 429s, even half of all answers, never shrink it.

Answers arrive out of order (refusals at the door at once, successes a round trip
later), so shares and ratios are counted by *when the request was sent* (the answer's
time less its latency), in 50 ms bins, over the requests of about the last round trip
that have all been answered: never over the last N answers, which in slow start would
read several times the true share. A round trip in which a third or more of the requests
were throttled (with or without Retry-After) also stops slow start's fast growth (a start
against a full server would otherwise overshoot it); fast growth resumes as soon as the
retries say "not full" (refused less than three times in four), and from then on only a
clearly larger share (+0.25) stops it again, or after a few seconds without a yield.

A cap that rises again (a provider's limit halved for a while, then restored): when the
window sits in congestion avoidance more than 10% below the largest window a capacity
was found at, and nothing has been throttled for max(1 s, 3 round trips), slow start
resumes up to that window, then the window grows on by one per round trip. A cap still in
force refuses a retry every round trip or so, so this never fires there.

The outage breaker (outage.py) gates the same slots: while it is open only one probe is in
flight, and when the server answers again the window restarts from `initial_window` and
grows back (slow start) to where it was, instead of releasing 2000 requests at once.

tests/payload/generate/test_limiter_model.py checks these rules on a virtual-time model of a
provider (a cap with and without Retry-After, 402, a cap that halves and recovers,
outages, sporadic 429s); the benchmark (benchmarks/generator.py --scenarios capped, on the
independent capped servers of benchmarks/capped.py) measures them for real.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import random

from payload.generate.client import Kind, Outcome
from payload.generate.outage import Breaker

INITIAL_WINDOW = 32
# Slots added per success in slow start: the window triples every round trip (32, 96,
# 288, ...), reaching 2000 in four round trips; a start against a full server is damped.
SLOW_START_GAIN = 2.0
# Slow start stops growing fast once this share of a round trip's answers says
# "Retry-After": far above the noise of a few percent of sporadic 429s.
SLOW_START_EXIT_SHARE = 0.3
# Answers a share needs before it counts (fewer: 5% would read as 0% or 20%).
MIN_ANSWERS = 32
# Refused retries needed before they say anything about the server.
REPEAT_EVIDENCE = 8
# Standard errors by which retries must be refused more often than first tries (below
# that, the gap is what random throttling shows on a few dozen answers).
NOISE_Z = 4.0
BIN_S = 0.05  # width of a send-time bin
# A throttled prompt keeps its slot through a wait up to this; a longer Retry-After (a
# rate limit for minutes) gives the slot to prompts that may go now.
HOLD_MAX_S = 5.0
HOLD = "hold"  # the throttled prompt keeps its slot while it waits
RELEASE = "release"  # the slot was given back: the wait is too long to hold it
YIELD = "yield"  # the slot was given back for good: the server is full, the window shrank


# The counters of one send-time bin.
(SENT, ANSWERS, THROTTLED, THROTTLED_RA, FIRST, FIRST_REFUSED, REPEATS,
 REPEATS_REFUSED) = range(8)
NEWEST_S = 0.0  # requests sent this recently are not counted (0: their refusals, at the door,
#                 are back at once; the rest only makes the share read low, never high)


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
        # Shares of throttled requests among those sent in about the last round trip and
        # answered since (`share`; `share_ra`: with Retry-After), refreshed every bin;
        # `share_slow` over ~256 answers (the unlucky few of a run's tail must not read as
        # "the server refuses everything").
        self.share = 0.0
        self.share_ra = 0.0
        self.share_slow = 0.0
        self.srtt = 0.0  # smoothed latency of successful answers
        self._bins: dict[int, list[int]] = {}
        self._settled: list[int] = [0] * 8  # the counters summed over the settled bins
        self._refreshed_at = -1.0
        self.capacity_events = 0
        self._exited_at: float | None = None  # slow start's fast growth stopped (unconfirmed)
        self._yielded_at = -1e9
        self._throttled_at = -1e9  # the last throttled answer
        # Successes by the 50 ms bin they were ANSWERED in: those of the last round trip
        # are how many of ours the server serves at once (Little's law), or more (our own
        # queueing lengthens the round trip): a floor a cut never goes below.
        self._ok_bins: collections.deque[list[float]] = collections.deque()
        self._cut_at = -1e9
        self._peak = 0.0  # the largest window a capacity was found below (0: none yet)
        self._random_share = 0.0  # a share of refusals the retries showed to be random
        self._longest_wait = 0.0
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
        HOLD (wait holding the slot), RELEASE (the slot was given back: a long wait) or
        YIELD (given back for good: the window shrank). `repeat`: the prompt's previous
        request was throttled too."""
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
            self._bins.clear()
            self._settled = [0] * 8
            self._wake()
        self._count(outcome, repeat)
        if outcome.kind is Kind.OK:
            # Grow only a window that is used: prompts wait for a slot, or all are taken.
            if self._waiters or self.in_flight + self._woken >= self._allowed() - 1:
                if self.window < self.ssthresh:
                    damp = max(0.0, 1.0 - 2.0 * self.share_ra)
                    self.window += SLOW_START_GAIN * damp
                else:
                    self.window += 1.0 / self.window
                self.window = min(self.window, float(self.max_in_flight))
            return None
        if not outcome.throttled:
            return None
        now = self.breaker.clock()
        if outcome.retry_after is not None:
            self._longest_wait = max(self._longest_wait, outcome.retry_after)
        self._throttled_at = now
        if (self.window < self.ssthresh and self._exited_at is None and
                self.share > max(SLOW_START_EXIT_SHARE, self._random_share + 0.25)):
            # Told to wait by a large share of a round trip's answers: stop growing fast
            # until refused retries confirm (or not) a full server.
            self.ssthresh = self.window
            self._exited_at = now
        if repeat and self._full_server():
            # Refused again after waiting, as a full server refuses: give this slot up.
            self.capacity_events += 1
            self._yielded_at = now
            self._exited_at = None  # confirmed
            # Only a slot inside the window shrinks it: a slot already beyond it (the window
            # shrank while this prompt waited) is given back and that is all; otherwise the
            # waiters of one overshoot, refused again one after another, shrink the window
            # far below the capacity (seen at half of it on a loaded machine).
            if self.in_flight <= self._allowed():
                served = self._served(now)
                if self.window >= 2.0 * served and now - self._cut_at > max(self.srtt, BIN_S):
                    # Twice what the server serves or more (a start that overshot on a
                    # loaded machine, where refusals come back seconds late): halve, once a
                    # round trip, but never below what it serves.
                    self._cut_at = now
                    self.window = max(float(self.min_window), 0.5 * self.window,
                                      1.05 * served)
                else:
                    self._peak = max(self._peak, self.window)
                    self.window = max(float(self.min_window), self.window - 1.0)
            self.ssthresh = min(self.ssthresh, max(self.window, float(self.min_window)))
            self.in_flight -= 1
            self._wake()
            return YIELD
        wait = outcome.retry_after if outcome.retry_after is not None else 0.0
        if wait > HOLD_MAX_S:
            self.in_flight -= 1
            self._wake()
            return RELEASE
        return HOLD

    def sending(self) -> None:
        """A request is about to be sent (counted in its send-time bin)."""
        sent = int(self.breaker.clock() / BIN_S)
        row = self._bins.get(sent)
        if row is None:
            row = self._bins[sent] = [0] * 8
        row[SENT] += 1

    def _count(self, outcome: Outcome, repeat: bool) -> None:
        throttled = outcome.throttled
        self.share_slow += (float(throttled) - self.share_slow) / 256
        if outcome.kind is Kind.OK:
            self.srtt += (outcome.latency_s - self.srtt) / (8 if self.srtt else 1)
            b = self.breaker.clock() // BIN_S
            if self._ok_bins and self._ok_bins[-1][0] == b:
                self._ok_bins[-1][1] += 1
            else:
                self._ok_bins.append([b, 1.0])
                while len(self._ok_bins) > 400:  # 20 s
                    self._ok_bins.popleft()
        now = self.breaker.clock()
        sent = int((now - outcome.latency_s) / BIN_S)
        row = self._bins.get(sent)
        if row is None:
            row = self._bins[sent] = [0] * 8
        row[ANSWERS] += 1
        row[THROTTLED] += throttled
        row[THROTTLED_RA] += throttled and outcome.retry_after is not None
        if outcome.kind is Kind.OK or throttled:
            if repeat:
                row[REPEATS] += 1
                row[REPEATS_REFUSED] += throttled
            else:
                row[FIRST] += 1
                row[FIRST_REFUSED] += throttled
        if now - self._refreshed_at >= BIN_S / 2:
            self._refresh(now)

    def _refresh(self, now: float) -> None:
        """Shares: throttled among the requests sent in about the last round trip (bar the
        newest NEWEST_S): a refusal at the door is counted at once, and against what was
        sent, not against answers (a success's answer is a round trip late). Retry ratios:
        over the bins of requests sent at least 1.5 round trips ago (all answered), going
        further back until REPEAT_EVIDENCE retries, at most 10 s."""
        self._refreshed_at = now
        rtt = max(self.srtt, BIN_S)
        newest = int((now - NEWEST_S) / BIN_S)
        oldest_shares = int((now - NEWEST_S - rtt) / BIN_S)
        settled = int((now - 1.5 * rtt) / BIN_S)
        floor = int((now - 10.0) / BIN_S)
        shares = [0] * 8
        total = [0] * 8
        b = newest
        while b >= floor:
            row = self._bins.get(b)
            if row is not None:
                if b >= oldest_shares or shares[SENT] < MIN_ANSWERS:
                    for i in range(8):
                        shares[i] += row[i]
                if b <= settled:
                    for i in range(8):
                        total[i] += row[i]
            if (b <= oldest_shares and shares[SENT] >= MIN_ANSWERS and b <= settled
                    and total[REPEATS] >= REPEAT_EVIDENCE):
                break
            b -= 1
        if shares[SENT] >= MIN_ANSWERS:
            self.share = min(1.0, shares[THROTTLED] / shares[SENT])
            self.share_ra = min(1.0, shares[THROTTLED_RA] / shares[SENT])
        self._settled = total
        for old in [k for k in self._bins if k < floor]:
            del self._bins[old]
        # A stop of fast growth that no refused retry confirmed was a false alarm (sporadic
        # 429s): grow fast again.
        quiet = max(2.0, 2.0 * self._longest_wait, 4.0 * self.srtt)
        if self._exited_at is not None and now - self._yielded_at > quiet:
            if self._not_full():
                # Random throttling at this share: only a clearly larger one stops slow
                # start again.
                self._random_share = self.share
            if self._random_share or now - self._exited_at > quiet:
                self.ssthresh = float(self.max_in_flight)
                self._exited_at = None
        # A cap that rose again (a provider's limit halved, then restored): the window sits
        # below a capacity found before and nothing is throttled for a few round trips:
        # grow back to it by slow start (tripling per round trip), then on by one per
        # round trip. A cap still in force refuses a retry every round trip or so.
        calm = max(1.0, 3.0 * self.srtt)
        if (self._peak > self.window * 1.1 and self.window >= self.ssthresh
                and now - self._throttled_at > calm and now - self._yielded_at > calm):
            self.ssthresh = min(self._peak, float(self.max_in_flight))
            self._peak = 0.0

    def _served(self, now: float) -> float:
        """Successes answered over the last round trip: at least how many of ours the
        server serves at once."""
        since = (now - max(self.srtt, BIN_S)) // BIN_S
        total = 0.0
        for b, n in reversed(self._ok_bins):
            if b <= since:
                break
            total += n
        return total

    def _not_full(self) -> bool:
        """Do the retries already say the server is NOT full (refused about as often as
        first tries, under 3 in 4: a full server refuses nearly all)? Then a stop of slow
        start's fast growth on a share of refusals was random throttling: resume at once."""
        t = self._settled
        if t[REPEATS] < REPEAT_EVIDENCE:
            return False
        return t[REPEATS_REFUSED] / t[REPEATS] < 0.75

    def _full_server(self) -> bool:
        """Are retries refused as a full server refuses them: at least half the time and at
        least twice as often as first tries, or (where the server says how long to wait)
        three times in four? Judged on the retries sent recently (up to 10 s back);
        undecided (no) without REPEAT_EVIDENCE of them."""
        t = self._settled
        if t[REPEATS] < REPEAT_EVIDENCE:
            return False
        repeat_ratio = t[REPEATS_REFUSED] / t[REPEATS]
        # Against first tries, and only beyond what chance gives a few dozen answers:
        # half of all answers refused at random reads, on 10 retries and 20 first tries,
        # as 0.8 against 0.3 often enough to shrink the window for nothing. Without first
        # tries to compare with (the run's tail: every prompt has been sent) it stays
        # undecided.
        if t[FIRST] >= REPEAT_EVIDENCE:
            first_ratio = t[FIRST_REFUSED] / t[FIRST]
            pooled = (t[REPEATS_REFUSED] + t[FIRST_REFUSED]) / (t[REPEATS] + t[FIRST])
            chance = NOISE_Z * math.sqrt(pooled * (1.0 - pooled)
                                         * (1.0 / t[REPEATS] + 1.0 / t[FIRST]))
            if (repeat_ratio >= 0.5 and repeat_ratio >= 2.0 * first_ratio + 0.05
                    and repeat_ratio - first_ratio > chance):
                return True
        # A full server refuses most retries even while it also refuses first tries (an
        # overshoot). Judged only where refusals come with Retry-After (a server that says
        # "wait" about its load): random throttling without it, even at half of all
        # answers, is not taken for capacity.
        told = self.share_ra > 0 and self.share_ra >= 0.5 * self.share
        if told and repeat_ratio >= 0.75:
            return True
        # Without Retry-After: nearly every retry refused, on enough of them that random
        # throttling (even half of all answers) cannot read so (0.9 is 4.5 standard errors
        # above 0.5 on 32 retries).
        return t[REPEATS] >= 4 * REPEAT_EVIDENCE and repeat_ratio >= 0.9

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
