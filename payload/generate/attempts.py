"""One prompt through its attempts: admit, send, classify, then answer, retry or give up.

The policy per answer (docs/generator.md "How requests are paced" and "Error taxonomy"):
- an answer is recorded; a 401 stops the run at once; a 402, or an answer that brings the
  spend to the budget, stops it and closes the requests in flight (docs/generator.md
  "Cancellation");
- a permanent error is held by the systematic-error detector (which may stop the run);
- a throttled answer spends no attempt: the prompt waits as told, keeping its slot
  through a short wait and giving it back for a longer one;
- any other retryable error backs off without the slot and spends an attempt, unless the
  outage breaker says the server as a whole was down (then the failure is free).

Every request in flight holds one limiter slot and one budget admission; both are given
back on every path, cancellation included. A request is awaited through `InFlight`, so a
stop can close it (its connection aborted) and the worker goes on: it counts it
`cancelled`, keeps its budget reserve (it may have been billed) and records nothing, so
the next run asks the prompt again.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from payload.errors import BudgetReached
from payload.generate import client, streaming
from payload.generate.budget import Budget
from payload.generate.client import Kind, Outcome
from payload.generate.journal import id_hash
from payload.generate.limiter import Limiter
from payload.generate.outage import Breaker
from payload.generate.progress import Counters
from payload.generate.recorder import Recorder
from payload.generate.settings import Settings, refuses_streaming, token_ids_for
from payload.generate.slots import HOLD, HOLD_MAX_S
from payload.generate.stop import Stop
from payload.generate.systematic import Held
from payload.generate.turns import Turn, history, positions
from payload.records import Prompt
from payload.report import Reporter


@dataclass
class Endpoint:
    """Where and how requests go: the one session, the URL, headers (with the key), the
    per-request timeout and the proxy resolved once for the run."""

    session: aiohttp.ClientSession
    url: str
    headers: dict[str, str]
    timeout: aiohttp.ClientTimeout
    proxy: str | None
    watchdog: streaming.Watchdog | None = None  # the streams' timeouts (--stream on/auto)


@dataclass
class _Slot:
    """A prompt's place in the limiter: whether it holds one, and whether it is the probe."""

    probe: bool = False
    held: bool = True


class Attempts:
    def __init__(self, s: Settings, counters: Counters, limiter: Limiter, breaker: Breaker,
                 budget: Budget, recorder: Recorder, stop: Stop, endpoint: Endpoint,
                 reporter: Reporter, resumed: dict[int, list[Turn]] | None = None) -> None:
        self.s = s
        # --turns all: the journaled turns of conversations not yet recorded, by id hash.
        self.resumed = resumed or {}
        self.c = counters
        self.limiter = limiter
        self.breaker = breaker
        self.budget = budget
        self.rec = recorder
        self.stop = stop
        self.ep = endpoint
        self.say = reporter
        self._dispatched = 0  # sequence number of the last request sent
        self._outage_reported = 0
        # Whether requests ask for the sampled token ids; `auto` stops asking a server
        # that refuses the field (said once).
        self.ask_ids = token_ids_for(s.base_url, s.token_ids)
        # Whether requests are streamed; `auto` stops streaming to a server that refuses
        # the streaming fields (said once).
        self.streams = s.stream != "off" and endpoint.watchdog is not None
        # Called when a prompt gives its slot back to wait (a throttle, a backoff) and keeps
        # its worker: the run starts a spare worker for the slot now (run.py).
        self.slot_left: Callable[[], None] = lambda: None

    def body(self, messages: list[dict[str, Any]]) -> bytes:
        s = self.s
        return json.dumps(client.build_body(
            messages, model=s.model, provider=s.provider, max_tokens=s.max_tokens,
            temperature=s.temperature, top_p=s.top_p, reasoning=s.reasoning, seed=s.seed,
            token_ids=self.ask_ids, stream=self.streams),
            ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def _stop_streaming(self, o: Outcome) -> bool:
        """`--stream auto` and the server refused the streaming fields: ask without them
        from now on (True: the prompt is asked again at no attempt's cost)."""
        if self.s.stream != "auto" or o.kind is not Kind.PERMANENT \
                or not refuses_streaming(o.status, o.message):
            return False
        if self.streams:
            self.streams = False
            self.say.warn(f"the server refused a streamed request ({o.status}: "
                          f"{o.message[:200]}); asking without streaming from now on "
                          f"(--request-timeout {self.s.request_timeout:g}s is each "
                          "request's wall)")
        return True

    def _stop_asking_ids(self, o: Outcome) -> bool:
        """`--token-ids auto` and the server refused `return_token_ids`: ask without it from
        now on (True: the prompt is asked again at no attempt's cost)."""
        if self.s.token_ids != "auto" or not client.refuses_token_ids(o):
            return False
        if self.ask_ids:
            self.ask_ids = False
            self.say.warn(f"the server refused return_token_ids ({o.status}: {o.message[:200]});"
                          " asking without it: records get no response_token_ids "
                          "(the extractor re-tokenizes their text)")
        return True

    async def handle(self, p: Prompt) -> None:
        """One prompt: each turn it regenerates (one with --turns last), in order, each on
        the regenerated history before it, through its attempts. A turn's slot is held
        across a short throttle wait and given back for anything longer (backoff, an
        outage, a long Retry-After) and between turns."""
        where = positions(p, self.s.turns)
        done: list[Turn] = (self.resumed.pop(id_hash(p.key), [])[:len(where) - 1]
                            if self.resumed else [])
        for k in range(len(done), len(where)):
            messages = history(p, where, done, k)
            slot = _Slot(probe=await self.limiter.acquire())
            try:
                got = await self._attempts(p, slot, messages)
            finally:
                if slot.held:
                    self.limiter.release()
            if got is None:
                return  # recorded as failed, held, or stopped
            outcome, cost, sent, seq = got
            if k + 1 < len(where):
                turn = self.rec.turn(p, k, where[k], outcome, cost, sent, seq)
                if turn is None:
                    return
                done.append(turn)
            elif self.s.turns == "all":
                self.rec.success(p, history(p, where, done, k, with_reasoning=True), outcome,
                                 cost, sent, seq, done)
            else:
                self.rec.success(p, messages, outcome, cost, sent, seq)

    async def _send(self, body: bytes, streamed: bool) -> tuple[Outcome, int, bool] | None:
        """One request, counted in flight: (its answer, how many were at the server when it
        was sent, whether its stream began: for the limiter); None when it was not sent (the
        run stopped while the prompt waited for its place) or was closed before its
        answer."""
        c, ep, stop = self.c, self.ep, self.stop
        if stop.stopping:  # nothing new goes out once the run stops
            self.budget.cancel()
            return None
        c.in_flight += 1
        n_send = self.limiter.sending()
        began = False

        def on_began() -> None:  # the limiter grows at a stream's first token (`began`)
            nonlocal began
            began = True
            self.limiter.began()
        try:
            request = (streaming.attempt(ep.session, ep.url, body, ep.headers, ep.watchdog,
                                         ep.proxy, self.s.think_in_content, on_began)
                       if streamed and ep.watchdog is not None else  # as the body asks
                       client.attempt(ep.session, ep.url, body, ep.headers, ep.timeout,
                                      ep.proxy, self.s.think_in_content))
            outcome = await stop.requests.run(request)
        except asyncio.CancelledError:  # this worker was cancelled: its request closed too
            self._closed()
            raise
        except BaseException:
            self.budget.cancel()
            raise
        finally:
            c.in_flight -= 1
            self.limiter.returned()
        if outcome is None:
            self._closed()
            return None
        return outcome, n_send, began

    def _closed(self) -> None:
        """A request closed before its answer: counted, and its reserve stays spent (it may
        have been billed for what the server generated until then)."""
        self.c.cancelled += 1
        self.c.cancelled_cost += self.budget.closed()

    async def _attempts(self, p: Prompt, slot: _Slot, messages: list[dict[str, Any]]
                        ) -> tuple[Outcome, float | None, int, int] | None:
        """One request through its attempts: (the answer, its cost, requests sent, its
        dispatch number), or None when the prompt ended otherwise (failed, held, stopped)."""
        s, c, lim, stop = self.s, self.c, self.limiter, self.stop
        asked, streamed, body = self.ask_ids, self.streams, self.body(messages)
        sent = charged = throttles = timeouts = 0
        while True:
            if stop.stopping:
                return None
            try:
                await self.budget.admit()
            except BudgetReached as exc:
                stop.close("budget", f"stopping: {exc}; requests in flight are closed; the "
                           "run is resumable (raise --max-cost and rerun the same command)")
                return None
            if lim.capped and not slot.probe:
                await lim.place()  # at a capacity: once the server has a free place
            sent += 1
            self._dispatched += 1
            seq = self._dispatched
            got = await self._send(body, streamed)
            if got is None:
                return None  # not sent, or closed by a stop: asked again by the next run
            outcome, n_send, began = got
            cost = self.rec.settle(outcome)
            if self.budget.reached and (len(stop.requests) or not stop.stopping):
                # What is still in flight is beyond the budget, also during a drain: closed
                # now, not paid for to its end (this answer is kept: it is paid already).
                stop.close("budget", f"stopping: budget ${self.budget.max_cost:g} reached "
                           f"(spent ${self.budget.spent:.4f}); the {len(stop.requests)} "
                           "requests in flight are closed; the run is resumable (raise "
                           "--max-cost and rerun the same command)")
            decision = lim.answered(outcome, probe=slot.probe, n_send=n_send,
                                    grown=began)
            slot.probe = False
            self._note_outage(outcome)
            if outcome.kind is Kind.OK:
                return outcome, cost, sent, seq
            self.rec.error_answer(outcome, cost)
            # A request we abandoned may have been billed in full: asked again at most
            # --max-timeouts times, unless the server was failing as a whole (below).
            timed_out = outcome.type == "timeout" and outcome.status is None
            c.timeouts += timed_out
            if outcome.kind is Kind.AUTH:
                stop.abandon("auth", f"the API key was refused (401: {outcome.message}); "
                             "check the key file / $OPENROUTER_API_KEY. Nothing more is "
                             "sent; the run is resumable.")
                return None
            if outcome.kind is Kind.CREDIT:
                stop.close("credit", "out of credit or key limit reached "
                           f"({outcome.status} {outcome.type}: {outcome.message}); "
                           "requests in flight are closed, the run is resumable with the "
                           "same command once credit is added.")
                return None
            if outcome.kind is Kind.PERMANENT:
                if (asked and self._stop_asking_ids(outcome)) or (
                        streamed and self._stop_streaming(outcome)):  # asked again without
                    asked, streamed, body = self.ask_ids, self.streams, self.body(messages)
                    continue
                if self.rec.permanent(Held(p, outcome, sent, seq)):
                    stop.request("systematic_error", self.rec.systematic.describe())
                return None
            if outcome.throttled:
                # Not the prompt's fault: no attempt is spent; it waits as told.
                throttles += 1
                c.retries += 1
                wait = lim.throttle_wait(outcome.retry_after, throttles)
                if decision != HOLD or wait > HOLD_MAX_S:
                    if lim.resumed(decision):  # kept so far (else the limiter took it back)
                        lim.release()
                    slot.held = False
                    self.slot_left()
                    await stop.sleep(wait)
                    if stop.stopping:
                        return None
                    slot.probe, slot.held = await lim.acquire(), True
                else:
                    try:
                        await stop.sleep(wait)
                    finally:
                        slot.held = lim.resumed(decision)
                    if not slot.held:  # the window fell below where it was refused: queue for one
                        if stop.stopping:
                            return None
                        slot.probe, slot.held = await lim.acquire(), True
                continue
            throttles = 0
            # Any other retryable error: back off without the slot.
            generation, was_open = self.breaker.generation, self.breaker.is_open
            if not outcome.server_failure:
                charged += 1
                if charged >= s.max_attempts:
                    self.rec.failure(p, outcome, sent, gave_up=True)
                    return None
            lim.release()
            slot.held = False
            self.slot_left()
            await stop.sleep(
                backoff_delay(charged + 1, s.backoff_base, retry_after=outcome.retry_after))
            if stop.stopping:
                return None
            slot.probe, slot.held = await lim.acquire(), True
            if outcome.server_failure and not self.breaker.free_failure(generation, was_open):
                # The server was not down as a whole: this one counts.
                timeouts += timed_out
                if timeouts > s.max_timeouts:
                    self.rec.failure(p, outcome, sent, gave_up=True, why=(
                        f"{timeouts} timeouts (--max-timeouts {s.max_timeouts}: each may "
                        "have been billed)"))
                    return None
                charged += 1
                if charged >= s.max_attempts:
                    self.rec.failure(p, outcome, sent, gave_up=True)
                    return None
            c.retries += 1

    def _note_outage(self, o: Outcome) -> None:
        """Say when an outage begins and ends (once each), and keep the status's gauge."""
        b, c = self.breaker, self.c
        if b.is_open and self._outage_reported != b.outages:
            self._outage_reported = b.outages
            c.outage_s, c.outages = 0.0, b.outages
            self.say.say(f"outage: {b.streak} answers in a row failed (last: {o.status or ''} "
                         f"{o.type}: {o.message[:200]}); dispatch paused, one probe at a "
                         f"time; stops after {self.s.outage_timeout:g}s (--outage-timeout)")
        elif not b.is_open and c.outage_s is not None:
            self.say.say(f"outage over after {b.closed_at - b.opened_at:.1f}s: resuming "
                         "(slow start)")
            c.outage_s = None


def backoff_delay(attempt: int, base: float, cap: float = 60.0,
                  retry_after: float | None = None) -> float:
    """Full-jitter exponential backoff; never shorter than the server's Retry-After."""
    delay = random.uniform(0.0, min(cap, base * 2 ** max(0, attempt - 1)))
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay
