"""The limiter's per-answer decisions: slow start, throttled prompts and their slots,
throttle waits, the outage gate, backoff (over time: test_limiter_model.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from payload.generate.attempts import backoff_delay
from payload.generate.client import (
    Kind,
    Outcome,
)
from payload.generate.limiter import SLOW_START_GAIN, Limiter
from payload.generate.outage import Breaker
from payload.generate.slots import HOLD, RELEASE, YIELD

pytestmark = pytest.mark.timeout(30)


def test_backoff():
    assert all(0 <= backoff_delay(3, 1.0) <= 4.0 for _ in range(100))
    assert all(backoff_delay(1, 1.0, retry_after=7) >= 7 for _ in range(20))
    assert max(backoff_delay(30, 1.0) for _ in range(200)) <= 60


OK = Outcome(Kind.OK)


def throttle(retry_after: float | None = 1.0) -> Outcome:
    return Outcome(Kind.RETRY, 429, "rate_limited", retry_after=retry_after, throttled=True)


def fail() -> Outcome:
    return Outcome(Kind.RETRY, 503, "unavailable", server_failure=True)


def test_slow_start_grows_sixteenfold_per_round_trip_up_to_the_concurrency():
    """Each success adds SLOW_START_GAIN (15) slots while prompts wait for one: the window
    grows x16 every round trip (32, 512, 2000) and stops at --concurrency."""
    async def scenario() -> None:
        lim = Limiter(3000)
        answers = 0

        async def worker() -> None:
            nonlocal answers
            for _ in range(3):
                await lim.acquire()
                await asyncio.sleep(0.001)
                lim.answered(OK)
                answers += 1
                if answers <= (3000 - 32) // SLOW_START_GAIN:
                    assert lim.allowed == 32 + SLOW_START_GAIN * answers
                lim.release()

        assert SLOW_START_GAIN == 15
        assert lim.allowed == 32
        await asyncio.gather(*(worker() for _ in range(4000)))
        assert lim.allowed == 3000
    asyncio.run(scenario())


def test_throttled_prompts_hold_their_slot_unless_the_wait_is_long():
    """Capacity and sporadic throttling, over time, are checked on the model
    (test_limiter_model.py); here the per-answer decisions."""
    async def scenario() -> None:
        lim = Limiter(100)
        for _ in range(10):
            await lim.acquire()
        assert lim.answered(throttle(1.0)) == HOLD and lim.in_flight == 10  # slot kept
        assert lim.answered(throttle(60.0)) == RELEASE and lim.in_flight == 9  # too long
        assert lim.answered(throttle(None)) == HOLD
        assert lim.answered(throttle(1.0)) == HOLD  # refused again: no evidence yet, undecided
    asyncio.run(scenario())


def test_throttle_wait_honours_retry_after_else_grows_with_the_share():
    lim = Limiter(10)
    assert lim.throttle_wait(7.5, 1) == 7.5
    assert all(0.025 <= lim.throttle_wait(None, 1) <= 0.05 for _ in range(50))
    assert all(lim.throttle_wait(None, 9) <= 0.11 for _ in range(50))  # a few % throttled
    lim.evidence.share_slow = 0.99  # nearly everything is throttled: wait much longer
    assert max(lim.throttle_wait(None, 12) for _ in range(50)) > 5


def test_limiter_outage_gate_lets_one_probe_through_then_restarts_small():
    async def scenario() -> None:
        lim = Limiter(1000, breaker=Breaker(open_after=4, probe_first_s=0.05, probe_max_s=0.05))
        lim.window = lim.ssthresh = 600.0  # a window found before the outage
        for _ in range(4):
            await lim.acquire()
            lim.answered(fail())
            lim.release()
        assert lim.breaker.is_open
        waiters = [asyncio.create_task(lim.acquire()) for _ in range(50)]
        await asyncio.sleep(0.02)
        assert not any(w.done() for w in waiters)  # nobody dispatches during the outage
        await asyncio.sleep(0.1)
        probes = [w for w in waiters if w.done()]
        assert len(probes) == 1 and probes[0].result() is True  # one probe, marked as such
        lim.answered(OK, probe=True)
        lim.release()
        assert not lim.breaker.is_open and lim.allowed == 32 + SLOW_START_GAIN  # restart small...
        assert lim.ssthresh == 600  # ...growing back to where it was
        await asyncio.sleep(0)
        assert sum(w.done() for w in waiters) == 1 + lim.allowed  # the probe + the window
        lim.stop()
        await asyncio.gather(*waiters)
    asyncio.run(scenario())


def sent_with(lim: Limiter, x: int) -> int:
    """A request sent (and answered) with x of ours at the server: its stamp."""
    at_server = lim.at_server
    lim.at_server = x - 1
    stamp = lim.sending()
    lim.at_server = at_server
    return stamp


def test_a_capacity_window_follows_the_refusals_and_takes_back_holds_above_it():
    """Capped: the window is the fewest requests at the server with which the last
    refusals were sent (bar outliers: the third fewest of 32), plus 2% (at least 2). When
    the cap falls, the prompts still waiting on a kept slot that were refused with more at
    the server than the new window lose it (they queue for one when their wait ends), and
    every slot is given back exactly once. (The server accepts the requests sent below
    its cap: refusals that do not cluster above the acceptances are no cap, below.)"""
    async def scenario() -> None:
        now = [0.0]
        lim = Limiter(1000, breaker=Breaker(clock=lambda: now[0]))
        lim.window, lim.capped = 800.0, True
        for _ in range(600):
            await lim.acquire()
        accepted = Outcome(Kind.OK, latency_s=0.0)
        old = []
        for _ in range(20):  # refused with 700 at the server, accepted below: a cap of ~700
            now[0] += 0.03
            lim.answered(accepted, n_send=sent_with(lim, 650))
            old.append(lim.answered(throttle(1.0), n_send=sent_with(lim, 700)))
        # (kept slots beyond the margin's 14 were taken back as the window fell to 714)
        assert lim.allowed == 714 and all(h == HOLD for h in old)
        assert lim.in_flight == 600 - sum(h.revoked for h in old)
        new = []
        for i in range(32):  # the cap fell: refusals now come with ~400 at the server
            now[0] += 0.03
            lim.answered(accepted, n_send=sent_with(lim, 390))
            new.append(lim.answered(throttle(1.0), n_send=sent_with(lim, 400 + i % 3)))
        assert lim.allowed == 408  # 400 + 2%
        assert not any(lim.resumed(h) for h in old)  # all taken back: 700 > 408
        # The rest were kept (refused within the window) or given back (beyond it).
        assert all(d in (HOLD, YIELD) for d in new)
        # (and kept ones beyond the margin taken back as the window fell)
        revoked = sum(bool(getattr(d, "revoked", False)) for d in new)
        assert lim.in_flight == 600 - len(old) - sum(d == YIELD for d in new) - revoked
        assert all(lim.resumed(d) for d in new if d == HOLD and not d.revoked)
    asyncio.run(scenario())


def _step(lim: Limiter, sends: int, refuse: Callable[[int, int], bool]
          ) -> tuple[list[float], list[int]]:
    """Slow start's step on a clock: `sends` requests 0.1 ms apart; `refuse(i, accepted)`
    says whether the i-th is refused at the door, 2 ms after it went (the accepted ones'
    answers are a round trip away). Returns the clock and the refused ones' stamps."""
    now = [0.0]
    lim.breaker.clock = lambda: now[0]
    door = 0.002
    pending: list[tuple[float, int]] = []  # (when the refusal is read, its stamp)
    accepted, stamps = 0, []
    for i in range(1, sends + 1):
        now[0] = i * 0.0001
        while pending and pending[0][0] <= now[0]:
            _, stamp = pending.pop(0)
            lim.returned()
            lim.answered(Outcome(Kind.RETRY, 429, "rate_limited", retry_after=1.0,
                                 throttled=True, latency_s=door), n_send=stamp)
            stamps.append(stamp)
        stamp = lim.sending()
        if refuse(i, accepted):
            pending.append((now[0] + door, stamp))
        else:
            accepted += 1
    return now, stamps


def test_a_step_past_the_cap_is_read_on_its_first_refusals_at_their_fewest():
    """The step to 600 at K=500: each request that finds 500 of ours at the server is
    refused at once, the 500 before it accepted (their answers a round trip away). The
    first eight refusals, every request sent with as many at the server among them
    refused, above 500 accepted: a capacity at their fewest, 501. The step's later
    refusals (sent before the capacity was found, up to ~520 at the server) do not move
    the level."""
    lim = Limiter(2000)
    lim.window = 600.0
    now, stamps = _step(lim, 600, lambda i, accepted: accepted >= 500)
    assert lim.capped and lim.full_level == 501
    assert lim.capacity_events == 1 and len(stamps) > 8 and max(stamps) > 510
    now[0] += 0.05
    lim.answered(Outcome(Kind.OK, latency_s=0.5))  # a refresh: the level from the refusals
    # (the level from the refusals of requests sent after it was found: this step, with
    # no place() to hold them, sent them with 509-520 at the server)
    assert 501 <= lim.full_level <= 520 and lim.allowed <= 1.02 * lim.full_level + 2


def test_as_many_refusals_at_random_counts_are_not_a_capacity():
    """The same step with one request in 40 refused (random throttling refuses its share
    at every count): no capacity."""
    lim = Limiter(2000)
    lim.window = 600.0
    _, stamps = _step(lim, 600, lambda i, accepted: i % 40 == 0)
    assert len(stamps) >= 12 and not lim.capped and lim.full_level == 0


def test_random_refusals_read_out_of_send_order_are_not_a_capacity():
    """One in 20 refused at random counts, their answers read in the reverse of the order
    they were sent (a concurrent server: the client's poll returns whichever connection
    it likes): no capacity. The stamps' test reads the requests sent between the oldest
    and the newest refusal by send time; taken by read order, that span was empty, no
    request in it went unrefused, and the first eight refusals read as a cap (a real run:
    5% random 429s, a cap of 51 of 200)."""
    now = [0.0]
    lim = Limiter(2000, breaker=Breaker(clock=lambda: now[0]))
    lim.window = 600.0
    refused = []
    for i in range(1, 601):
        now[0] = i * 0.0001
        stamp = lim.sending()
        if i % 20 == 0:
            refused.append(stamp)
    now[0] += 0.002
    for stamp in reversed(refused):
        lim.returned()
        lim.answered(throttle(1.0), n_send=stamp)
    assert len(refused) == 30 and not lim.capped and lim.capacity_events == 0


def test_random_refusals_by_the_hundred_are_not_sorted_again_every_eight(monkeypatch):
    """20% refused at random, 200 in flight, 5000 requests a second: the stamps' test's
    lookback holds ~500 refusals. Sorted and scanned every 8 refusals it was 1% of such a
    run's CPU; it runs again after an eighth more (at least 8), and finds no capacity."""
    now = [0.0]
    lim = Limiter(200, breaker=Breaker(clock=lambda: now[0]))
    lim.window = 200.0
    tests: list[float] = []
    test_stamps = lim._test_stamps

    def counted(t: float) -> None:
        tests.append(t)
        test_stamps(t)

    monkeypatch.setattr(lim, "_test_stamps", counted)
    out: list[tuple[int, object]] = []
    refusals = 0
    for i in range(1, 20001):
        now[0] = i * 0.0002
        out.append((i, lim.sending()))
        if len(out) > 200:  # the oldest in flight is answered
            j, stamp = out.pop(0)
            lim.returned()
            if j % 5 == 0:
                refusals += 1
                lim.answered(throttle(1.0), n_send=stamp)  # type: ignore[arg-type]
            else:
                lim.answered(Outcome(Kind.OK, latency_s=0.04), n_send=stamp)  # type: ignore[arg-type]
    assert refusals > 3900 and not lim.capped and lim.capacity_events == 0
    assert 30 < len(tests) < refusals / 30  # (86; every 8: 495)


def test_a_capacity_whose_refusals_do_not_cluster_at_its_level_is_dropped():
    """Capped at 45 (a capacity read by chance), the refusals then come at every count,
    as random throttling's do: their fewest stamps sit under nearly every request, so the
    capacity is dropped (slow start grows the window back) instead of the window
    following their low quantile down (round 3 ratcheted it so to 3)."""
    now = [0.0]
    lim = Limiter(200, breaker=Breaker(clock=lambda: now[0]))
    lim.window, lim.capped, lim.full_level = 45.0, True, 43.0
    lim._window_before_cap = 200.0  # (where it was when the capacity was read)
    for i in range(2000):
        now[0] += 0.0005
        stamp = sent_with(lim, 1 + i % 43)
        if i % 20 == 0:
            lim.answered(throttle(1.0), n_send=stamp)
        else:
            lim.answered(Outcome(Kind.OK, latency_s=0.0), n_send=stamp)
    assert not lim.capped and lim.capacity_dropped >= 1 and lim.allowed >= 45  # as before


def test_a_level_is_lowered_on_refusals_expected_below_it_not_on_a_handful():
    """At a capacity nearly every request goes at the level (place() holds the rest), so
    few go below it: 22 below with one refused, beside 20% refused above, is what random
    throttling's 20% refuses by chance (4.4 expected), not a cluster, and the level is
    left as it is; each such chance once lowered it again (the model: a window of 6).
    Where the share above would have refused 16 or more below and under half of those
    were, the refusals cluster above it and it is lowered."""
    lim = Limiter(200)

    def judged(below: int, refused_below: int) -> bool | None:
        lim._stamped.clear()
        lim._refusals.clear()
        for i in range(1000):
            lim._stamped.append((1.0, 43))
            if i % 5 == 0:
                lim._refusals.append((1.0, 43))
        for i in range(below):
            lim._stamped.append((1.0, 30))
            if i < refused_below:
                lim._refusals.append((1.0, 30))
        return lim._refuses_at(40.0, 0.0)

    assert judged(22, 1) is None
    assert judged(200, 2) is True  # 40 expected below, 2 refused: a cap at 40
    assert judged(400, 80) is False  # as often below as above: no cap, dropped


def test_a_streams_first_token_grows_slow_start_once():
    """`began` (a stream's first data event) grows the window as a whole answer would and
    lets waiting prompts in; the same request's answer then grows it no more."""
    SLOW_START_GAIN_SLOTS = int(SLOW_START_GAIN)

    async def scenario() -> None:
        lim = Limiter(1000)
        for _ in range(32):
            await lim.acquire()
        waiting = asyncio.ensure_future(lim.acquire())
        await asyncio.sleep(0)
        assert not waiting.done()
        n = lim.sending()
        lim.began()
        assert lim.allowed == 32 + SLOW_START_GAIN
        await asyncio.wait_for(waiting, 1)  # let in without any slot released
        for _ in range(SLOW_START_GAIN_SLOTS - 1):  # the window in use again
            await lim.acquire()
        lim.answered(OK, n_send=n, grown=True)
        assert lim.allowed == 32 + SLOW_START_GAIN
        lim.answered(OK, n_send=n)
        assert lim.allowed == 32 + 2 * SLOW_START_GAIN
    asyncio.run(scenario())
