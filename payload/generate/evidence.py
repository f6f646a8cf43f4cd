"""What throttled answers say about the server, counted by when each request was SENT.

Answers arrive out of order (refusals at the door at once, successes a round trip later),
so shares are counted by send time (the answer's time less its latency), in 50 ms bins,
over the requests of about the last round trip: never over the last N answers, which in
slow start would read several times the true share. The shares damp slow start's growth
and set the wait of a refusal without Retry-After (limiter.py); they never shrink the
window: a share says nothing of whether the refusals are a cap or random (round 3 also
read refused retries here as a full server; eight retries, six refused, read so by chance
at 20% random 429s, and the limiter took random throttling for a cap of 3).
"""

from __future__ import annotations

from payload.generate.client import Outcome

# Answers a share needs before it counts (fewer: 5% would read as 0% or 20%).
MIN_ANSWERS = 32
BIN_S = 0.05  # width of a send-time bin

# The counters of one send-time bin.
SENT, ANSWERS, THROTTLED, THROTTLED_RA = range(4)


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

    def reset(self) -> None:
        """Forget everything (back from an outage: the server is another one now)."""
        self.share = self.share_ra = self.share_slow = 0.0
        self._bins.clear()

    def _row(self, t: float) -> list[int]:
        b = int(t / BIN_S)
        row = self._bins.get(b)
        if row is None:
            row = self._bins[b] = [0] * 4
        return row

    def sent(self, now: float) -> None:
        """A request goes out now."""
        self._row(now)[SENT] += 1

    def count(self, outcome: Outcome, now: float) -> None:
        """One answer, in the bin of when its request was sent."""
        throttled = outcome.throttled
        self.share_slow += (float(throttled) - self.share_slow) / 256
        row = self._row(now - outcome.latency_s)
        row[ANSWERS] += 1
        row[THROTTLED] += throttled
        row[THROTTLED_RA] += throttled and outcome.retry_after is not None

    def refresh(self, now: float, rtt: float) -> None:
        """Shares: throttled among the requests sent in about the last round trip (`rtt`),
        going further back until MIN_ANSWERS requests, at most 10 s: a refusal at the door
        is counted at once, and against what was sent, not against answers (a success's
        answer is a round trip late)."""
        newest = int(now / BIN_S)
        oldest = int((now - rtt) / BIN_S)
        floor = int((now - 10.0) / BIN_S)
        shares = [0] * 4
        b = newest
        while b >= floor and (b >= oldest or shares[SENT] < MIN_ANSWERS):
            row = self._bins.get(b)
            if row is not None:
                for i in range(4):
                    shares[i] += row[i]
            b -= 1
        if shares[SENT] >= MIN_ANSWERS:
            self.share = min(1.0, shares[THROTTLED] / shares[SENT])
            self.share_ra = min(1.0, shares[THROTTLED_RA] / shares[SENT])
        for old in [k for k in self._bins if k < floor]:
            del self._bins[old]
