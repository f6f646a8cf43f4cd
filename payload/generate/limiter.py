"""How many requests may be in flight: slow start, capacity, throttling, outages
(docs/generator.md, "Throttling" and "Capacity", tells the same for users).

Slow start: the window starts small (`initial_window`, tens) and grows by fifteen per
success (x16 every round trip: 32, 512, 2000) up to `--concurrency`; a stream's success is
its first data event (`began`), its round trip the first-token time. So a run whose every
answer is an error has sent a few dozen requests before it stops, and one whose first
answers are fine is at a cap of hundreds after one round trip. A window nobody fills does
not grow.

Throttling (429, or 402 with Retry-After) spends no attempt: the prompt waits as told.
It keeps its *slot* through the wait (up to HOLD_MAX_S; a `Hold`) only at a capacity or
in slow start, where a refusal may be a full server and a refilled slot would be refused
at once, over and over; with the window at `--concurrency` and no capacity found, the
refusal says nothing of the server's load and the slot is given back (at 20% refused with
Retry-After 1 on a fast server, kept slots were most of the window). The run starts spare
workers for the prompts that then wait in its queue (run.py).

Capacity, in two sentences: a capacity is read only where refusals cluster at the top of
the in-flight stamps (`_test_stamps`: every request sent with at least L of ours at the
server refused, the many sent with fewer accepted), and it holds only while they still do
(`_refuses_at`: requests sent below its level refused under half as often as those above;
where they are refused as often, on ample evidence, it is dropped, the window back to
where it was, and slow start resumes); random
throttling refuses its share at every count, so at any share it never shrinks the window.
The window is then the level plus a probe margin, re-read from the refusals every 25 ms
while the server refuses (lowered only where that test says the refusals cluster at the
new level, left as is while too few requests say either way), and grows again (probes)
when nothing has been refused for a while.

The stamps. Each request is stamped with how many of ours were at the server when it went
out (`sending`; prompts waiting out a throttle are not at the server). A server that
refuses at its cap K held K when it refused, all ours, so a refusal's stamp is at least K
(more only by answers written but still unread here, or by refusals still on their way);
acceptances say less. A stamp carries its send time (`Stamp.at`): the answer's time less
its latency is later than that on a busy machine, whose loop reaches `answered` late, and
so read, 5% random refusals sat at the top of the requests "sent" around them and the
stamps' test read a cap of 43 (issue 33's real run; then the ratchet below took it to 1). The level is a low quantile of the last 32 refusals' stamps. The
stamps' test reads slow start's step past a cap on its first dozen refusals (random
throttling orders its refusals so only by a chance of 1e-8).

At a capacity: the window is the level plus a margin (2%, at least 2 slots): a cap that
falls is followed within a fraction of a second, and kept slots of prompts refused above
the new window are taken back (`Hold.revoked`). Every request then waits on our side for a
free place at the server (slots.py `place`, at `_place_limit`): the margin's prompts wait
here instead of being refused, and nothing is left refused at the run's end. A cap that
rises: nothing refused for 1.5 times the longest wait (at least 0.5 s) with the window
full means the margin's prompts got in: the window probes (+0.5 per success, x1.5 per
round trip, nobody waiting for a place) until the first refusal, whose stamp is the new
level. Not in the run's last round trips (`left`, from the run): the prompts a probe gets
refused would wait out their Retry-After after everything else is done.

Why one detector (round 4, issue 33): round 3 also read a capacity from refused retries
(evidence.py) and from a delivery rate that stopped growing, each with its own exceptions
for random throttling. On a fast server with 20% random 429s (Retry-After 1) eight
retries, six refused, read as a full server by chance; the level then came from
refusals' stamps that random throttling spreads over every count, and each refresh took a
low quantile of them: a ratchet down to a window of 2-5 (the model shows it; the real run
of the issue made 48 requests/s where the clean one made 440). Neither reading is needed
where the stamps can see a cap, and neither can be trusted where they cannot. The level
is now lowered only where the refusals cluster at it (`_refuses_at`), which random
refusals, spread over every count, never do.

The outage breaker (outage.py) gates the same slots: one probe in flight while it is open;
when the server is back the window restarts from `initial_window` and grows back.

tests/payload/generate/test_limiter_model.py checks these rules on a virtual-time model of
a provider; benchmarks/generator.py --scenarios capped (the independent servers of
benchmarks/capped.py) measures them for real.
"""

from __future__ import annotations

import collections
import itertools
import random
from collections.abc import Callable

from payload.generate.client import Kind, Outcome
from payload.generate.evidence import BIN_S, Evidence
from payload.generate.outage import Breaker
from payload.generate.slots import HOLD, HOLD_MAX_S, RELEASE, YIELD, Hold, Slots

INITIAL_WINDOW = 32
# Slots added per success in slow start: the window grows x16 every round trip (32, 512,
# 2000), at a cap of a few hundred a round trip sooner than tripling (32, 96, 288, 864);
# a step past the cap is read on its first refusals (`_test_stamps`, (2)), so it costs
# about the step's excess once; a start against a full server is damped.
SLOW_START_GAIN = 15.0

# The capacity estimate (see the module docstring, "Capacity").
FULL_SAMPLES = 32  # the level: the third fewest of the last this many refusals...
FULL_MIN = 4  # ...(at least this many)...
FULL_HORIZON_S = 2.0  # ...answered within max(this, two round trips)
PROBE_SHARE = 0.02  # the window sits this far above the level (at least PROBE_MIN slots)
PROBE_MIN = 2.0
CALM_S = 0.5  # the least time without a refusal that says the cap rose
PROBE_GAIN = 0.5  # slots added per success while probing (x1.5 per round trip)...
PROBE_STEP = 0.05  # ...but at most this share of the window per 25 ms
# The stamps' test (`_test_stamps`): of the requests sent lately with at least the median
# stamp of the refusals among them, this share refused, on at least STAMP_MIN refusals.
STAMP_SHARE = 0.95
STAMP_MIN = 32
# ...or (a step past the cap) at least TOP_MIN refusals, this share of the requests sent
# among them with at least their fewest stamp refused, above TOP_BELOW accepted ones.
TOP_MIN = 8
TOP_SHARE = 0.9
TOP_BELOW = 32
ROUND_MIN_S = 0.5  # "lately": the last max(this, two round trips)
# A capacity holds while the requests sent lately with fewer than its level at the server
# were refused under this share of the rate of those sent with more (a cap refuses none
# below, random throttling its share at every count), judged on LEVEL_EVIDENCE each side.
LEVEL_SHARE = 0.5
LEVEL_EVIDENCE = 16


class Stamp(int):
    """What `sending` returns: how many of ours were at the server with the request, and
    (`at`) when it went. The answer's time less its latency is not the send time on a
    busy machine (the loop reaches `answered` late); read so, random refusals sat at the
    top of the stamps of the requests "sent" around them, and the stamps' test took 5%
    random 429s for a cap of 43."""

    at: float


class Limiter(Slots):
    """The window of the slot gate (slots.py), moved by what the answers say."""

    def __init__(self, max_in_flight: int, *, initial_window: int = INITIAL_WINDOW,
                 min_window: int = 1, breaker: Breaker | None = None,
                 left: Callable[[], int | None] | None = None) -> None:
        super().__init__(max_in_flight, initial_window=initial_window,
                         min_window=min_window, breaker=breaker)
        self.ssthresh = float(max_in_flight)  # slow start below it, +1 per round trip above
        # A capacity was found: the window follows the accepted level (below) instead of
        # growing with successes, until the server stops refusing (the cap rose).
        self.capped = False
        self.probing = False  # capped, and nothing refused for a while: growing to find out
        self._probe_limit = 0.0  # how far probing may grow the window until the next refresh
        self.full_level = 0.0  # requests at the server when it refused: what it holds
        # What the answers say, counted by when each request was sent (evidence.py).
        self.evidence = Evidence()
        self._refreshed_at = -1.0
        self.capacity_events = 0  # times a capacity was found (the window set to it)
        self.capacity_dropped = 0  # times a capacity was found not to be one (dropped)
        self._capped_at = -1e9
        self._throttled_at = -1e9  # the last throttled answer
        self._ok_since_throttle = 0  # successes answered since
        self._unused_at = -1e9  # the last success answered with the window not full
        # (sent at, requests at the server then) of the last refusals: the level reads the
        # newest FULL_SAMPLES, the stamps' test those of about the last round trip.
        self._refused: collections.deque[tuple[float, int]] = collections.deque(maxlen=4096)
        # Before a capacity is found: the same of the requests sent lately (stamps' test).
        self._sends: collections.deque[tuple[float, int]] = collections.deque()
        self._stamps_new = 0  # refusals since the stamps were last tested...
        self._stamps_due = TOP_MIN  # ...and how many call for the next test
        self._stamps_at = -1.0
        # (sent at, requests at the server then) of every request sent lately, and of
        # every refusal, capped or not: do the refusals still cluster at the level
        # (`_refuses_at`)?
        self._stamped: collections.deque[tuple[float, int]] = collections.deque(maxlen=8192)
        self._refusals: collections.deque[tuple[float, int]] = collections.deque(maxlen=8192)
        self._window_before_cap = 0.0
        self._longest_wait = 0.0
        self._wait_hi = (0.0, -1e9)  # (the longest recent throttle wait, when)
        self._pre_outage_window = float(max_in_flight)
        # Throttled prompts waiting on a kept slot, by id (every Hold equals "hold").
        self._holds: dict[int, Hold] = {}
        # Prompts not yet answered, where the run knows: no probe for a higher cap in the
        # run's last round trips (`_probe_pays`).
        self._left = left or (lambda: None)

    @property
    def found_capacity(self) -> int | None:
        """The capacity found (requests the server holds), None while none is."""
        return round(self.full_level) if self.capped else None

    # -- feedback ------------------------------------------------------------------------------
    def sending(self) -> Stamp:
        """A request is about to be sent (counted in its send-time bin and among the requests
        at the server). Returns how many are at the server with it: pass it to `answered`;
        call `returned` once its answer is in (or it was cancelled)."""
        self.at_server += 1
        now = self.breaker.clock()
        self.evidence.sent(now)
        if not self.capped:
            sends = self._sends
            sends.append((now, self.at_server))
            while sends[0][0] < now - max(ROUND_MIN_S, 2.0 * self.srtt):
                sends.popleft()
        stamp = Stamp(self.at_server)
        stamp.at = now
        self._stamped.append((now, stamp))
        return stamp

    def began(self) -> None:
        """A streamed answer began (its first data event): the server took the request, so
        the window grows now as on a whole answer (pass `grown` to `answered` then). Streams
        of minutes each would otherwise hold slow start for two answer lengths."""
        self._grow()
        self._wake()  # no slot is released here: the waiters the growth let in go now

    def _grow(self) -> None:
        """One success's growth. Grow only a window that is used: prompts wait for a slot,
        or all are taken."""
        if (not self.capped or self.probing) and (
                self._waiters or self.in_flight + self._woken >= self._allowed() - 1):
            if self.probing:  # capped, but nothing refused for a while: the cap rose?
                # x1.5 per round trip until a refusal, at most PROBE_STEP per 25 ms:
                # answers that come back together must not send a wave past the cap
                # before the first refusal is read
                self.window = min(self.window + PROBE_GAIN, self._probe_limit)
            elif self.window < self.ssthresh:
                damp = max(0.0, 1.0 - 2.0 * self.evidence.share_ra)
                self.window += SLOW_START_GAIN * damp
            else:
                self.window += 1.0 / self.window
            self.window = min(self.window, float(self.max_in_flight))

    def answered(self, outcome: Outcome, *, probe: bool = False,
                 n_send: int | None = None, grown: bool = False) -> str | None:
        """Learn from one answer (the slot is still held). For a throttled answer, returns
        HOLD (wait holding the slot), RELEASE (the slot was given back: a long wait) or
        YIELD (given back: the slot is beyond the window). `n_send`: what `sending` returned
        for this request; `grown`: `began` grew the window for it already. Whether the
        prompt was refused before is not asked: refused retries said "full server" by
        chance (the module's docstring)."""
        event = self.breaker.record(outcome.server_failure, probe=probe)
        if event == "opened":
            # Flapping (down again within seconds of coming back) keeps the window from before.
            if self.breaker.clock() - self.breaker.closed_at > 10.0:
                # Where to grow back to: the capacity found before, else (still in slow start)
                # as far as before, then on by slow start up to --concurrency.
                before = self.window if self.capped else min(self.ssthresh,
                                                             float(self.max_in_flight))
                self._pre_outage_window = max(before, float(self.initial_window))
        elif event == "closed":
            # Back from an outage: restart small and grow back to where we were.
            self.ssthresh = self._pre_outage_window
            self.window = float(self.initial_window)
            self.capped = self.probing = False
            self._refused.clear()
            self._sends.clear()
            self._stamped.clear()
            self._refusals.clear()
            self.evidence.reset()
            self._wake()
        now = self.breaker.clock()
        self._count(outcome, now)
        sent_at = getattr(n_send, "at", now - outcome.latency_s)
        if n_send is not None and outcome.throttled:
            self._refusals.append((sent_at, n_send))
        if outcome.kind is Kind.OK:
            self._ok_since_throttle += 1
            if not self._waiters and self.in_flight + self._woken < self._allowed() - 1:
                self._unused_at = now  # a refusal-free while here says nothing of the cap
            if not grown:
                self._grow()
            return None
        if not outcome.throttled:
            return None
        if outcome.retry_after is not None:
            self._longest_wait = max(self._longest_wait, outcome.retry_after)
        self._throttled_at = now
        self._ok_since_throttle = 0
        # (a refusal of a request sent before the capacity was found tells of the step that
        # found it, its stamps rising past K as a burst went out, not of the level)
        if n_send is not None and (not self.capped or sent_at >= self._capped_at):
            self._refused.append((sent_at, n_send))
            self._stamps_new += not self.capped
        if self.probing:
            # The probe found the cap: at most as many as were at the server when it refused.
            self.probing = False
            if n_send is not None:
                self.window = max(float(self.min_window), min(self.window, float(n_send)))
                self.full_level = float(n_send)  # where `place` lets requests go, until
                # the refusals at the new cap say more
        if (not self.capped and self._stamps_new >= self._stamps_due
                and now - self._stamps_at >= 0.005):
            self._test_stamps(now)
        if self.in_flight > self._allowed():
            # Beyond the window (it shrank while this prompt waited, or a start overshot):
            # give the slot back; the prompt waits without it and queues for one.
            self.in_flight -= 1
            self._wake()
            return YIELD
        wait = outcome.retry_after if outcome.retry_after is not None else 0.0
        if wait > HOLD_MAX_S or not (self.capped or self.window < self.max_in_flight):
            # (a window at --concurrency and no capacity found: the refusal says nothing
            # of the server's load, and a slot kept through the wait is one request fewer
            # at the server; at 20% refused with Retry-After 1 on a fast server the waits
            # would hold most of the slots. Below it, slow start may just have stepped
            # past a cap: refilled slots would be refused at once, over and over.)
            self.in_flight -= 1
            self._wake()
            return RELEASE
        hold = Hold(HOLD)
        hold.n_send, hold.revoked = n_send, False
        self._holds[id(hold)] = hold
        return hold

    def resumed(self, decision: str | None) -> bool:
        """A kept slot's wait is over (or cut short): True if the prompt still holds it,
        False if the limiter took it back (the prompt queues for a slot with `acquire`)."""
        if not isinstance(decision, Hold):
            return decision == HOLD
        self._holds.pop(id(decision), None)
        return not decision.revoked

    def _revoke(self, margin: float) -> None:
        """The window fell: take back the kept slots of prompts refused with more at the
        server than it now allows, and beyond `margin` of them (those refused with the
        most at the server first): holders beyond the probe margin leave the server
        under-used until their waits end (see Hold)."""
        holds = sorted((h for h in self._holds.values() if h.n_send is not None),
                       key=lambda h: h.n_send or 0, reverse=True)
        keep = int(margin)
        over = [h for i, h in enumerate(holds)
                if (h.n_send or 0) > self.window or len(holds) - i > keep]
        for h in over:
            h.revoked = True
            del self._holds[id(h)]
            self.in_flight -= 1
        if over:
            self._wake()

    def _count(self, outcome: Outcome, now: float) -> None:
        if outcome.kind is Kind.OK:
            self.srtt += (outcome.latency_s - self.srtt) / (8 if self.srtt else 1)
        self.evidence.count(outcome, now)
        # Every 25 ms, or every 1/20 of a round trip where that is longer (a walk back over
        # a round trip of bins, up to 0.25 s apart: seconds-long answers, thousands of them
        # a second, would otherwise spend a few percent of a core here).
        if now - self._refreshed_at >= max(BIN_S / 2, min(0.25, self.srtt / 20)):
            self._refresh(now)

    def _refresh(self, now: float) -> None:
        """The shares (Evidence.refresh), then the capacity's window."""
        self._refreshed_at = now
        self._probe_limit = self.window + max(PROBE_MIN, PROBE_STEP * self.window)
        self.evidence.refresh(now, max(self.srtt, BIN_S))
        if self.capped:
            self._follow(now)

    def _place_limit(self) -> float:
        """Once a capacity is found (and not while probing for a cap that rose): a request
        goes when it would be sent with fewer than the full level at the server."""
        # (at least one request at a time, whatever a level read on a few refusals says)
        return max(2.0, self.full_level) if self.capped and not self.probing else float("inf")

    def _found_capacity(self, now: float, level: float | None = None) -> None:
        """From now on the window follows the level the server refuses at (`level`: the
        stamps' test's)."""
        self._window_before_cap = self.window
        self.capped = True
        self.capacity_events += 1
        self._capped_at = now
        self._sends.clear()
        self._stamps_new = 0
        if level is None:
            self._set_to_level(now)
        else:
            self._refused.clear()  # refusals sent before now say nothing more of the level
            self._to_level(level)

    def _test_stamps(self, now: float) -> None:
        """A cap refuses every request sent with K or more of ours at it (more than K by
        answers still unread here), random throttling its share at every count. Two reads:
        (1) of the requests sent since the oldest recent refusal with at least the
        refusals' median stamp, STAMP_SHARE refused, on STAMP_MIN refusals or more; (2) a
        step past the cap, read on its first few refusals (slow start's step to 512 at
        K=500 is refused 12 times): TOP_MIN refusals or more, every request sent since the
        oldest and until the newest with at least their fewest at the server refused
        (TOP_SHARE), and TOP_BELOW requests sent with fewer, none refused. Random
        throttling orders its refusals by chance: that all of them sit above every accepted
        request among TOP_BELOW is below one in C(TOP_BELOW + TOP_MIN, TOP_MIN), about
        1e-8. Either is a capacity: (1) at the refusals' low quantile, (2) at their fewest.
        Refusals that come late read a low share here (their requests still out): the
        retries decide."""
        horizon = now - max(ROUND_MIN_S, 2.0 * self.srtt)
        recent = list(itertools.takewhile(lambda r: r[0] >= horizon, reversed(self._refused)))
        # Tested again after an eighth more refusals (at least TOP_MIN): a step past a cap
        # is read on its first few, and random throttling's hundreds a round trip are not
        # sorted and scanned again every 8 (1% of a run's CPU at 20% refused).
        self._stamps_new, self._stamps_due = 0, max(TOP_MIN, len(recent) // 8)
        self._stamps_at = now
        if len(recent) < TOP_MIN:
            return
        xs = sorted(x for _, x in recent)
        # (the oldest and newest by send time: answers are read out of send order, and
        # the first and last read once bounded an empty span, where no request went
        # unrefused: 8 random refusals at 5% read as a cap, at 51 of 200 in a real run)
        since = min(t for t, _ in recent) - 0.002  # (a latency read a little short)
        newest = max(t for t, _ in recent)
        level = float(xs[len(xs) // 16])
        # (both scans newest first, ending as soon as the answer is known: random
        # throttling fails them within a few dozen sends, where the whole lookback is
        # thousands, and this runs every 8 refusals or more)
        if len(recent) >= STAMP_MIN:
            band = xs[len(xs) // 2]
            most = sum(1 for x in xs if x >= band) / STAMP_SHARE  # sent with >= band
            sent = 0
            for t, x in reversed(self._sends):
                if t < since or sent > most:
                    break
                sent += x >= band
            if sent <= most:
                self._found_capacity(now, level)
                return
        band = xs[0]
        most = len(recent) / TOP_SHARE  # sent with >= band between the refusals
        top = below = 0
        for t, x in reversed(self._sends):
            if t > newest:  # (sent after the newest refusal: maybe refused, unread)
                continue
            if x < band:
                below += 1
                if below >= TOP_BELOW and t < since:
                    break  # (every send between the refusals counted)
            elif t >= since:
                top += 1
                if top > most:
                    return
        if below >= TOP_BELOW:
            self._found_capacity(now, float(band))

    def _follow(self, now: float) -> None:
        """Capped: the window is the full level (the fewest requests at the server with
        which the last refusals were sent, bar outliers) plus the probe margin. When
        nothing has been refused for longer than a throttled prompt waits, over half a
        window of successes and with the window full, the cap rose: probe (x1.5 per round
        trip) until a refusal."""
        wait_hi, wait_at = self._wait_hi
        wait = wait_hi if now - wait_at < 10.0 else 0.0
        calm = max(CALM_S, 1.5 * wait)
        if now - self._throttled_at > calm:
            if (not self.probing and self._ok_since_throttle >= self.window / 2
                    and now - self._unused_at > calm and self._probe_pays(wait)):
                self.probing = True
                self._probe_limit = self.window + max(PROBE_MIN, PROBE_STEP * self.window)
                self._refused.clear()  # what the old cap refused says nothing of the new
            return  # a window nobody is refused at (the run's tail) is left as it is
        if not self.probing:
            self._set_to_level(now)

    def _probe_pays(self, wait: float) -> bool:
        """Is there work enough left for a probe to pay? The prompts it gets refused wait
        `wait` (the server's Retry-After) and then a round trip: near the run's end that
        is the run's tail, for a larger window that has nothing left to send."""
        left = self._left()
        if left is None:
            return True
        rtt = max(self.srtt, BIN_S)
        return left > self.window * (3.0 + wait / rtt)

    def _set_to_level(self, now: float) -> None:
        """The window to the full level (of the last FULL_SAMPLES refusals sent lately)
        plus the probe margin."""
        since = now - max(FULL_HORIZON_S, 2.0 * self.srtt)
        newest = itertools.islice(reversed(self._refused), FULL_SAMPLES)
        xs = sorted(x for t, x in newest if t >= since)
        if len(xs) < FULL_MIN:
            return
        # A low quantile: every refusal was sent with at least K at the server, more when
        # answers the server has written sat unread on a busy machine (they are counted
        # until read); the fewest is the nearest to K.
        level = float(xs[len(xs) // 16])
        verdict = self._refuses_at(level, since)
        if verdict:
            self._to_level(level)
        elif verdict is not None:
            self._drop_capacity()

    def _refuses_at(self, level: float, since: float) -> bool | None:
        """Do the refusals still cluster at `level`: of the requests sent since `since`,
        were those sent with fewer than `level` of ours at the server refused at most
        half as often as those sent with more? A cap refuses next to none below its level
        (a refusal's stamp is at least K), and many requests go below it; random
        throttling refuses its share at every count. Requests not yet answered count as
        not refused on both sides. Lowered only where the share above would have refused
        LEVEL_EVIDENCE below: at a capacity place() sends nearly everything at the level,
        and one refused of 22 below beside 20% above is random throttling's chance. (Not "acceptances never reach the level": refusals
        still at the door count among ours, so an accepted request's stamp can sit above
        K.) None (undecided: the window stays as it is, neither lowered nor dropped) on
        fewer than LEVEL_EVIDENCE requests sent on either side: just after a cap fell,
        few have gone below its new level yet."""
        above = below = refused_above = refused_below = 0
        for t, x in reversed(self._stamped):
            if t < since:
                break
            if x >= level:
                above += 1
            else:
                below += 1
        for t, x in reversed(self._refusals):
            if t < since:
                break
            if x >= level:
                refused_above += 1
            else:
                refused_below += 1
        if above < LEVEL_EVIDENCE or below < LEVEL_EVIDENCE or not refused_above:
            return None
        # (what the refused share above would refuse below: random throttling's share
        # falls under half of it by chance on a few expected refusals, and each such
        # chance lowered the level again, a ratchet down to a window of 6 in the model)
        expected_below = below * refused_above / above
        ratio = refused_below / expected_below
        if ratio < LEVEL_SHARE and expected_below >= LEVEL_EVIDENCE:
            return True
        # Dropped only where the refusals do not sit higher at all, on four times the
        # evidence: on a loaded client a cap's stamps spread with its unread answers (a
        # refusal sent "with 550" may have found 500), which blurs the cluster but does
        # not flatten it; random throttling's is flat.
        if ratio >= 1.0 and min(above, below) >= 4 * LEVEL_EVIDENCE:
            return False
        return None

    def _drop_capacity(self) -> None:
        """The refusals were not a cap (they do not cluster at its level): the window as
        before the capacity was found, and slow start on up to --concurrency."""
        self.capped = self.probing = False
        self.capacity_dropped += 1
        self.full_level = 0.0
        self.ssthresh = float(self.max_in_flight)
        self.window = max(self.window, self._window_before_cap)
        self._refused.clear()
        self._stamps_new, self._stamps_due = 0, TOP_MIN
        self._wake_places()
        self._wake()

    def _to_level(self, level: float) -> None:
        """The window to `level` plus the probe margin (kept slots above it are taken back)."""
        self.full_level = level
        before = self.window
        margin = max(PROBE_MIN, PROBE_SHARE * level)
        self.window = max(float(self.min_window), min(float(self.max_in_flight),
                                                      level + margin))
        if self.window < before:
            self._revoke(margin)
        self._wake()

    def throttle_wait(self, retry_after: float | None, throttles_in_a_row: int) -> float:
        """How long a throttled prompt waits: the server's Retry-After (already capped), else a
        short jittered exponential delay whose ceiling grows with the share of throttled
        answers (0.1 s at a few percent, 0.2 s at half, 10 s when 99% are, 30 s at most)."""
        if retry_after is not None:
            delay = retry_after
        elif self.capped:
            # At a capacity the server frees a place per answer: a retry sooner than about
            # a round trip is refused again (and each refusal is a request sent for nothing);
            # at most a second or so (a busy machine's round trip reads seconds).
            delay = min(1.0, max(0.05, self.srtt)) * random.uniform(0.75, 1.5)
        else:
            ceiling = min(30.0, 0.1 / max(0.003, 1.0 - self.evidence.share_slow))
            delay = min(ceiling, 0.05 * 2 ** min(throttles_in_a_row - 1, 16))
            delay *= random.uniform(0.5, 1.0)
        now = self.breaker.clock()
        if delay >= self._wait_hi[0] or now - self._wait_hi[1] > 10.0:
            self._wait_hi = (delay, now)
        return delay
