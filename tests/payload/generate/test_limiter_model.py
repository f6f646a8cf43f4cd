"""The flow-control rules, checked exactly on a virtual-time model (tests/payload/generate/limiter_sim.py):
the real Limiter and Breaker against a modelled provider, seeded, free of machine noise.

The targets are issue 12's and 13's; the benchmark measures the same scenarios with the
real payload and the real fake API (BENCHMARKS.md, "Generator").
"""

from __future__ import annotations

import pytest

from tests.payload.generate.limiter_sim import Server, simulate

pytestmark = pytest.mark.timeout(60)


SHAPES = {  # the capped servers of benchmarks/capped.py: (Server kwargs, requests bound)
    "429 with Retry-After": ({}, 1.08),
    "429 without Retry-After": ({"capacity_retry_after": None}, 1.10),
    "402 with Retry-After": ({"capacity_status": 402}, 1.08),
}


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_capacity_found_without_waste(seed, shape):
    """20k prompts, --concurrency 2000, K=500 at once, 0.5 s latency: ideal 20 s. Wall
    <= 1.15x ideal, requests <= 1.08x prompts (1.10x without Retry-After: the refused
    retry comes within 50-100 ms, not a second, so an overshoot costs more requests)."""
    kwargs, waste = SHAPES[shape]
    r = simulate(20_000, 2000, Server(latency=0.5, capacity=500, seed=seed, **kwargs),
                 seed=seed)
    assert r.done == 20_000
    assert r.wall <= 1.15 * 20, r.wall
    assert r.requests <= waste * 20_000, r.requests
    assert 490 <= r.limiter.allowed <= 560  # the window sits at the capacity
    # No probe for a higher cap in the run's last round trips: its refused prompts would
    # wait out a Retry-After after everything else is done.
    tl = r.server.timeline
    assert not any(tl[b][2] for b in tl if b >= (r.wall - 2.0) * 10)


@pytest.mark.parametrize("capacity", [60, 150, 1500])
def test_capacity_found_without_waste_whatever_the_cap(capacity):
    """The x16 slow start is not tuned to K=500: 40 K prompts at any cap (ideal 20 s) stay
    within 1.1x the ideal and 1.05x the prompts in requests."""
    n = 40 * capacity
    r = simulate(n, 2000, Server(latency=0.5, capacity=capacity, seed=1), seed=1)
    assert r.done == n
    assert r.wall <= 1.1 * 20, r.wall
    assert r.requests <= 1.05 * n, r.requests
    assert capacity <= r.limiter.allowed <= 1.05 * capacity + 2


@pytest.mark.parametrize("seed", [1, 2])
def test_a_cap_that_halves_then_recovers(seed):
    """K=500 halves to 250 from 6 s to 14 s (429 + Retry-After 1): ideal 24 s. The window
    follows it down within a second or so and back up within a few seconds of the cap's
    return (slow start back to the capacity found before), losing no id."""
    r = simulate(20_000, 2000, Server(latency=0.5, capacity=500, halved=(6, 14), seed=seed),
                 seed=seed)
    assert r.done == 20_000
    assert r.wall <= 1.15 * 24, r.wall
    assert r.requests <= 1.10 * 20_000, r.requests
    assert r.rate_after(8) >= 0.9 * 500  # at the halved cap's full rate (250 / 0.5 s)
    assert r.back_to(14, 0.9 * 1000) <= 4.0  # and back at the full one
    assert 490 <= r.limiter.allowed <= 560


def test_capacity_with_a_30s_outage_recovers_within_5s_without_a_burst():
    r = simulate(20_000, 2000, Server(latency=0.5, capacity=500, outage=(10, 40)))
    assert r.done == 20_000
    assert r.back_to(40, 0.9 * 1000) <= 5.0  # full rate is K / latency = 1000/s
    peak, arrivals = r.first_second_after(40)
    assert peak <= 1.5 * 500 and arrivals <= 1.5 * 500
    # One storm of refusals as the outage begins, then one probe at a time: the requests
    # sent stay within 10% of the prompts plus the in-flight wave the outage cut off.
    assert r.requests <= 1.10 * 20_000 + 2000
    assert r.limiter.breaker.outages == 1


def test_outage_without_capacity_grows_back_to_the_full_concurrency():
    r = simulate(20_000, 2000, Server(latency=0.5, outage=(3, 11)))
    assert r.done == 20_000 and r.limiter.allowed == 2000
    assert r.back_to(11, 0.9 * 4000) <= 5.0


@pytest.mark.parametrize(("n", "concurrency", "latency", "limit"),
                         [(20_000, 2000, 0.5, 1.6), (2000, 200, 0.2, 1.6)])
def test_sporadic_429_with_retry_after_costs_little(n, concurrency, latency, limit):
    """5% of answers 429 with Retry-After 1: the window never shrinks (the retries go
    through like anything else). What it costs is the waits themselves: the prompts keep
    their slots while they wait (~9% of the slots at 0.5 s latency), and the run's tail
    (the last prompts throttled wait a second, some twice), which at 2k prompts is half
    the fault-free wall and at 20k a third: ~1.5x in all (issue 13's target). At 20k the
    tail is the unluckiest prompt refused three or four times in a row, ~3 s whatever the
    start: the x16 slow start made both runs ~1 s faster (fault-free 6.98 -> 6.10 s,
    throttled 10.59 -> 9.51 s) and so the ratio larger (1.52 -> 1.56)."""
    base = simulate(n, concurrency, Server(latency=latency))
    r = simulate(n, concurrency, Server(latency=latency, throttle_share=0.05,
                                        throttle_retry_after=1.0))
    assert r.done == n
    assert r.limiter.capacity_events <= 5
    assert r.limiter.allowed == concurrency
    assert r.wall <= limit * base.wall, (r.wall, base.wall)


def test_half_the_answers_429_without_retry_after():
    """50% throttled without Retry-After: every id done (throttles spend no attempt), the
    window is not shrunk by random refusals, and the wall stays within 1.8x fault-free
    (two requests per prompt on average, plus short waits). Over many seeds: a few dozen
    retries now and then look like a full server by chance (before the noise test, 14 of
    20 seeds shrank the window, to as little as 67 of 200, and took up to 3.2x)."""
    base = simulate(2000, 200, Server(latency=0.2))
    walls = []
    for seed in range(1, 13):
        r = simulate(2000, 200, Server(latency=0.2, throttle_share=0.5, seed=seed), seed=seed)
        assert r.done == 2000
        assert r.limiter.capacity_events <= 2 and r.limiter.allowed >= 195, seed
        walls.append(r.wall / base.wall)
    assert sorted(walls)[len(walls) // 2] <= 1.8, walls
    assert max(walls) <= 2.2, walls


def test_slow_start_sends_a_few_dozen_before_the_first_answers():
    """Against a server that answers nothing useful, the first round trip is 32 requests,
    not 2000 (the systematic-error stop then needs only a few dozen)."""
    r = simulate(40, 2000, Server(latency=0.5))
    first = r.server.timeline
    assert sum(v[0] for k, v in first.items() if k < 4) == 32  # arrivals in the first 0.4 s


def _body_rate(r, n: int, share: float) -> float:
    """Requests the server answered per second until 0.8 x (1 - share) of the prompts were
    served, as benchmarks/generator.py --scenarios random reads its server's timeline: at
    a share s refused, serving 1 - s takes about n requests, when the last prompt is first
    asked; past that is the run's tail, prompts refused last waiting out their
    Retry-After. (Read to 90%, 20% refused sat in that tail: once a slot left to wait
    was refilled at once, the body ended sooner and seed 1 read 0.88x where it runs at
    1.0x up to the mark.)"""
    tl = r.server.timeline
    served = answered = 0
    for b in sorted(tl):
        served += tl[b][1]
        answered += tl[b][1] + tl[b][2]
        if served >= 0.8 * (1.0 - share) * n:
            return answered / ((b + 1) / 10)
    raise AssertionError("too few served")


# A server answering as fast as its CPU allows (1600 requests/s, refusals parsed too), a
# client on a quiet machine (answers read at once) or a loaded one (read at ticks up to
# 50 or 200 ms apart).
CPU_BOUND = 1 / 1600


@pytest.mark.parametrize("read_gap", [0.0, 0.05, 0.2])
@pytest.mark.parametrize("share", [0.05, 0.2])
@pytest.mark.parametrize("retry_after", [1.0, None])
def test_random_refusals_are_not_a_cap(read_gap, share, retry_after):
    """Independent random 429s (issue 33): on every seed the server answers at least 0.9x
    the requests per second it answers refusing nothing, and no capacity is kept (one
    found by chance is dropped once the refusals do not cluster at its level). Round 3
    took 20% with Retry-After 1 for a cap of 3 (seed 6 below) and kept the refused
    prompts' slots through their waits, most of the window at 20% (about half the rate);
    with the client's lag between reading an answer and the limiter hearing of it (the
    model's read ticks), its stamps' test read 5% random 429s as a cap (seed 3: 0.03x)."""
    _holds_the_clean_rate(range(1, 9), share, retry_after, read_gap=read_gap)


def _holds_the_clean_rate(seeds: range, share: float, retry_after: float | None,
                          **client: float) -> None:
    """On every seed, against the clean run of the same seed (the same ticks): 0.9x its
    rate, every prompt done, no capacity kept, the window at --concurrency."""
    n = 3000
    for seed in seeds:
        clean = _body_rate(simulate(n, 200, Server(service=CPU_BOUND, seed=seed, **client),
                                    seed=seed), n, share)
        r = simulate(n, 200, Server(service=CPU_BOUND, seed=seed, throttle_share=share,
                                    throttle_retry_after=retry_after, **client), seed=seed)
        assert r.done == n
        assert _body_rate(r, n, share) >= 0.9 * clean, (seed, _body_rate(r, n, share), clean)
        assert r.limiter.capacity_events == r.limiter.capacity_dropped, seed
        assert r.limiter.allowed == 200, seed


def test_random_refusals_round_3_took_for_a_cap():
    """The run round 3's limiter collapsed on: eight refused retries, six refused, read
    as a full server; the level from random refusals' stamps ratcheted down to 2."""
    n = 10_000
    server = Server(service=CPU_BOUND, read_gap=0.05, throttle_share=0.2,
                    throttle_retry_after=1.0, seed=6)
    clean = _body_rate(simulate(n, 200, Server(service=CPU_BOUND, read_gap=0.05, seed=6),
                                seed=6), n, 0.2)
    r = simulate(n, 200, server, seed=6)
    assert r.done == n and r.limiter.allowed == 200
    assert _body_rate(r, n, 0.2) >= 0.9 * clean


@pytest.mark.parametrize("share", [0.05, 0.2])
@pytest.mark.parametrize("retry_after", [1.0, None])
def test_random_refusals_read_out_of_send_order_are_not_a_cap(share, retry_after):
    """A concurrent server's answers reach the client out of send order (the model: each
    read up to 0.2 s late). The stamps' test took the span between the first and the last
    refusal *read* for the span they were sent in; read out of order, that span was empty,
    no request in it went unrefused, and eight random refusals were a cap (a real run:
    5% 429s read as a cap of 51 of 200; here 20% with Retry-After 1, seeds 7, 8 and 12:
    a window of 6-14, 0.2-0.3x the clean rate). Every seed now holds 0.9x and keeps no
    capacity."""
    _holds_the_clean_rate(range(1, 13), share, retry_after, shuffle=0.2)
