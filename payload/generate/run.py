"""`python -m payload generate`: the orchestrator.

Shape: a survey reads the input once (valid records, bad lines, this shard's total) before
anything is sent; then one producer streams it (never loading it whole) into a bounded
queue; `--concurrency` workers each take one prompt at a time through its attempts
(`attempts`; with `--turns all` a conversation, turn after turn, resumed from the turn
journal); a Limiter gates how many are in flight (slow start, throttling, the outage
breaker); a Budget gates what may be spent; the `recorder` writes what comes back; `stop`
holds the one decision to stop. Memory is bounded by the concurrency, not the input
size: the only thing that grows with the input is a set of 64-bit id hashes.

Exactly once: a record is written by one synchronous append on the event loop (no await
between the decision and the write, so two writers can never interleave); resume skips
every id already in the output or errors file.

Everything the run says goes through one `Reporter`. Exit codes: 0 finished · 1 finished
with more failures than --max-failed · 2 bad usage or input · 3 stopped early and
resumable (key refused, credit, budget, signal, a systematic error, an outage longer
than --outage-timeout, a full disk).
"""

from __future__ import annotations

import asyncio
import gc
import signal
import time

import aiohttp

from payload.errors import ExitCode, PayloadError, UsageError
from payload.generate import client
from payload.generate.attempts import Attempts, Endpoint
from payload.generate.batch import BatchRun, check_mode
from payload.generate.budget import DEFAULT_FIRST_EXPECTATION, DEFAULT_PRICES, Budget, Prices
from payload.generate.inputs import BadLines, Survey, survey
from payload.generate.journal import IdSet, Index, Writer, drop_failures, id_hash, load_index
from payload.generate.limiter import Limiter
from payload.generate.metrics import metrics_for
from payload.generate.outage import Breaker
from payload.generate.preflight import check_endpoints
from payload.generate.progress import Counters, Display, StatusWriter, carried
from payload.generate.recorder import Recorder
from payload.generate.settings import (
    FIRST_COMPLETION_GUESS,
    Settings,
    check_paths,
    token_ids_for,
)
from payload.generate.stop import Stop
from payload.generate.streaming import Timeouts, Watchdog
from payload.generate.turns import Turn, load_turns
from payload.records import BadRecord, Prompt, iter_input, parse_prompt
from payload.report import Reporter

# Spare workers (`_spawn_spares`): looked for this often, at most this many per slot.
SPARE_CHECK_S = 0.02
SPARES_PER_SLOT = 8
# Once its requests are closed, a worker records nothing more and ends within a loop turn or
# two; one still busy after this is cancelled (it was not waiting on a request).
CLOSE_GRACE_S = 5.0
# The garbage collector's thresholds while a run goes. A request allocates hundreds of
# objects, nearly all freed within its round trip; at CPython's first threshold (700) a
# collection ran every request or two and moved every in-flight request's objects to the
# older generations, whose collections walk the whole heap: 15% of the client's CPU on a
# fast server, 18% at 20% refused with Retry-After 1 (prompts waiting a second are more
# objects alive). Cyclic garbage waits a little longer: at most some thousands of objects.
GC_THRESHOLDS = (10_000, 20, 20)


class Generator:
    def __init__(self, s: Settings, reporter: Reporter | None = None) -> None:
        self.s = s
        self.say = reporter or Reporter()
        self.c = Counters(max_cost=s.max_cost)
        self.breaker = Breaker()
        self.limiter = Limiter(s.concurrency, breaker=self.breaker, left=self._left)
        self.stop = Stop(self.c, self.limiter, self.say)
        self.budget = Budget(s.max_cost)
        self.prices: Prices | None = s.prices
        self.index = Index()
        self.claimed = IdSet()
        # Prompts in the queue (its sentinels left out): what a spare worker could take.
        self.queued = 0
        metrics = metrics_for(s.status_file, s.status_every, s.output, s.errors)
        self.status = StatusWriter(s.status_file, self.say,
                                   metrics.tick if metrics is not None else None)
        self.bad = BadLines(s.input, self.say)
        self.headers = {"Authorization": f"Bearer {s.api_key}",
                        "Content-Type": "application/json", "X-Title": "handoff"}
        self.recorder: Recorder | None = None
        # The streams' timeouts (--stream auto/on); its streams' progress is liveness too.
        self.streams = None if s.stream == "off" else Watchdog(Timeouts(
            s.idle_timeout, s.first_token_timeout, s.request_timeout))
        self.resumed: dict[int, list[Turn]] = {}  # --turns all: journaled turns by id hash
        self._mean_line_bytes = 0

    def _left(self) -> int | None:
        """Prompts not yet answered (the limiter's end-of-run test), once the survey says."""
        c = self.c
        return None if c.total is None else max(0, c.total - c.done - c.failed)

    # -- the pipeline --------------------------------------------------------------------------
    async def produce(self, queue: asyncio.Queue[Prompt | None]) -> None:
        """Feed the workers. Bad lines and duplicates were reported by the survey: skipped
        quietly here."""
        s = self.s
        since_yield = 0
        for line_no, text in iter_input(s.input):
            if self.stop.stopping:
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
            self.queued += 1
            since_yield += 1
            if since_yield >= 256:  # put() does not yield while the queue has room
                since_yield = 0
                await asyncio.sleep(0)

    async def work(self, queue: asyncio.Queue[Prompt | None], attempts: Attempts) -> None:
        while not self.stop.stopping:
            prompt = await queue.get()
            if prompt is None:
                return
            self.queued -= 1
            await attempts.handle(prompt)

    async def _tick(self, display: Display) -> None:
        while True:
            await asyncio.sleep(self.s.status_every)
            self._watchdog()
            if self.status.write(self.c) is not None and self.status.disk_full:
                self.stop.abandon("disk_full", f"stopping: no space left on device writing "
                                  f"{self.s.status_file}; free space, then rerun the same "
                                  "command: it resumes")
            display.update()

    def _watchdog(self) -> None:
        """Outage and stall limits, and the live gauges of the status file."""
        c, b, now = self.c, self.breaker, time.monotonic()
        c.window = self.limiter.allowed
        c.capacity = self.limiter.found_capacity
        c.outages = b.outages
        if b.is_open:
            c.outage_s = b.open_for(now)
            c.last_error = (f"outage: the server has been failing for {c.outage_s:.0f}s; "
                            f"dispatch paused, probing (stops after {self.s.outage_timeout:g}s)")
        rec = self.recorder
        if rec is None:
            return
        # A stream still answering is no stall: an answer may take longer than the limit.
        stalled = now - max(rec.last_success, self.streams.progress_at if self.streams else 0.0)
        if (b.is_open and b.open_for(now) > self.s.outage_timeout) or (
                rec.failures_since_success and stalled > self.s.outage_timeout):
            what = "failing" if b.is_open else "answering only errors"
            self.stop.request("outage", f"stopping: the server has been {what} for "
                              f"{stalled:.0f}s (--outage-timeout {self.s.outage_timeout:g}s); "
                              "nothing was recorded as failed for it; rerun the same command "
                              "once the server is back: it resumes")

    # -- before the first request --------------------------------------------------------------
    def _survey(self) -> Survey:
        s, c = self.s, self.c
        t0 = time.monotonic()
        sv = survey(s.input, s.shard, self.index, self.bad, self.say)
        c.bad_lines, c.bad_line_samples = self.bad.count, self.bad.samples
        c.duplicates, c.total = sv.duplicates, sv.owned
        summary = self.bad.summary()
        if summary:
            self.say.say(summary)
        shard = "" if s.shard.count == 1 else f"; shard {s.shard} owns {sv.owned}"
        self.say.say(f"input: {sv.valid} valid records, {self.bad.count} bad lines, "
                     f"{sv.duplicates} duplicate ids{shard}; {sv.owned - sv.recorded} to do "
                     f"(read in {time.monotonic() - t0:.2f}s)")
        if sv.valid == 0:
            raise UsageError(
                f"no valid record in {s.input} ({sv.lines} non-blank lines, all bad; first: "
                + (f"line {self.bad.samples[0]['line']}: {self.bad.samples[0]['reason']}"
                   if self.bad.samples else "-")
                + "). Accepted shapes: {\"messages\": [...]}, ShareGPT {\"conversations\": "
                "[...]}, or {\"prompt\": \"text\"}, one JSON object per line (docs/records.md)")
        self._mean_line_bytes = max(1, s.input.stat().st_size // max(1, sv.lines))
        return sv

    def _resume(self) -> None:
        """`--retry-failed`, then the resume index: what is already recorded, and its cost."""
        s, c = self.s, self.c
        if s.retry_failed:
            dropped = drop_failures(s.errors, s.shard.owns)
            self.say.say(f"--retry-failed: {dropped} recorded failures will be retried")
        t0 = time.monotonic()
        self.index = load_index(s.output, s.errors, reporter=self.say)
        if s.turn_journal is not None:
            self.resumed = load_turns(s.turn_journal, self.index, self.say)
        if self.index.truncated_bytes:
            self.say.say(f"resume: cut a torn last line ({self.index.truncated_bytes} bytes)")
        c.done, c.failed = len(self.index.done), len(self.index.failed)
        c.cost, c.prompt_tokens = self.index.cost, self.index.prompt_tokens
        c.completion_tokens = self.index.completion_tokens
        c.by_provider, c.by_finish_reason = self.index.by_provider, self.index.by_finish_reason
        c.cancelled, c.cancelled_cost = carried(s.status_file)
        if c.done or c.failed or self.resumed:
            turns = (f", {sum(map(len, self.resumed.values()))} turns of "
                     f"{len(self.resumed)} conversations" if self.resumed else "")
            self.say.say(f"resume: {c.done} done, {c.failed} failed already recorded{turns} "
                         f"(index built in {time.monotonic() - t0:.2f}s)")

    def _first_expectation(self) -> float:
        """The budget's expected cost per request before any answer (docs/generator.md)."""
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
        # Requests closed before their answer by earlier runs may have been billed: their
        # reserves stay spent (docs/generator.md "Cancellation").
        self.budget = Budget(s.max_cost, already_spent=spent + c.cancelled_cost,
                             first_expectation=self._first_expectation())
        if s.max_cost is None:
            return
        if self.prices is None:
            self.say.say(f"budget: ${s.max_cost:g}; no prices are known for {s.model}, so it "
                         "is enforced from the usage.cost the server reports (if it reports "
                         "none, the budget cannot be enforced: give --prices)")
        else:
            c.budget_enforced = True
            held = (f", ${c.cancelled_cost:.4f} held for {c.cancelled} requests closed "
                    "before their answer" if c.cancelled_cost else "")
            self.say.say(f"budget: ${s.max_cost:g} (${spent:.4f} already spent{held}); first "
                         f"expectation ${self.budget.expectation:.4f} per request, then the "
                         "mean cost seen")

    # -- main ----------------------------------------------------------------------------------
    async def main(self) -> int:
        s, c, stop = self.s, self.c, self.stop
        token_ids_for(s.base_url, s.token_ids)  # --token-ids on for OpenRouter: exit 2
        check_paths(s)
        mode = check_mode(s, self.say)  # --mode batch|auto: docs/generator.md "Batch mode"
        self._resume()
        self.status.hold_reserve()
        try:
            sv = self._survey()
        except UsageError as exc:
            c.state, c.exit_code, c.stop_reason = "aborted", int(ExitCode.USAGE), "bad_input"
            c.last_error = str(exc)
            self.status.write(c, final=True)
            raise
        c.max_failed = s.max_failed.allowed(sv.owned)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.on_signal, sig.name, s.drain_timeout)
        connector = aiohttp.TCPConnector(limit=s.concurrency, limit_per_host=s.concurrency,
                                         ttl_dns_cache=300, enable_cleanup_closed=True)
        display = Display(c, self.say)
        writer = Writer(s.output, s.errors, s.turn_journal)
        completed: bool | None = False
        try:
            # trust_env stays off: it costs two thread hops per request (netrc and proxy
            # lookups). The proxy a container may need ($HTTPS_PROXY) is resolved once.
            async with aiohttp.ClientSession(connector=connector, raise_for_status=False,
                                             trust_env=False) as session:
                if s.preflight:
                    prices, _ = await check_endpoints(
                        session, s.base_url, s.model, s.provider, self.headers, self.say)
                    if self.prices is None:
                        self.prices = prices
                self._start_budget()
                self.recorder = Recorder(s, c, writer, self.budget, self.prices, self.stop,
                                         self.say)
                if self.budget.reached:
                    held = (f" + ${c.cancelled_cost:.4f} held for requests closed before "
                            "their answer" if c.cancelled_cost else "")
                    self.stop.request("budget", f"budget ${s.max_cost:g} already spent "
                                      f"(${c.cost:.4f} recorded{held}); raise --max-cost to go on")
                elif mode == "sync" or not await BatchRun(
                        s, c, stop, self.budget, self.recorder, self.index, self.status,
                        self.say, session, self.headers, display,
                        self._first_expectation()).run():
                    url = s.base_url.rstrip("/") + "/chat/completions"
                    endpoint = Endpoint(session, url, self.headers, aiohttp.ClientTimeout(
                        total=s.request_timeout, sock_connect=60), client.env_proxy(url),
                        self.streams)
                    await self._run_pipeline(display, endpoint)
                if not self.stop.stopping and self.recorder.systematic.at_end():
                    self.stop.request("systematic_error", self.recorder.systematic.describe())
            completed = True
        except PayloadError as exc:  # e.g. the preflight refused the filter: say so in the status
            stop.exit_code, c.last_error = exc.exit_code, str(exc)
            completed = None
            raise
        finally:
            writer.close()
            self.limiter.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            self._conclude(completed)
            display.stop()
        return int(self.stop.exit_code)

    def _conclude(self, completed: bool | None) -> None:
        """The final state and exit code, in the status file (fsynced, from the reserve).
        `completed` is None after an expected failure (its code is already set), False
        after a crash (exit 1)."""
        s, c, stop = self.s, self.c, self.stop
        c.in_flight = 0
        c.window = self.limiter.allowed
        if stop.reason is not None:
            c.state = "stopped"
        elif completed is None:
            c.state = "aborted"
        elif not completed:
            c.state, stop.exit_code = "aborted", ExitCode.FAILED
        else:
            c.state = "finished"
            if c.max_failed is not None and c.failed > c.max_failed:
                stop.exit_code = ExitCode.FAILED
                c.last_error = (f"{c.failed} of {c.total} ids failed, more than "
                                f"--max-failed {s.max_failed} ({c.max_failed}); they are in "
                                f"{s.errors}: rerun with --retry-failed to ask them again")
                self.say.say(c.last_error)
        c.exit_code = int(stop.exit_code)
        self.status.write(c, final=True)
        self.status.release_reserve()

    async def _run_pipeline(self, display: Display, endpoint: Endpoint) -> None:
        s, stop = self.s, self.stop
        assert self.recorder is not None
        attempts = Attempts(s, self.c, self.limiter, self.breaker, self.budget, self.recorder,
                            stop, endpoint, self.say, self.resumed)
        # More workers than slots: a prompt that waits out a throttle without a slot (sporadic
        # throttling, a long Retry-After, a backoff) keeps its worker, and the slots it left
        # should still fill.
        n_workers = s.concurrency + s.concurrency // 4 + 8
        # Room for one sentinel per worker once emptied: stopping never blocks on a full queue.
        queue: asyncio.Queue[Prompt | None] = asyncio.Queue(maxsize=max(64, n_workers))
        self.status.write(self.c)
        display.start()
        ticker = asyncio.create_task(self._tick(display))
        workers = [asyncio.create_task(self.work(queue, attempts)) for _ in range(n_workers)]
        spares: set[asyncio.Task[None]] = set()
        stop.workers = set(workers)  # (and the spares while they run)
        spawner = asyncio.create_task(self._spawn_spares(queue, attempts, spares))
        attempts.slot_left = lambda: self._start_spares(queue, attempts, spares)
        producer = asyncio.create_task(self.produce(queue))
        stop_wait = asyncio.create_task(stop.event.wait())
        workers_done = asyncio.create_task(asyncio.wait(workers))
        feeder: asyncio.Task[None] | None = None
        try:
            await asyncio.wait({producer, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not stop.stopping:
                producer.result()  # surface a read error
                feeder = asyncio.create_task(self._feed_sentinels(queue, len(workers)))
                await asyncio.wait({workers_done, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                while not stop.stopping and any(not t.done() for t in spares):
                    await asyncio.wait({stop_wait, *spares}, return_when=asyncio.FIRST_COMPLETED)
            if stop.stopping:
                await self._drain(queue, producer, feeder, workers, spares)
        finally:
            for task in (ticker, spawner, producer, stop_wait, workers_done, feeder, *workers,
                         *spares):
                if task is not None:
                    task.cancel()
            await asyncio.gather(ticker, spawner, producer, stop_wait, workers_done, *workers,
                                 *spares, *([feeder] if feeder else []), return_exceptions=True)
        for task in [*workers, *spares]:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _spawn_spares(self, queue: asyncio.Queue[Prompt | None], attempts: Attempts,
                            spares: set[asyncio.Task[None]]) -> None:
        """Prompts wait in the queue, slots are free and no worker waits for one: every
        worker is waiting out a throttle without its slot (at 20% refused with Retry-After
        1 on a fast server, more prompts than the workers). A worker that gives its slot
        back to wait starts a spare at once (`Attempts.slot_left`); this looks every
        SPARE_CHECK_S for the rest (a kept slot taken back, the window grown)."""
        while True:
            await asyncio.sleep(SPARE_CHECK_S)
            for task in [t for t in spares if t.done()]:
                spares.discard(task)
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            self._start_spares(queue, attempts, spares)

    def _start_spares(self, queue: asyncio.Queue[Prompt | None], attempts: Attempts,
                      spares: set[asyncio.Task[None]]) -> None:
        """A spare worker per free slot no worker waits for, while prompts are queued; a
        spare takes prompts only while the queue has them, then ends. (Found only by the
        look every SPARE_CHECK_S, a slot left by a throttled prompt stood empty up to
        20 ms, a round trip or more on a fast server.)"""
        if self.stop.stopping:
            return
        # Prompts, not the queue's size: once the input is read the queue holds the
        # workers' sentinels, and a spare per free slot for each would only churn.
        n = min(self.limiter.unclaimed, self.queued,
                SPARES_PER_SLOT * self.s.concurrency - len(spares))
        for _ in range(n):
            task = asyncio.create_task(self.work_spare(queue, attempts))
            spares.add(task)
            self.stop.workers.add(task)
            task.add_done_callback(self.stop.workers.discard)

    async def work_spare(self, queue: asyncio.Queue[Prompt | None], attempts: Attempts) -> None:
        while not self.stop.stopping:
            try:
                prompt = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if prompt is None:  # a regular worker's: put it back (the room it left)
                queue.put_nowait(None)
                return
            self.queued -= 1
            await attempts.handle(prompt)

    @staticmethod
    async def _feed_sentinels(queue: asyncio.Queue[Prompt | None], n: int) -> None:
        for _ in range(n):
            await queue.put(None)

    async def _drain(self, queue: asyncio.Queue[Prompt | None], producer: asyncio.Task[None],
                     feeder: asyncio.Task[None] | None, workers: list[asyncio.Task[None]],
                     spares: set[asyncio.Task[None]]) -> None:
        """Stop dispatching; give in-flight requests `--drain-timeout` to finish and be
        written, then close the rest (docs/generator.md "Cancellation"). A stop that closed
        them already (budget, credit) finds the workers ending at once."""
        producer.cancel()
        if feeder is not None:
            feeder.cancel()
        await asyncio.gather(producer, *([feeder] if feeder else []), return_exceptions=True)
        while not queue.empty():
            queue.get_nowait()
        self.queued = 0
        for _ in workers:
            queue.put_nowait(None)
        _, pending = await asyncio.wait([*workers, *spares], timeout=self.s.drain_timeout)
        if not pending:
            return
        closed = self.stop.requests.close()
        if closed:
            self.say.say(f"drain: {closed} requests still in flight after "
                         f"{self.s.drain_timeout:g}s were closed (asked again on resume)")
        _, pending = await asyncio.wait(pending, timeout=CLOSE_GRACE_S)
        if pending:  # not waiting on a request (a long backoff, a place at the server)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)


def fit_fd_limit(concurrency: int, reporter: Reporter, reserve: int = 256) -> int:
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
        reporter.warn(f"the open-file limit ({soft}) fits only {fitted} connections: "
                      f"--concurrency lowered from {concurrency} (raise `ulimit -n` to go "
                      "higher)")
        return fitted
    return concurrency


def run(s: Settings, reporter: Reporter | None = None) -> int:
    """Run `generate`; expected failures raise a PayloadError (the CLI maps it to its code)."""
    reporter = reporter or Reporter()
    s.concurrency = fit_fd_limit(s.concurrency, reporter)
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        return asyncio.run(Generator(s, reporter).main())
    finally:
        gc.set_threshold(*before)
