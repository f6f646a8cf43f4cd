"""What throttled answers say about the server, counted by when each request was SENT.

Answers arrive out of order (refusals at the door at once, successes a round trip later),
so shares and ratios are counted by send time (the answer's time less its latency), in
50 ms bins, over the requests of about the last round trip that have all been answered:
never over the last N answers, which in slow start would read several times the true
share. Two readings come out of the bins: the shares of throttled requests (all, and
those with Retry-After), and whether retries are refused as a full server refuses them
(far more often than first tries) or as random throttling does (about as often): the
limiter (limiter.py) turns them into slow start's stop and the capacity's discovery.
"""

from __future__ import annotations

import math

from payload.generate.client import Kind, Outcome

# Answers a share needs before it counts (fewer: 5% would read as 0% or 20%).
MIN_ANSWERS = 32
# Refused retries needed before they say anything about the server.
REPEAT_EVIDENCE = 8
# Standard errors by which retries must be refused more often than first tries (below
# that, the gap is what random throttling shows on a few dozen answers).
NOISE_Z = 4.0
BIN_S = 0.05  # width of a send-time bin
# A bin's retry ratios count once this share of its requests are answered (an answer is
# counted in the bin of its send time as the client measured it, which can be the next).
SETTLED_SHARE = 0.9

# The counters of one send-time bin.
(SENT, ANSWERS, THROTTLED, THROTTLED_RA, FIRST, FIRST_REFUSED, REPEATS,
 REPEATS_REFUSED) = range(8)


class Evidence:
    """The send-time bins of the last 10 s and what they say."""

    def __init__(self) -> None:
        # Shares of throttled requests among those sent in about the last round trip and
        # answered since (`share`; `share_ra`: with Retry-After), refreshed every bin;
        # `share_slow` over ~256 answers (the unlucky few of a run's tail must not read as
        # "the server refuses everything").
        self.share = 0.0
        self.share_ra = 0.0
        self.share_slow = 0.0
        self._bins: dict[int, list[int]] = {}
        self.settled: list[int] = [0] * 8  # the counters summed over the settled bins

    def reset(self) -> None:
        """Forget everything (back from an outage: the server is another one now)."""
        self.share = self.share_ra = self.share_slow = 0.0
        self._bins.clear()
        self.settled = [0] * 8

    def _row(self, t: float) -> list[int]:
        b = int(t / BIN_S)
        row = self._bins.get(b)
        if row is None:
            row = self._bins[b] = [0] * 8
        return row

    def sent(self, now: float) -> None:
        """A request goes out now."""
        self._row(now)[SENT] += 1

    def count(self, outcome: Outcome, repeat: bool, now: float) -> None:
        """One answer, in the bin of when its request was sent. `repeat`: the prompt's
        previous request was throttled too."""
        throttled = outcome.throttled
        self.share_slow += (float(throttled) - self.share_slow) / 256
        row = self._row(now - outcome.latency_s)
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

    def refresh(self, now: float, rtt: float) -> None:
        """Shares: throttled among the requests sent in about the last round trip (`rtt`): a
        refusal at the door is counted at once, and against what was sent, not against
        answers (a success's answer is a round trip late). Retry ratios: over the bins of
        requests sent at least 1.5 round trips ago and answered, going further back until
        REPEAT_EVIDENCE retries, at most 10 s."""
        newest = int(now / BIN_S)
        oldest_shares = int((now - rtt) / BIN_S)
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
                # (a bin counts once its requests are answered: on a loaded machine the
                # successes are read late, its refusals at once, and a bin read early
                # would say retries are refused far more often than they are)
                if b <= settled and row[ANSWERS] >= SETTLED_SHARE * row[SENT]:
                    for i in range(8):
                        total[i] += row[i]
            if (b <= oldest_shares and shares[SENT] >= MIN_ANSWERS and b <= settled
                    and total[REPEATS] >= REPEAT_EVIDENCE):
                break
            b -= 1
        if shares[SENT] >= MIN_ANSWERS:
            self.share = min(1.0, shares[THROTTLED] / shares[SENT])
            self.share_ra = min(1.0, shares[THROTTLED_RA] / shares[SENT])
        self.settled = total
        for old in [k for k in self._bins if k < floor]:
            del self._bins[old]

    def not_full(self) -> bool:
        """Do the retries already say the server is NOT full (refused under 3 in 4: a full
        server refuses nearly all)? Then a stop of slow
        start's fast growth on a share of refusals was random throttling: resume at once."""
        t = self.settled
        if t[REPEATS] < REPEAT_EVIDENCE:
            return False
        return t[REPEATS_REFUSED] / t[REPEATS] < 0.75

    def full_server(self) -> bool:
        """Are retries refused as a full server refuses them: at least half the time and at
        least twice as often as first tries, or (where the server says how long to wait)
        three times in four? Judged on the retries sent recently (up to 10 s back);
        undecided (no) without REPEAT_EVIDENCE of them."""
        t = self.settled
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
