"""`python -m payload generate`: the orchestrator.

Shape: one producer streams the input (never loading it whole) into a bounded queue;
`--concurrency` workers each take one prompt at a time through its attempts; a Limiter
gates how many are in flight (shared pause + AIMD window); a Budget gates what may be
spent. Memory is therefore bounded by the concurrency, not the input size: the only
thing that grows with the input is a set of 64-bit id hashes.

Exactly once: a record is written by one synchronous append+flush on the event loop (no
await between the decision and the write, so two writers can never interleave); resume
skips every id already in the output or errors file.

Exit codes: 0 finished · 2 bad usage or input · 3 stopped early and resumable.
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

import aiohttp

from ..errors import ExitCode, UsageError
from ..records import ALL, BadRecord, Prompt, Shard, errors_path, iter_lines, parse_prompt
from ..redact import redact
from . import client
from .budget import DEFAULT_PRICES, DEFAULT_WORST_COMPLETION_TOKENS, Budget, BudgetReached, Prices
from .client import Kind, Outcome
from .journal import IdSet, Index, Writer, drop_failures, encode_record, id_hash, load_index
from .limiter import Limiter, backoff_delay
from .preflight import PreflightRefused, check_endpoints
from .progress import Counters, Display, write_status

EXIT_OK, EXIT_USAGE, EXIT_STOPPED = ExitCode.OK, ExitCode.USAGE, ExitCode.STOPPED
STATUS_EVERY_S = 2.0
MAX_BAD_LINE_REPORTS = 1000


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
    shard: Shard = ALL
    retry_failed: bool = False
    request_timeout: float = 600.0
    max_attempts: int = 6
    backoff_base: float = 1.0
    drain_timeout: float = 60.0
    preflight: bool = True

    @property
    def errors(self) -> Path:
        return errors_path(self.output)


def _count_lines(path: Path) -> int:
    """A fast estimate of the record count (newlines), for the ETA before EOF is reached."""
    n = 0
    last = b"\n"
    with path.open("rb") as fh:
        while chunk := fh.read(8 * 1024 * 1024):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


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


class Generator:
    def __init__(self, s: Settings) -> None:
        self.s = s
        self.c = Counters()
        self.limiter = Limiter(s.concurrency)
        self.budget = Budget(s.max_cost)
        self.prices = Prices(*DEFAULT_PRICES)
        self.worst_completion = s.max_tokens or DEFAULT_WORST_COMPLETION_TOKENS
        self.index = Index()
        self.claimed = IdSet()
        self.stop_event = asyncio.Event()
        self.stop_reason: str | None = None
        self.exit_code = EXIT_OK
        self.writer: Writer | None = None
        self.headers = {"Authorization": f"Bearer {s.api_key}",
                        "Content-Type": "application/json", "X-Title": "handoff"}
        self.url = s.base_url.rstrip("/") + "/chat/completions"
        self.timeout = aiohttp.ClientTimeout(total=s.request_timeout, sock_connect=60)
        self.proxy = client.env_proxy(self.url)
        self.workers: list[asyncio.Task[None]] = []
        self.session: aiohttp.ClientSession | None = None
        self._bad_reports = 0

    # -- stopping ------------------------------------------------------------------------------
    def request_stop(self, reason: str, message: str) -> None:
        """Stop dispatching; in-flight requests finish (drained by `main`)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self.c.last_error = redact(message)
            print(redact(message), file=sys.stderr, flush=True)
        self.exit_code = EXIT_STOPPED
        self.stop_event.set()

    @property
    def stopping(self) -> bool:
        return self.stop_event.is_set()

    # -- the pipeline --------------------------------------------------------------------------
    async def produce(self, queue: asyncio.Queue[Prompt | None]) -> None:
        s, c = self.s, self.c
        owned = 0
        since_yield = 0
        for line_no, line in iter_lines(s.input):
            if self.stopping:
                return
            try:
                prompt = parse_prompt(line, line_no)
            except BadRecord as exc:
                c.bad_lines += 1
                if self._bad_reports < MAX_BAD_LINE_REPORTS:
                    self._bad_reports += 1
                    print(f"{s.input}: line {line_no}: bad record skipped: {exc}",
                          file=sys.stderr)
                continue
            if not s.shard.owns(prompt.key):
                continue
            h = id_hash(prompt.key)
            if h in self.index.done or h in self.index.failed:
                owned += 1  # recorded by an earlier run
                continue
            if h in self.claimed:
                c.duplicates += 1
                print(f"{s.input}: line {line_no}: duplicate id {prompt.key!r} skipped",
                      file=sys.stderr)
                continue
            self.claimed.add(h)
            owned += 1
            await queue.put(prompt)
            since_yield += 1
            if since_yield >= 256:  # put() does not yield while the queue has room
                since_yield = 0
                await asyncio.sleep(0)
        c.total = owned

    async def work(self, queue: asyncio.Queue[Prompt | None]) -> None:
        while not self.stopping:
            prompt = await queue.get()
            if prompt is None:
                return
            await self.handle(prompt)

    async def _sleep_unless_stopped(self, delay: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stop_event.wait(), delay)

    async def handle(self, p: Prompt) -> None:
        s, c = self.s, self.c
        assert self.session is not None and self.writer is not None
        body = json.dumps(client.build_body(
            p.messages, model=s.model, provider=s.provider, max_tokens=s.max_tokens,
            temperature=s.temperature, top_p=s.top_p, reasoning=s.reasoning),
            ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        # The body's length in characters bounds the prompt's token count from above.
        worst = self.prices.worst_case(len(body), self.worst_completion)
        attempts = 0
        last: Outcome | None = None
        while True:
            await self.limiter.acquire()
            if self.stopping:
                self.limiter.release()
                return
            try:
                reserved = await self.budget.reserve(worst)
            except BudgetReached as exc:
                self.limiter.release()
                self.request_stop("budget", f"stopping: {exc}; the run is resumable "
                                  "(raise --max-cost and rerun the same command)")
                return
            attempts += 1
            c.in_flight += 1
            try:
                outcome = await client.attempt(self.session, self.url, body, self.headers,
                                               self.timeout, self.proxy)
            finally:
                c.in_flight -= 1
            self.limiter.release(success=outcome.kind is Kind.OK, throttled=outcome.throttled,
                                 retry_after=outcome.retry_after)
            unknown = outcome.type in ("timeout", "connection")  # may have been billed
            self.budget.settle(reserved, outcome.cost if outcome.cost is not None
                               else (reserved if unknown else 0.0))
            if outcome.kind is Kind.OK:
                self._record_ok(p, outcome, attempts)
                return
            if outcome.cost:
                c.cost += outcome.cost
            c.errors_by_kind[outcome.type] += 1
            c.last_error = f"{outcome.status or ''} {outcome.type}: {outcome.message}".strip()
            if outcome.kind is Kind.AUTH:
                self.request_stop("auth", f"the API key was refused (401: {outcome.message}); "
                                  "check the key file / $OPENROUTER_API_KEY. Nothing more is "
                                  "sent; the run is resumable.")
                self._cancel_workers()
                return
            if outcome.kind is Kind.CREDIT:
                self.request_stop("credit", "out of credit or key limit reached (402: "
                                  f"{outcome.message}); in-flight requests finish, the run is "
                                  "resumable with the same command once credit is added.")
                return
            if outcome.kind is Kind.PERMANENT:
                self._record_error(p, outcome, attempts)
                return
            last = outcome
            if attempts >= s.max_attempts:
                self._record_error(p, last, attempts, gave_up=True)
                return
            if self.stopping:
                return
            c.retries += 1
            await self._sleep_unless_stopped(
                backoff_delay(attempts, s.backoff_base, retry_after=outcome.retry_after))
            if self.stopping:
                return

    def _record_ok(self, p: Prompt, o: Outcome, attempts: int) -> None:
        r = o.result
        usage = r["usage"]
        line = encode_record({
            "id": p.id, "usage": usage, "response": r["response"], "reasoning": r["reasoning"],
            "finish_reason": r["finish_reason"], "provider": r["provider"],
            "model": r["model"], "latency_s": round(o.latency_s, 3), "attempts": attempts,
            "messages": p.messages})
        assert self.writer is not None
        self.writer.write_output(line)
        c = self.c
        c.done += 1
        c.done_this_run += 1
        if o.cost:
            c.cost += o.cost
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        c.prompt_tokens += pt if isinstance(pt, int) else 0
        c.completion_tokens += ct if isinstance(ct, int) else 0
        c.tokens_this_run += ct if isinstance(ct, int) else 0

    def _record_error(self, p: Prompt, o: Outcome, attempts: int, *, gave_up: bool = False
                      ) -> None:
        message = o.message
        if gave_up:
            message = f"gave up after {attempts} attempts; last: {message}"
        line = encode_record({"id": p.id, "error": {"status": o.status, "type": o.type,
                                                    "message": redact(message)},
                              "attempts": attempts})
        assert self.writer is not None
        self.writer.write_error(line)
        self.c.failed += 1

    def _cancel_workers(self) -> None:
        current = asyncio.current_task()
        for task in self.workers:
            if task is not current:
                task.cancel()

    async def _tick(self, display: Display) -> None:
        while True:
            await asyncio.sleep(STATUS_EVERY_S)
            write_status(self.s.status_file, self.c)
            display.update()

    def _on_signal(self, signame: str) -> None:
        if self.stop_reason == "signal":
            print(f"{signame} again: not waiting for in-flight requests", file=sys.stderr)
            self._cancel_workers()
            return
        self.request_stop("signal", f"{signame}: stopping; waiting up to "
                          f"{self.s.drain_timeout:g}s for in-flight requests (resumable)")

    # -- main ----------------------------------------------------------------------------------
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
        self.budget = Budget(s.max_cost, already_spent=c.cost)
        if s.shard.count == 1:
            c.total = _count_lines(s.input)
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
                    prices, max_completion = await check_endpoints(
                        session, s.base_url, s.model, s.provider, self.headers)
                    if prices is not None:
                        self.prices = prices
                    if s.max_tokens is None and max_completion:
                        self.worst_completion = max_completion
                if self.budget.reached:
                    self.request_stop("budget", f"budget ${s.max_cost:g} already spent "
                                      f"(${c.cost:.4f} recorded); raise --max-cost to go on")
                else:
                    await self._run_pipeline(display)
            completed = True
        finally:
            self.writer.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            c.in_flight = 0
            if self.stop_reason is not None:
                c.state = "stopped"
            elif not completed:
                c.state = "aborted"
            else:
                c.state = "finished"
            write_status(s.status_file, c)
            display.stop()
        return self.exit_code

    async def _run_pipeline(self, display: Display) -> None:
        s = self.s
        # Room for one sentinel per worker once emptied: stopping never blocks on a full queue.
        queue: asyncio.Queue[Prompt | None] = asyncio.Queue(maxsize=max(64, s.concurrency))
        write_status(s.status_file, self.c)
        display.start()
        ticker = asyncio.create_task(self._tick(display))
        self.workers = [asyncio.create_task(self.work(queue)) for _ in range(s.concurrency)]
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
