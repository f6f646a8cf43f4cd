"""`python -m payload generate`: the orchestrator.

Shape: a survey reads the input once (valid records, bad lines, this shard's total) before
anything is sent; then one producer streams it (never loading it whole) into a bounded
queue; `--concurrency` workers each take one prompt at a time through its attempts; a
Limiter gates how many are in flight (slow start, throttling, the outage breaker); a
Budget gates what may be spent. Memory is bounded by the concurrency, not the input
size: the only thing that grows with the input is a set of 64-bit id hashes.

Exactly once: a record is written by one synchronous append on the event loop (no await
between the decision and the write, so two writers can never interleave); resume skips
every id already in the output or errors file.

Exit codes: 0 finished · 1 finished with more failures than --max-failed · 2 bad usage
or input · 3 stopped early and resumable (key refused, credit, budget, signal, a
systematic error, an outage longer than --outage-timeout, a full disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ..errors import ExitCode, UsageError
from ..records import ALL, BadRecord, Prompt, Shard, errors_path, iter_input, parse_prompt
from ..redact import redact
from . import client
from .budget import DEFAULT_FIRST_EXPECTATION, DEFAULT_PRICES, Budget, BudgetReached, Prices
from .client import Kind, Outcome
from .inputs import BadLines, Survey, survey
from .journal import (
    IdSet,
    Index,
    WriteFailed,
    Writer,
    drop_failures,
    encode_record,
    id_hash,
    load_index,
)
from .limiter import HOLD, HOLD_MAX_S, Limiter, backoff_delay
from .outage import Breaker
from .preflight import PreflightRefused, check_endpoints
from .progress import Counters, Display, StatusWriter
from .systematic import Held, SystematicError

EXIT_OK, EXIT_FAILED = ExitCode.OK, ExitCode.FAILED
EXIT_USAGE, EXIT_STOPPED = ExitCode.USAGE, ExitCode.STOPPED
STATUS_EVERY_S = 2.0
# Completion tokens assumed for the budget's first expectation when --max-tokens is unset.
FIRST_COMPLETION_GUESS = 8192


@dataclass(frozen=True)
class MaxFailed:
    """`--max-failed`: a count (`50`) or a share of the ids (`2%`) that may fail permanently
    before the run exits 1."""

    count: int | None = None
    fraction: float | None = None

    def allowed(self, total: int) -> int:
        if self.count is not None:
            return self.count
        return int(total * (self.fraction or 0.0) + 1e-9)

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{(self.fraction or 0) * 100:g}%"


def parse_max_failed(text: str) -> MaxFailed:
    t = text.strip()
    try:
        if t.endswith("%"):
            pct = float(t[:-1])
            if 0 <= pct <= 100:
                return MaxFailed(fraction=pct / 100)
        else:
            n = int(t)
            if n >= 0:
                return MaxFailed(count=n)
    except ValueError:
        pass
    raise ValueError(f"--max-failed takes a count (e.g. 50) or a percentage (e.g. 2%), got {text!r}")


def provider_for(base_url: str, provider: Any, explicit: bool) -> dict[str, Any] | None:
    """The routing object is OpenRouter's: sent to openrouter.ai, or anywhere when the user
    gave it (other OpenAI-compatible APIs reject unknown fields)."""
    if explicit:
        return provider if isinstance(provider, dict) else None
    host = (urlsplit(base_url).hostname or "").lower()
    is_openrouter = host == "openrouter.ai" or host.endswith(".openrouter.ai")
    return provider if is_openrouter and isinstance(provider, dict) else None


@dataclass
class Settings:
    input: Path
    output: Path
    status_file: Path | None
    model: str
    base_url: str
    api_key: str
    concurrency: int = 2000
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    provider: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    max_cost: float | None = None
    prices: Prices | None = None  # --prices: overrides the endpoint list's
    shard: Shard = ALL
    retry_failed: bool = False
    request_timeout: float = 600.0
    max_attempts: int = 6
    backoff_base: float = 1.0
    drain_timeout: float = 60.0
    outage_timeout: float = 600.0
    max_failed: MaxFailed = MaxFailed(fraction=0.01)
    preflight: bool = True

    @property
    def errors(self) -> Path:
        return errors_path(self.output)


def check_paths(s: Settings) -> None:
    """Missing/empty input and unwritable outputs fail before anything is sent."""
    if not s.input.is_file():
        raise UsageError(f"input file {s.input} does not exist (or is not a file)")
    with s.input.open("rb") as fh:
        if not any(line.strip() for line in _head_lines(fh)):
            raise UsageError(f"input file {s.input} is empty: nothing to generate")
    if s.output.resolve() == s.input.resolve():
        raise UsageError("--output must differ from --input")
    for path in (s.output, s.errors, s.status_file):
        if path is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab"):
                pass
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def _head_lines(fh: Any, limit: int = 1 << 20) -> Any:
    """Lines until the first non-blank one (bounded read, for the emptiness check)."""
    read = 0
    for line in fh:
        yield line
        read += len(line)
        if line.strip() or read > limit:
            return


@dataclass
class _Slot:
    """A prompt's place in the limiter: whether it holds one, and whether it is the probe."""

    probe: bool = False
    held: bool = True


class Generator:
    def __init__(self, s: Settings) -> None:
        self.s = s
        self.c = Counters(max_cost=s.max_cost)
        self.breaker = Breaker()
        self.limiter = Limiter(s.concurrency, breaker=self.breaker)
        self.budget = Budget(s.max_cost)
        self.prices: Prices | None = s.prices
        self.index = Index()
        self.claimed = IdSet()
        self.stop_event = asyncio.Event()
        self.stop_reason: str | None = None
        self.exit_code: int = EXIT_OK
        self.writer: Writer | None = None
        self.status = StatusWriter(s.status_file)
        self.bad = BadLines(s.input)
        self.systematic = SystematicError(self._write_held)
        self.headers = {"Authorization": f"Bearer {s.api_key}",
                        "Content-Type": "application/json", "X-Title": "handoff"}
        self.url = s.base_url.rstrip("/") + "/chat/completions"
        self.timeout = aiohttp.ClientTimeout(total=s.request_timeout, sock_connect=60)
        self.proxy = client.env_proxy(self.url)
        self.workers: list[asyncio.Task[None]] = []
        self.session: aiohttp.ClientSession | None = None
        self.last_success = time.monotonic()
        self.failures_since_success = 0
        self._outage_reported = 0
        self._mean_line_bytes = 0
        self._dispatched = 0  # sequence number of the last request sent

    # -- stopping ------------------------------------------------------------------------------
    def request_stop(self, reason: str, message: str, code: int = EXIT_STOPPED) -> None:
        """Stop dispatching; in-flight requests finish (drained by `main`)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self.c.stop_reason = reason
            self.c.last_error = redact(message)
            print(redact(message), file=sys.stderr, flush=True)
            self.exit_code = code
        self.stop_event.set()
        self.limiter.stop()

    @property
    def stopping(self) -> bool:
        return self.stop_event.is_set()

    def _write_failed(self, exc: WriteFailed) -> None:
        """A record did not fit (or the disk failed): answers can no longer be kept, so stop
        at once instead of paying for answers that would be lost."""
        if exc.disk_full:
            why = f"no space left on device writing {exc.path}"
            fix = "free space (or move the job), then rerun the same command: it resumes"
            reason = "disk_full"
        else:
            why = f"cannot write {exc.path}: {exc.strerror}"
            fix = "fix the file system, then rerun the same command: it resumes"
            reason = "write_error"
        self.request_stop(reason, f"stopping: {why}; {fix}")
        self._cancel_workers()

    # -- the pipeline --------------------------------------------------------------------------
    async def produce(self, queue: asyncio.Queue[Prompt | None]) -> None:
        """Feed the workers. Bad lines and duplicates were reported by the survey: skipped
        quietly here."""
        s = self.s
        since_yield = 0
        for line_no, text in iter_input(s.input):
            if self.stopping:
                return
            if isinstance(text, BadRecord):
                continue
            try:
                prompt = parse_prompt(text, line_no)
            except BadRecord:
                continue
            if not s.shard.owns(prompt.key):
                continue
            h = id_hash(prompt.key)
            if h in self.index.done or h in self.index.failed or h in self.claimed:
                continue
            self.claimed.add(h)
            await queue.put(prompt)
            since_yield += 1
            if since_yield >= 256:  # put() does not yield while the queue has room
                since_yield = 0
                await asyncio.sleep(0)

    async def work(self, queue: asyncio.Queue[Prompt | None]) -> None:
        while not self.stopping:
            prompt = await queue.get()
            if prompt is None:
                return
            await self.handle(prompt)

    async def _sleep_unless_stopped(self, delay: float) -> None:
        if delay <= 0:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stop_event.wait(), delay)

    async def handle(self, p: Prompt) -> None:
        """One prompt through its attempts. The slot is held across a short throttle wait
        and given back for anything longer (backoff, an outage, a long Retry-After)."""
        slot = _Slot(probe=await self.limiter.acquire())
        try:
            await self._attempts(p, slot)
        finally:
            if slot.held:
                self.limiter.release()

    async def _attempts(self, p: Prompt, slot: _Slot) -> None:
        s, c, lim = self.s, self.c, self.limiter
        assert self.session is not None
        body = json.dumps(client.build_body(
            p.messages, model=s.model, provider=s.provider, max_tokens=s.max_tokens,
            temperature=s.temperature, top_p=s.top_p, reasoning=s.reasoning),
            ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        sent = charged = throttles = 0
        held = False  # this prompt kept its slot through a throttle wait: its retry tells
        while True:
            if self.stopping:
                return
            try:
                await self.budget.admit()
            except BudgetReached as exc:
                self.request_stop("budget", f"stopping: {exc}; the run is resumable "
                                  "(raise --max-cost and rerun the same command)")
                return
            sent += 1
            self._dispatched += 1
            seq = self._dispatched
            c.in_flight += 1
            lim.sending()
            try:
                outcome = await client.attempt(self.session, self.url, body, self.headers,
                                               self.timeout, self.proxy)
            except BaseException:  # cancelled (a stop that does not wait): never answered
                self.budget.cancel()
                raise
            finally:
                c.in_flight -= 1
            cost = self._settle(outcome)
            decision = lim.answered(outcome, probe=slot.probe, repeat=held)
            slot.probe = held = False
            self._note_outage(outcome)
            if outcome.kind is Kind.OK:
                self._on_success(p, outcome, cost, sent, seq)
                return
            self.failures_since_success += 1
            if cost:
                c.cost += cost
            c.errors_by_kind[outcome.type] += 1
            c.last_error = f"{outcome.status or ''} {outcome.type}: {outcome.message}".strip()
            if outcome.kind is Kind.AUTH:
                self.request_stop("auth", f"the API key was refused (401: {outcome.message}); "
                                  "check the key file / $OPENROUTER_API_KEY. Nothing more is "
                                  "sent; the run is resumable.")
                self._cancel_workers()
                return
            if outcome.kind is Kind.CREDIT:
                self.request_stop("credit", "out of credit or key limit reached "
                                  f"({outcome.status} {outcome.type}: {outcome.message}); "
                                  "in-flight requests finish, the run is resumable with the "
                                  "same command once credit is added.")
                return
            if outcome.kind is Kind.PERMANENT:
                if self.systematic.permanent(Held(p, outcome, sent, seq)):
                    self.request_stop("systematic_error", self.systematic.describe())
                return
            if outcome.throttled:
                # Not the prompt's fault: no attempt is spent; it waits as told.
                throttles += 1
                c.retries += 1
                wait = lim.throttle_wait(outcome.retry_after, throttles)
                if decision != HOLD or wait > HOLD_MAX_S:
                    if decision == HOLD:  # otherwise the limiter took the slot back already
                        lim.release()
                    slot.held = False
                    await self._sleep_unless_stopped(wait)
                    if self.stopping:
                        return
                    slot.probe, slot.held = await lim.acquire(), True
                else:
                    await self._sleep_unless_stopped(wait)
                    held = True
                continue
            throttles = 0
            # Any other retryable error: back off without the slot.
            generation, was_open = self.breaker.generation, self.breaker.is_open
            if not outcome.server_failure:
                charged += 1
                if charged >= s.max_attempts:
                    self._record_error(p, outcome, sent, gave_up=True)
                    return
            lim.release()
            slot.held = False
            await self._sleep_unless_stopped(
                backoff_delay(charged + 1, s.backoff_base, retry_after=outcome.retry_after))
            if self.stopping:
                return
            slot.probe, slot.held = await lim.acquire(), True
            if outcome.server_failure and not self.breaker.free_failure(generation, was_open):
                charged += 1  # the server was not down as a whole: this one counts
                if charged >= s.max_attempts:
                    self._record_error(p, outcome, sent, gave_up=True)
                    return
            c.retries += 1

    # -- accounting ----------------------------------------------------------------------------
    def _settle(self, o: Outcome) -> float | None:
        """What this attempt cost (reported, or priced from its tokens) and the budget update."""
        cost = o.cost
        if cost is None and self.prices is not None:
            cost = self.prices.of(o.usage)
        if o.kind is Kind.OK and self.c.budget_enforced is None and self.s.max_cost is not None:
            self._judge_budget(o)
        # A reset or timeout may have been billed unseen; a refused connection never was.
        self.budget.settle(cost, unknown=o.type in ("timeout", "connection"))
        return cost

    def _judge_budget(self, o: Outcome) -> None:
        """The first answer tells whether --max-cost can be enforced."""
        if o.cost is not None or (self.prices is not None and self.prices.of(o.usage)
                                  is not None):
            self.c.budget_enforced = True
            return
        self.c.budget_enforced = False
        print(f"warning: --max-cost ${self.s.max_cost:g} cannot be enforced: the server reports "
              "no usage.cost and no prices are known. Give --prices PROMPT,COMPLETION (USD per "
              "million tokens) to price answers from their tokens; the run goes on.",
              file=sys.stderr, flush=True)

    def _on_success(self, p: Prompt, o: Outcome, cost: float | None, attempts: int,
                    seq: int) -> None:
        self.last_success = time.monotonic()
        self.failures_since_success = 0
        r = o.result
        usage = r["usage"]
        line = encode_record({
            "id": p.id, "usage": usage, "response": r["response"], "reasoning": r["reasoning"],
            "finish_reason": r["finish_reason"], "provider": r["provider"],
            "model": r["model"], "latency_s": round(o.latency_s, 3), "attempts": attempts,
            "messages": p.messages})
        assert self.writer is not None
        try:
            self.writer.write_output(line)
        except WriteFailed as exc:
            self._write_failed(exc)
            return
        c = self.c
        c.done += 1
        c.done_this_run += 1
        if cost:
            c.cost += cost
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        c.prompt_tokens += pt if isinstance(pt, int) else 0
        c.completion_tokens += ct if isinstance(ct, int) else 0
        c.tokens_this_run += ct if isinstance(ct, int) else 0
        self.systematic.success(seq)

    def _write_held(self, item: Held) -> None:
        self._record_error(item.prompt, item.outcome, item.attempts)

    def _record_error(self, p: Prompt, o: Outcome, attempts: int, *, gave_up: bool = False
                      ) -> None:
        message = o.message
        if gave_up:
            message = f"gave up after {attempts} attempts; last: {message}"
        line = encode_record({"id": p.id, "error": {"status": o.status, "type": o.type,
                                                    "message": redact(message)},
                              "attempts": attempts})
        assert self.writer is not None
        try:
            self.writer.write_error(line)
        except WriteFailed as exc:
            self._write_failed(exc)
            return
        self.c.failed += 1

    def _note_outage(self, o: Outcome) -> None:
        """Say when an outage begins and ends (once each), and keep the status's gauge."""
        b, c = self.breaker, self.c
        if b.is_open and self._outage_reported != b.outages:
            self._outage_reported = b.outages
            c.outage_s, c.outages = 0.0, b.outages
            print(f"outage: {b.streak} answers in a row failed (last: {o.status or ''} {o.type}: "
                  f"{o.message[:200]}); dispatch paused, one probe at a time; stops after "
                  f"{self.s.outage_timeout:g}s (--outage-timeout)", file=sys.stderr, flush=True)
        elif not b.is_open and c.outage_s is not None:
            print(f"outage over after {b.closed_at - b.opened_at:.1f}s: resuming (slow start)",
                  file=sys.stderr, flush=True)
            c.outage_s = None

    def _cancel_workers(self) -> None:
        current = asyncio.current_task()
        for task in self.workers:
            if task is not current:
                task.cancel()

    async def _tick(self, display: Display) -> None:
        while True:
            await asyncio.sleep(STATUS_EVERY_S)
            self._watchdog()
            if self.status.write(self.c) is not None and self.status.disk_full:
                self.request_stop("disk_full", f"stopping: no space left on device writing "
                                  f"{self.s.status_file}; free space, then rerun the same "
                                  "command: it resumes")
                self._cancel_workers()
            display.update()

    def _watchdog(self) -> None:
        """Outage and stall limits, and the live gauges of the status file."""
        c, b, now = self.c, self.breaker, time.monotonic()
        c.window = self.limiter.allowed
        c.outages = b.outages
        if b.is_open:
            c.outage_s = b.open_for(now)
            c.last_error = (f"outage: the server has been failing for {c.outage_s:.0f}s; "
                            f"dispatch paused, probing (stops after {self.s.outage_timeout:g}s)")
        stalled = now - self.last_success
        if (b.is_open and b.open_for(now) > self.s.outage_timeout) or (
                self.failures_since_success and stalled > self.s.outage_timeout):
            what = "failing" if b.is_open else "answering only errors"
            self.request_stop("outage", f"stopping: the server has been {what} for "
                              f"{stalled:.0f}s (--outage-timeout {self.s.outage_timeout:g}s); "
                              "nothing was recorded as failed for it; rerun the same command "
                              "once the server is back: it resumes")

    def _on_signal(self, signame: str) -> None:
        if self.stop_reason == "signal":
            print(f"{signame} again: not waiting for in-flight requests", file=sys.stderr)
            self._cancel_workers()
            return
        self.request_stop("signal", f"{signame}: stopping; waiting up to "
                          f"{self.s.drain_timeout:g}s for in-flight requests (resumable)")

    # -- main ----------------------------------------------------------------------------------
    def _survey(self) -> Survey:
        s, c = self.s, self.c
        t0 = time.monotonic()
        sv = survey(s.input, s.shard, self.index, self.bad)
        c.bad_lines, c.bad_line_samples = self.bad.count, self.bad.samples
        c.duplicates, c.total = sv.duplicates, sv.owned
        summary = self.bad.summary()
        if summary:
            print(summary, file=sys.stderr)
        shard = "" if s.shard.count == 1 else f"; shard {s.shard} owns {sv.owned}"
        print(f"input: {sv.valid} valid records, {self.bad.count} bad lines, {sv.duplicates} "
              f"duplicate ids{shard}; {sv.owned - sv.recorded} to do "
              f"(read in {time.monotonic() - t0:.2f}s)", file=sys.stderr)
        if sv.valid == 0:
            raise UsageError(
                f"no valid record in {s.input} ({sv.lines} non-blank lines, all bad; first: "
                + (f"line {self.bad.samples[0]['line']}: {self.bad.samples[0]['reason']}"
                   if self.bad.samples else "-")
                + "). Accepted shapes: {\"messages\": [...]}, ShareGPT {\"conversations\": "
                "[...]}, or {\"prompt\": \"text\"}, one JSON object per line (docs/records.md)")
        if sv.valid:
            self._mean_line_bytes = max(1, s.input.stat().st_size // max(1, sv.lines))
        return sv

    def _first_expectation(self) -> float:
        """The budget's expected cost per request before any answer (DESIGN "Budget")."""
        size = self._mean_line_bytes
        if self.prices is not None:
            return self.prices.expected(size, self.s.max_tokens or FIRST_COMPLETION_GUESS)
        if self.s.max_tokens is not None:
            return Prices(*DEFAULT_PRICES).expected(size, self.s.max_tokens)
        return DEFAULT_FIRST_EXPECTATION

    def _start_budget(self) -> None:
        s, c = self.s, self.c
        spent = c.cost
        ix, pr = self.index, self.prices
        if pr is not None and ix.uncosted_records:
            # Answers recorded without usage.cost are priced from their tokens, as they were.
            spent += (pr.prompt * ix.uncosted_prompt_tokens
                      + pr.completion * ix.uncosted_completion_tokens
                      + pr.request * ix.uncosted_records)
            c.cost = spent
        self.budget = Budget(s.max_cost, already_spent=spent,
                             first_expectation=self._first_expectation())
        if s.max_cost is None:
            return
        if self.prices is None:
            print(f"budget: ${s.max_cost:g}; no prices are known for {s.model}, so it is "
                  "enforced from the usage.cost the server reports (if it reports none, "
                  "the budget cannot be enforced: give --prices)", file=sys.stderr)
        else:
            c.budget_enforced = True
            print(f"budget: ${s.max_cost:g} (${spent:.4f} already spent); first expectation "
                  f"${self.budget.expectation:.4f} per request, then the mean cost seen",
                  file=sys.stderr)

    async def main(self) -> int:
        s, c = self.s, self.c
        check_paths(s)
        if s.retry_failed:
            dropped = drop_failures(s.errors, s.shard.owns)
            print(f"--retry-failed: {dropped} recorded failures will be retried", file=sys.stderr)
        t0 = time.monotonic()
        self.index = load_index(s.output, s.errors)
        if self.index.truncated_bytes:
            print(f"resume: cut a torn last line ({self.index.truncated_bytes} bytes)",
                  file=sys.stderr)
        c.done, c.failed = len(self.index.done), len(self.index.failed)
        c.cost, c.prompt_tokens = self.index.cost, self.index.prompt_tokens
        c.completion_tokens = self.index.completion_tokens
        if c.done or c.failed:
            print(f"resume: {c.done} done, {c.failed} failed already recorded "
                  f"(index built in {time.monotonic() - t0:.2f}s)", file=sys.stderr)
        self.status.hold_reserve()
        try:
            sv = self._survey()
        except UsageError as exc:
            c.state, c.exit_code, c.stop_reason = "aborted", int(EXIT_USAGE), "bad_input"
            c.last_error = str(exc)
            self.status.write(c, final=True)
            raise
        c.max_failed = s.max_failed.allowed(sv.owned)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig.name)
        connector = aiohttp.TCPConnector(limit=s.concurrency, limit_per_host=s.concurrency,
                                         ttl_dns_cache=300, enable_cleanup_closed=True)
        display = Display(c)
        self.writer = Writer(s.output, s.errors)
        completed = False
        try:
            # trust_env stays off: it costs two thread hops per request (netrc and proxy
            # lookups). The proxy a container may need ($HTTPS_PROXY) is resolved once.
            async with aiohttp.ClientSession(connector=connector, raise_for_status=False,
                                             trust_env=False) as session:
                self.session = session
                if s.preflight:
                    prices, _ = await check_endpoints(
                        session, s.base_url, s.model, s.provider, self.headers)
                    if self.prices is None:
                        self.prices = prices
                self._start_budget()
                if self.budget.reached:
                    self.request_stop("budget", f"budget ${s.max_cost:g} already spent "
                                      f"(${c.cost:.4f} recorded); raise --max-cost to go on")
                else:
                    await self._run_pipeline(display)
                    if not self.stopping and self.systematic.at_end():
                        self.request_stop("systematic_error", self.systematic.describe())
            completed = True
        finally:
            self.writer.close()
            self.limiter.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            c.in_flight = 0
            c.window = self.limiter.allowed
            if self.stop_reason is not None:
                c.state = "stopped"
            elif not completed:
                c.state, self.exit_code = "aborted", EXIT_FAILED
            else:
                c.state = "finished"
                if c.max_failed is not None and c.failed > c.max_failed:
                    self.exit_code = EXIT_FAILED
                    c.last_error = (f"{c.failed} of {c.total} ids failed, more than "
                                    f"--max-failed {s.max_failed} ({c.max_failed}); they are in "
                                    f"{s.errors}: rerun with --retry-failed to ask them again")
                    print(c.last_error, file=sys.stderr)
            c.exit_code = int(self.exit_code)
            self.status.write(c, final=True)
            self.status.release_reserve()
            display.stop()
        return int(self.exit_code)

    async def _run_pipeline(self, display: Display) -> None:
        s = self.s
        # More workers than slots: a prompt that waits out a throttle without a slot (sporadic
        # throttling, a long Retry-After, a backoff) keeps its worker, and the slots it left
        # should still fill.
        n_workers = s.concurrency + s.concurrency // 4 + 8
        # Room for one sentinel per worker once emptied: stopping never blocks on a full queue.
        queue: asyncio.Queue[Prompt | None] = asyncio.Queue(maxsize=max(64, n_workers))
        self.status.write(self.c)
        display.start()
        ticker = asyncio.create_task(self._tick(display))
        self.workers = [asyncio.create_task(self.work(queue)) for _ in range(n_workers)]
        producer = asyncio.create_task(self.produce(queue))
        stop_wait = asyncio.create_task(self.stop_event.wait())
        workers_done = asyncio.create_task(asyncio.wait(self.workers))
        feeder: asyncio.Task[None] | None = None
        try:
            await asyncio.wait({producer, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not self.stopping:
                producer.result()  # surface a read error
                feeder = asyncio.create_task(self._feed_sentinels(queue))
                await asyncio.wait({workers_done, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if self.stopping:
                await self._drain(queue, producer, feeder)
        finally:
            for task in (ticker, producer, stop_wait, workers_done, feeder, *self.workers):
                if task is not None:
                    task.cancel()
            await asyncio.gather(ticker, producer, stop_wait, workers_done, *self.workers,
                                 *([feeder] if feeder else []), return_exceptions=True)
        for task in self.workers:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _feed_sentinels(self, queue: asyncio.Queue[Prompt | None]) -> None:
        for _ in self.workers:
            await queue.put(None)

    async def _drain(self, queue: asyncio.Queue[Prompt | None], producer: asyncio.Task[None],
                     feeder: asyncio.Task[None] | None) -> None:
        """Stop dispatching; give in-flight requests `--drain-timeout` to finish and be written."""
        producer.cancel()
        if feeder is not None:
            feeder.cancel()
        await asyncio.gather(producer, *([feeder] if feeder else []), return_exceptions=True)
        while not queue.empty():
            queue.get_nowait()
        for _ in self.workers:
            queue.put_nowait(None)
        _, pending = await asyncio.wait(self.workers, timeout=self.s.drain_timeout)
        if pending:
            for task in pending:
                task.cancel()
            print(f"drain: {len(pending)} workers still busy after {self.s.drain_timeout:g}s "
                  "were abandoned (their prompts are retried on resume)", file=sys.stderr)
            await asyncio.wait(pending)


def fit_fd_limit(concurrency: int, reserve: int = 256) -> int:
    """Each request in flight holds a socket: raise the soft open-file limit to fit the
    concurrency (containers often default to 1024), or lower the concurrency to what the
    hard limit allows, saying so. Otherwise connects fail with EMFILE, one by one."""
    try:
        import resource
    except ImportError:  # not POSIX
        return concurrency
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = concurrency + reserve
    unlimited = resource.RLIM_INFINITY
    if soft != unlimited and soft < need:
        target = need if hard == unlimited else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != unlimited and soft < need:
        fitted = max(1, soft - reserve)
        print(f"warning: the open-file limit ({soft}) fits only {fitted} connections: "
              f"--concurrency lowered from {concurrency} (raise `ulimit -n` to go higher)",
              file=sys.stderr)
        return fitted
    return concurrency


def run(s: Settings) -> int:
    s.concurrency = fit_fd_limit(s.concurrency)
    try:
        return asyncio.run(Generator(s).main())
    except UsageError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except PreflightRefused as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
