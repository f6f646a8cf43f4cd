"""The outage breaker: when the server as a whole fails, stop spending prompts on it.

A real outage (the server killed, a proxy down, a 5xx storm) answers every request the
same way: no connection, a timeout, or 5xx. Without a breaker each of 2000 workers
retries on its own backoff and spends its prompt's `--max-attempts` in seconds, so a
35 s outage fails hundreds of ids for good. With it:

- `OPEN_AFTER` consecutive server failures (no other answer in between) open it: dispatch
  stops for every worker, and one probe request at a time tests the server, paced from
  `PROBE_FIRST_S` up to `PROBE_MAX_S` apart (short, so the run is back within seconds of the
  server's return);
- any other answer (a success, a 4xx, a 429) closes it: the server is up;
- a failure while the breaker is open, or one that the opening of an outage follows before
  its retry, does not spend an attempt (`free_failure`): the prompt did nothing wrong;
- open longer than `--outage-timeout` stops the run (exit 3, resumable).

A sporadic 5xx does not open it: 16 in a row with nothing else between them is an outage,
not bad luck (at a 50% 5xx rate that run has odds of 1 in 65536 per answer).
"""

from __future__ import annotations

import time
from collections.abc import Callable

OPEN_AFTER = 16
PROBE_FIRST_S = 0.25
PROBE_MAX_S = 1.0


class Breaker:
    def __init__(self, *, open_after: int = OPEN_AFTER, probe_first_s: float = PROBE_FIRST_S,
                 probe_max_s: float = PROBE_MAX_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # injectable: the limiter's simulation tests run on virtual time
        self.open_after = open_after
        self.probe_first_s = probe_first_s
        self.probe_max_s = probe_max_s
        self.is_open = False
        self.opened_at = 0.0
        self.generation = 0  # +1 each time it opens: a failure followed by an opening is free
        self.outages = 0
        self.streak = 0
        self.probe_busy = False
        self.next_probe_at = 0.0
        self.closed_at = -1e9
        self._probe_gap = probe_first_s

    def record(self, server_failure: bool, *, probe: bool = False) -> str | None:
        """Feed one answer; returns "opened" or "closed" when the state changes."""
        if probe:
            self.probe_busy = False
        elif self.is_open:
            # A straggler sent before the outage: its answer says nothing about the server now
            # (an accepted request may finish after the server stopped accepting).
            return None
        if not server_failure:
            self.streak = 0
            if self.is_open:
                self.is_open = False
                self.closed_at = self.clock()
                return "closed"
            return None
        self.streak += 1
        now = self.clock()
        if self.is_open:
            if probe:  # the server is still down: wait longer before the next probe
                self.next_probe_at = now + self._probe_gap
                self._probe_gap = min(self.probe_max_s, self._probe_gap * 2)
            return None
        if self.streak >= self.open_after:
            self.is_open = True
            self.opened_at = now
            self.generation += 1
            self.outages += 1
            self._probe_gap = self.probe_first_s
            self.next_probe_at = now + self._probe_gap
            return "opened"
        return None

    def take_probe(self, now: float) -> bool:
        """While open: may this caller send the one probe now?"""
        if self.probe_busy or now < self.next_probe_at:
            return False
        self.probe_busy = True
        return True

    def open_for(self, now: float | None = None) -> float:
        """Seconds the current outage has lasted (0 when closed)."""
        if not self.is_open:
            return 0.0
        return (self.clock() if now is None else now) - self.opened_at

    def free_failure(self, generation_at_failure: int, was_open: bool) -> bool:
        """Does a server failure cost its prompt an attempt? Not if the breaker was open when
        it happened, or an outage was declared before the prompt's retry."""
        return was_open or self.is_open or self.generation != generation_at_failure
