"""The outage breaker: a run of server failures opens it, only a probe closes it."""

from __future__ import annotations

import time

import pytest

from payload.generate.outage import Breaker

pytestmark = pytest.mark.timeout(30)


def test_breaker_opens_on_a_run_of_server_failures_and_only_a_probe_closes_it():
    b = Breaker(open_after=4, probe_first_s=0.0)
    assert [b.record(True) for _ in range(3)] == [None] * 3
    assert b.record(False) is None and b.streak == 0  # anything else breaks the run
    events = [b.record(True) for _ in range(4)]
    assert events[-1] == "opened" and b.is_open and b.generation == 1
    assert b.record(False) is None and b.is_open  # a straggler's success proves nothing
    now = time.monotonic()
    assert b.take_probe(now) and not b.take_probe(now)  # one probe at a time
    assert b.record(True, probe=True) is None and b.is_open  # still down
    assert b.next_probe_at > now
    assert b.take_probe(b.next_probe_at)
    assert b.record(False, probe=True) == "closed" and not b.is_open
    # A failure before an outage was declared is free if one was declared before its retry.
    assert b.free_failure(0, was_open=False) and not b.free_failure(1, was_open=False)
