"""`generate --mode batch|auto`: the prompts through an OpenAI-compatible Batch API, at the
batch price, into the same output and errors files as a synchronous run.

The input is split into batches within the provider's limits (`--batch-requests`,
`--batch-bytes`); each line's `custom_id` is the record's id (`str(id)`) and its body the
request a synchronous run sends (`client.build_body`). Every batch is written to the
job's ledger (`batchstate`, `batches.json`) before the provider can act on it, so a killed
run, a relaunch or `payload batches --cancel` finds the same batches again and never
submits the same requests twice. Live batches are polled with backoff (`--batch-poll`
growing to `--batch-poll-max` while nothing changes); an ended batch's output and error
files are turned into records by the synchronous run's own recorder (`Recorder.success`,
`.failure`, the systematic-error detector), each id exactly once: an id already recorded
is skipped, so collecting a batch twice (a kill between its records and the ledger) writes
nothing twice.

A line's outcome is classified like a synchronous answer (`client.classify_body` on its
status and body): an answer is recorded; a permanent error goes to the errors file
(through the systematic-error detector); a retryable one (429, 5xx, an empty answer) and
every line a batch left unanswered (expired, cancelled, a batch that failed) are asked
again in a later batch, a retryable one at most `--max-attempts` times.

The budget (`--max-cost`) is checked before each batch is submitted: it goes only when
what is spent, plus the expected cost of every request still at the provider, plus this
batch's, fits; the expectation is the synchronous one scaled by `--batch-price` until the
first answers, then the mean cost the answers report. A batch smaller than
`--batch-requests` is sent when only that much fits.

Stopping: SIGTERM/SIGINT (and a systematic error) cancel the live batches, wait up to
`CANCEL_WAIT_S` (or `--drain-timeout`, if shorter) for them to end and record what they
answered; what is still cancelling is collected by the next run, the rest asked again.
Out of credit, the budget, a batch refused or failed: nothing more is submitted and the
live batches are waited for. A refused key, an unreachable server (past
`--outage-timeout`) or a full disk end the run at once, the batches left live for the next
run to collect.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import aiohttp

from payload.errors import UsageError
from payload.generate import client
from payload.generate.batchapi import ENDPOINT, ApiError, BatchAPI, BatchInfo
from payload.generate.batchstate import Entry, Ledger
from payload.generate.budget import Budget, Prices
from payload.generate.client import Kind, Outcome
from payload.generate.journal import IdSet, Index, id_hash
from payload.generate.progress import Counters, Display, StatusWriter
from payload.generate.recorder import Recorder
from payload.generate.settings import Settings
from payload.generate.stop import Stop
from payload.generate.systematic import Held
from payload.records import BadRecord, Prompt, decode_line, parse_prompt
from payload.report import Reporter

T = TypeVar("T")

MODES = ("sync", "batch", "auto")
# Stops that cancel the live batches (and record what they answered by the drain timeout)
# and stops that wait for them to end; any other stop leaves them live for the next run.
CANCEL_ON = frozenset({"signal", "systematic_error"})
WAIT_ON = frozenset({"budget", "credit", "batch_refused", "batch_failed"})
# Line errors that say the batch ended before the line ran: asked again, no attempt spent.
UNRUN = frozenset({"batch_expired", "batch_cancelled", "batch_failed"})
# How long a stop waits for the batches it cancelled to end (at most --drain-timeout): a
# provider may take minutes to cancel (OpenAI: up to 10), and `fab stop` waits 60 s for the
# process; what they answered is collected by the next run if not by this one.
CANCEL_WAIT_S = 20.0


class _Interrupted(Exception):
    """The run is stopping while a call was being retried."""


def check_mode(s: Settings, say: Reporter) -> str:
    """The mode this run takes, checked before anything is sent: `--turns all` cannot batch
    (each turn needs the one before); a synchronous run on a job whose batches may still be
    live at the provider would ask their prompts twice (exit 2, naming the way out)."""
    ledger = Ledger.load(s.batch_ledger) if s.mode != "batch" else None
    live = ledger.live if ledger is not None else []
    if s.turns == "all" and s.mode != "sync":
        if s.mode == "batch":
            raise UsageError("--mode batch cannot regenerate --turns all (each turn is asked "
                             "on the answer to the one before): use --mode sync")
        if not live:
            say.say("--mode auto with --turns all: every turn needs the answer to the one "
                    "before, which a batch cannot give; running synchronously")
            return "sync"
    if s.mode == "sync" and live:
        raise UsageError(f"{len(live)} batch(es) of this job ({s.batch_ledger}) may still be "
                         "live at the provider: a synchronous run would ask their prompts "
                         "again. Rerun with --mode batch (or auto) to collect them, or cancel "
                         "them first (`payload batches --cancel`, or `fab stop`)")
    return s.mode


class BatchRun:
    """One run's batches: submit what fits, poll, collect, until every prompt is recorded."""

    def __init__(self, s: Settings, counters: Counters, stop: Stop, budget: Budget,
                 recorder: Recorder, index: Index, status: StatusWriter, reporter: Reporter,
                 session: aiohttp.ClientSession, headers: dict[str, str], display: Display,
                 first_expectation: float) -> None:
        self.s = s
        self.c = counters
        self.stop = stop
        self.budget = budget
        self.rec = recorder
        self.index = index
        self.status = status
        self.say = reporter
        self.display = display
        self.api = BatchAPI(session, s.base_url, headers, client.env_proxy(s.base_url))
        self.first_expectation = first_expectation * s.batch_price
        self.ledger: Ledger | None = None
        self.claimed = IdSet()  # ids in live batches, or taken by the current scan
        # Ids asked again (unanswered, or a retryable error): id hash -> (times submitted, of
        # those ended by a retryable error). Only those: a first submission needs no entry.
        self.again: dict[int, tuple[int, int]] = {}
        self.released = 0  # ids a batch left unanswered since the current scan began
        self._scan: Iterator[tuple[Prompt, int]] | None = None
        self._scan_done = False
        self._ahead: tuple[Prompt, int, bytes] | None = None
        self._input: IO[bytes] | None = None
        self._offsets: dict[str, int] | None = None  # key -> offset, when the input moved
        self._fresh: set[int] = set()  # entries made by this process (no lost answer to find)
        self._collected_any = False  # any batch of this job answered: auto mode keeps batching
        self._fallback: str | None = None  # auto mode: why it runs synchronously after all
        # --token-ids: a batch cannot take back a field the server refuses, so only `on` asks.
        self.ask_ids = s.token_ids == "on"

    # -- the run ---------------------------------------------------------------------------
    async def run(self) -> bool:
        """True once the batch path ran (to its end, or a stop); False when `--mode auto`
        found no Batch API (the caller then runs synchronously)."""
        s = self.s
        ledger = Ledger.open(s.batch_ledger, s.base_url, s.model)
        if not ledger.live and not await self._has_batch_api():
            return False
        ledger.lock()
        self.ledger = ledger
        self.display.start()
        try:
            return await self._run(ledger)
        finally:
            ledger.unlock()
            if self._input is not None:
                self._input.close()

    async def _has_batch_api(self) -> bool:
        """`GET /batches`: whether to batch. Batch mode refuses a server without the API (exit
        2); auto mode says so and runs synchronously."""
        try:
            await self._retrying(self.api.probe)
        except ApiError as exc:
            if exc.outcome.kind is Kind.AUTH:
                raise UsageError(f"the API key was refused asking for the Batch API ({exc})") \
                    from None
            why = f"{self.s.base_url} has no usable Batch API (GET /batches: {exc.outcome.status} " \
                  f"{exc.outcome.type}: {exc.outcome.message[:200]})"
            if self.s.mode == "batch":
                raise UsageError(f"--mode batch: {why}; use --mode sync, or auto") from None
            self.say.say(f"--mode auto: {why}; running synchronously")
            return False
        return True

    async def _run(self, ledger: Ledger) -> bool:
        s, c, stop = self.s, self.c, self.stop
        # The prices of an answer without usage.cost, and the expectation, at the batch price.
        prices, first = self.rec.prices, self.budget.first_expectation
        if prices is not None:
            self.rec.prices = Prices(prices.prompt * s.batch_price,
                                     prices.completion * s.batch_price,
                                     prices.request * s.batch_price)
        self.budget.first_expectation = self.first_expectation
        live = ledger.live
        self._collected_any = any(e.recorded for e in ledger.entries)
        for e in live:  # their requests are at the provider (or may be): counted, not asked
            for key in ledger.iter_ids(e):
                self.claimed.add(id_hash(key))
            self.budget.in_flight += e.requests
        self.say.say(f"batch: up to {s.batch_requests} requests and {s.batch_bytes} bytes a "
                     f"batch to {s.base_url}; expected ${self.budget.expectation:.6f} a request "
                     f"at the batch price (x{s.batch_price:g})"
                     + (f"; re-attaching to {len(live)} live batch(es) of {ledger.path}"
                        if live else ""))
        c.batches = ledger.summary()
        try:
            await self._loop(ledger)
        except _Interrupted:
            pass
        except ApiError as exc:
            self._api_failed(exc)
        if self._fallback is not None:
            if ledger.live:  # later batches of the same kind: cancelled, not waited for
                await self._cancel_and_collect(min(s.drain_timeout, CANCEL_WAIT_S))
            if not ledger.live:
                self.say.say(f"--mode auto: {self._fallback}; running the rest synchronously")
                self.rec.prices, self.budget.first_expectation = prices, first
                c.batches = ledger.summary()
                return False
            stop.request("batch_failed", f"stopping: {self._fallback}; its other batches are "
                         "still ending: rerun the same command to collect them")
        if ledger.live and (stop.reason in CANCEL_ON or stop.signals):
            await self._cancel_and_collect(min(s.drain_timeout, CANCEL_WAIT_S))
        c.in_flight = sum(e.requests for e in ledger.live)
        c.batches = ledger.summary()
        if ledger.live:
            self.say.say(f"batch: {len(ledger.live)} batch(es) left live at the provider "
                         f"({c.in_flight} requests): the next run of this command collects "
                         "them (`payload batches --cancel`, or `fab stop`, cancels them)")
        return True

    async def _loop(self, ledger: Ledger) -> None:
        """Submit what fits, poll, collect; until every prompt is recorded or the run stops
        (a stop that waits, WAIT_ON, still polls the submitted batches to their end)."""
        s, stop = self.s, self.stop
        poll = s.batch_poll
        while self._fallback is None:
            changed = False
            try:
                if not stop.stopping:
                    await self._advance_unsent()
                    await self._submit_what_fits()
                changed = await self._poll()
            except ApiError as exc:
                self._api_failed(exc)
            self._show()
            if self._fallback is not None or self._interrupted():
                return
            if stop.stopping:
                if not any(e.step == "submitted" for e in ledger.live):
                    return  # nothing at the provider to wait for (unsent ones: next run)
            elif self._scan_done and self.released and (
                    not ledger.live or self.released >= s.batch_requests):
                # Ids to ask again: a new pass once nothing else is live, or once they fill
                # a batch (a pass reads the whole input: not one per stray retry).
                self._rescan()
                continue
            elif not ledger.live and (self._scan_done or not await self._budget_room()):
                return
            poll = s.batch_poll if changed else min(s.batch_poll_max, poll * 1.5)
            if stop.stopping:  # waiting for the live batches: the stop must not cut the wait
                await asyncio.sleep(poll)
            else:
                await stop.sleep(poll)

    async def _budget_room(self) -> bool:
        """Nothing live, prompts left, and not even one fits: the budget is spent."""
        if self._fits() > 0:
            return True
        b = self.budget
        self.stop.request("budget", f"stopping: budget ${b.max_cost:g} reached (spent "
                          f"${b.spent:.4f}; one more request is expected to cost "
                          f"${b.expectation:.4f} at the batch price); the run is resumable "
                          "(raise --max-cost and rerun the same command)")
        return False

    def _api_failed(self, exc: ApiError) -> None:
        """A call that cannot succeed by retrying: the key, credit, or the server's refusal
        (auto mode, before any batch was answered: run synchronously instead)."""
        o = exc.outcome
        if o.kind is Kind.PERMANENT and self.s.mode == "auto" and not self._collected_any:
            self._fallback = f"the provider refused the batch ({exc})"
        elif o.kind is Kind.AUTH:
            self.stop.abandon("auth", f"the API key was refused ({exc}); check the key file / "
                              "$OPENROUTER_API_KEY. The batches stay at the provider; the run "
                              "is resumable.")
        elif o.kind is Kind.CREDIT:
            self.stop.request("credit", f"out of credit or key limit reached ({exc}); the run "
                              "is resumable once credit is added")
        else:
            self.stop.request("batch_refused", f"stopping: the provider refused a batch call "
                              f"({exc}); fix the cause and rerun the same command (it resumes)")

    # -- what goes into a batch ----------------------------------------------------------------
    def _fits(self) -> int:
        """How many more requests the budget admits now (every live one counted)."""
        b = self.budget
        if b.max_cost is None:
            return 1 << 62
        exp = b.expectation
        room = b.max_cost - b.spent - b.in_flight * exp
        return int((room + 1e-12) // exp) if exp > 0 else 1 << 62

    def _scan_input(self) -> Iterator[tuple[Prompt, int]]:
        """The prompts still to ask, in input order, each with its line's byte offset."""
        s, index = self.s, self.index
        with s.input.open("rb") as fh:
            offset = line_no = 0
            for raw in fh:
                line_no += 1
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                text = decode_line(raw)
                if isinstance(text, BadRecord):
                    continue
                try:
                    p = parse_prompt(text, line_no)
                except BadRecord:
                    continue  # counted and said by the survey
                if not s.shard.owns(p.key):
                    continue
                h = id_hash(p.key)
                if h in index.done or h in index.failed or h in self.claimed:
                    continue
                self.claimed.add(h)
                yield p, start

    def _rescan(self) -> None:
        """Ids a batch left unanswered are asked again: a new pass over the input, with the
        live batches' ids (and everything recorded) left out."""
        assert self.ledger is not None
        self.claimed = IdSet()
        for e in self.ledger.live:
            for key in self.ledger.iter_ids(e):
                self.claimed.add(id_hash(key))
        self.released = 0
        self._scan, self._scan_done, self._ahead = None, False, None

    def _line(self, p: Prompt) -> bytes:
        s = self.s
        body = client.build_body(p.messages, model=s.model, provider=s.provider,
                                 max_tokens=s.max_tokens, temperature=s.temperature,
                                 top_p=s.top_p, reasoning=s.reasoning, seed=s.seed,
                                 token_ids=self.ask_ids)
        for field in ("stream", "stream_options"):  # a batch line is a plain request
            body.pop(field, None)
        line = {"custom_id": p.key, "method": "POST", "url": ENDPOINT, "body": body}
        return (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()

    def _take(self, n: int) -> tuple[list[tuple[Prompt, int]], list[bytes]]:
        """Up to `n` prompts still to ask whose requests fit `--batch-bytes` together."""
        s = self.s
        if self._scan is None:
            self._scan = self._scan_input()
        rows: list[tuple[Prompt, int]] = []
        lines: list[bytes] = []
        size = 0
        while len(rows) < n:
            if self._ahead is not None:
                p, offset, line = self._ahead
                self._ahead = None
            else:
                nxt = next(self._scan, None)
                if nxt is None:
                    self._scan_done = True
                    break
                p, offset = nxt
                line = self._line(p)
            if len(line) > s.batch_bytes:
                self._too_large(p, len(line))
                continue
            if size + len(line) > s.batch_bytes:
                self._ahead = (p, offset, line)
                break
            rows.append((p, offset))
            lines.append(line)
            size += len(line)
        return rows, lines

    def _too_large(self, p: Prompt, size: int) -> None:
        o = Outcome(Kind.PERMANENT, None, "request_too_large",
                    f"the request is {size} bytes: more than --batch-bytes {self.s.batch_bytes} "
                    "fits in no batch (raise --batch-bytes up to the provider's limit, or run "
                    "it with --mode sync)")
        self.rec.failure(p, o, 0)
        self.index.failed.add(id_hash(p.key))

    async def _submit_what_fits(self) -> None:
        assert self.ledger is not None
        while not self.stop.stopping and not self._scan_done:
            room = self._fits()
            if room <= 0:
                return
            rows, lines = self._take(min(room, self.s.batch_requests))
            if not rows:
                return
            e = self.ledger.new(len(rows), sum(map(len, lines)))
            self._fresh.add(e.n)
            self.ledger.write_ids(e, [(p.key, offset) for p, offset in rows])
            with self.ledger.requests_path(e).open("wb") as fh:
                fh.writelines(lines)
            self.budget.in_flight += e.requests  # admitted: counted until their answers settle
            self.ledger.save()  # prepared: recorded before anything is sent
            if self.stop.stopping:
                return  # a prepared batch: the next run sends it (this one cancels, below)
            await self._send(e)

    async def _advance_unsent(self) -> None:
        """Entries a killed run left prepared or uploaded: finished (found, or sent) first."""
        assert self.ledger is not None
        for e in self.ledger.live:
            if e.step in ("prepared", "uploaded") and not self.stop.stopping:
                await self._send(e)

    async def _send(self, e: Entry) -> None:
        """Upload the batch's requests and submit it, closing the gap a lost answer (or a
        kill) may have left: a file or batch the provider already holds is found, not made
        again. A permanent refusal abandons the batch (its ids are asked again)."""
        ledger = self.ledger
        assert ledger is not None
        try:
            if e.step == "prepared":
                found = None
                if e.n not in self._fresh:
                    found = await self._retrying(lambda: self.api.find_file(ledger.filename(e)))
                if found is None:
                    path = ledger.requests_path(e)
                    if not path.exists():
                        self._rebuild_requests(e, path)
                    found = await self._retrying(lambda: self.api.upload(path,
                                                                          ledger.filename(e)))
                e.file_id, e.step = found, "uploaded"
                ledger.save()
            if e.step == "uploaded":
                info = await self._create(e, look_first=e.n not in self._fresh)
                e.batch_id, e.step, e.submitted_at = info.id, "submitted", time.time()
                self._note(e, info)
                ledger.save()
                self.say.say(f"batch {e.n}: {info.id} submitted ({e.requests} requests, "
                             f"{e.bytes} bytes)")
        except ApiError as exc:
            if exc.outcome.kind is not Kind.PERMANENT:
                raise
            self._abandon(e, f"refused: {exc}")
            raise
        ledger.requests_path(e).unlink(missing_ok=True)

    async def _create(self, e: Entry, look_first: bool) -> BatchInfo:
        """POST /batches, at most once per batch: before a retry (the previous answer may have
        been lost after the provider made the batch) or after a kill, the provider's batches
        are searched for this one (by input file id, or metadata tag) first."""
        ledger = self.ledger
        assert ledger is not None and e.file_id is not None
        file_id = e.file_id
        look = look_first
        while True:
            if look:
                found = await self._retrying(lambda: self.api.find_batch(file_id,
                                                                         ledger.metadata(e)["handoff"]))
                if found is not None:
                    self.say.say(f"batch {e.n}: found {found.id} at the provider (its "
                                 "submission's answer was lost): re-attached, not submitted again")
                    return found
            try:
                return await self.api.create(file_id, ledger.metadata(e))
            except ApiError as exc:
                if exc.outcome.kind is not Kind.RETRY:
                    raise
                await self._retry_wait(exc)
                look = True

    async def _get(self, batch_id: str) -> BatchInfo:
        return await self._retrying(lambda: self.api.get(batch_id))

    async def _download(self, file_id: str, dest: Path) -> None:
        await self._retrying(lambda: self.api.content(file_id, dest))

    def _rebuild_requests(self, e: Entry, path: Path) -> None:
        """A prepared batch whose requests file a kill removed: rebuilt from its ids."""
        assert self.ledger is not None
        with path.open("wb") as fh:
            for key, offset in self.ledger.read_ids(e):
                p = self._prompt(key, offset)
                if p is not None:
                    fh.write(self._line(p))

    def _abandon(self, e: Entry, note: str) -> None:
        """A batch that never reached the provider: its ids are free again."""
        assert self.ledger is not None
        e.step, e.note, e.released = "done", note[:500], e.requests
        for _ in range(e.requests):
            self.budget.cancel()
        self.released += e.requests
        self.ledger.save()
        self.ledger.requests_path(e).unlink(missing_ok=True)

    # -- polling and collecting ----------------------------------------------------------------
    async def _poll(self) -> bool:
        """Every submitted live batch once; an ended one is collected. True when anything moved."""
        assert self.ledger is not None
        changed = False
        for e in self.ledger.live:
            if e.step != "submitted" or e.batch_id is None:
                continue
            try:
                info = await self._get(e.batch_id)
            except ApiError as exc:
                if exc.outcome.status != 404:
                    raise
                self.say.warn(f"batch {e.n}: the provider no longer knows {e.batch_id} ({exc}); "
                              "its prompts are asked again")
                self._abandon(e, f"unknown at the provider: {exc}")
                changed = True
                continue
            before = (e.status, e.completed, e.failed)
            self._note(e, info)
            if before != (e.status, e.completed, e.failed):
                changed = True
                if before[0] != e.status:
                    self.ledger.save()
            if info.terminal:
                await self._collect(e, info)
                changed = True
            if self.stop.stopping and self.stop.reason not in WAIT_ON | CANCEL_ON:
                break
        return changed

    @staticmethod
    def _note(e: Entry, info: BatchInfo) -> None:
        e.status, e.total, e.completed, e.failed = info.status, info.total, info.completed, \
            info.failed
        if info.ended_at is not None:
            e.ended_at = info.ended_at
        if info.errors:
            e.note = "; ".join(info.errors)[:500]

    async def _collect(self, e: Entry, info: BatchInfo) -> None:
        """An ended batch: its output and error files recorded, each id once; what it left
        unanswered asked again."""
        ledger = self.ledger
        assert ledger is not None
        keys = dict(ledger.read_ids(e))
        seen: set[str] = set()
        # A line's latency: from the batch's submission to its collection here (the provider
        # stamps whole seconds, and only per batch).
        now = time.time()
        latency = max(0.0, now - (e.submitted_at or info.created_at or now))
        answered_at = min(now, info.ended_at) if info.ended_at else now
        recorded = 0
        for which, file_id in (("output", info.output_file_id), ("errors", info.error_file_id)):
            if file_id is None:
                continue
            path = ledger.result_path(e, which)
            await self._download(file_id, path)
            try:
                for line in _result_lines(path):
                    cid = line.get("custom_id")
                    if not isinstance(cid, str) or cid not in keys or cid in seen:
                        continue
                    seen.add(cid)
                    recorded += self._record(e, cid, keys[cid], line, latency, answered_at)
                    if self.stop.reason in ("disk_full", "write_error"):
                        return  # nothing more can be written: the ledger keeps it live
            finally:
                path.unlink(missing_ok=True)
        for k in keys:
            if k not in seen:  # no line for it: never run (the batch failed, or a bad file)
                self.budget.cancel()
                h = id_hash(k)
                if h not in self.index.done and h not in self.index.failed:
                    sent, charged = self.again.get(h, (0, 0))
                    self.again[h] = (sent + 1, charged)
        e.step, e.recorded = "done", recorded
        # Neither answered nor failed for good (not run, or a retryable error): asked again.
        e.released = sum(1 for k in keys if id_hash(k) not in self.index.done
                         and id_hash(k) not in self.index.failed)
        self.released += e.released
        ledger.save()
        what = {"completed": "completed", "expired": "expired", "cancelled": "was cancelled",
                "failed": "failed"}.get(info.status, info.status)
        self.say.say(f"batch {e.n}: {info.id} {what}: {info.completed} answered, "
                     f"{info.failed} errors, {recorded} recorded"
                     + (f", {e.released} asked again later" if e.released else "")
                     + (f" ({e.note})" if info.status == "failed" and e.note else ""))
        if recorded:
            self._collected_any = True
        if info.status == "failed" and not recorded and not self.stop.stopping:
            if self.s.mode == "auto" and not self._collected_any:
                self._fallback = f"batch {info.id} failed at the provider ({e.note or 'no reason given'})"
                return
            self.stop.request("batch_failed", f"stopping: batch {info.id} failed at the "
                              f"provider: {e.note or 'no reason given'}; fix the cause and "
                              "rerun the same command (its prompts are asked again)")

    def _record(self, e: Entry, key: str, offset: int, line: dict[str, Any],
                latency: float, answered_at: float) -> int:
        """One result line through the synchronous run's recorder; 1 when it wrote a record."""
        index, rec, b = self.index, self.rec, self.budget
        h = id_hash(key)
        if h in index.done or h in index.failed:
            b.cancel()  # recorded already (a collect cut short by a kill): counted, not again
            return 0
        p = self._prompt(key, offset)
        if p is None:
            b.cancel()
            return 0
        sent, charged = self.again.pop(h, (0, 0))
        sent += 1
        o = _outcome(line, self.s.think_in_content)
        if o is None:  # the line never ran (expired, cancelled): asked again, no attempt spent
            b.cancel()
            self.again[h] = (sent, charged)
            return 0
        o.latency_s = latency
        o.answered_at = answered_at  # the batch's end, as the provider stamps it
        cost = rec.settle(o)
        seq = e.n + 1  # all of a batch's requests were "sent" at once
        if o.kind is Kind.OK:
            done = self.c.done
            rec.success(p, p.messages, o, cost, sent, seq)
            if self.c.done > done:
                index.done.add(h)
                return 1
            return 0
        rec.error_answer(o, cost)
        if o.kind is Kind.PERMANENT:
            index.failed.add(h)  # written now, or held by the detector (never asked again here)
            if rec.permanent(Held(p, o, sent, seq)):
                self.stop.request("systematic_error", rec.systematic.describe())
            return 1
        if o.kind is Kind.AUTH:
            self.stop.abandon("auth", f"the API key was refused in batch {e.batch_id} "
                              f"(401: {o.message}); the run is resumable")
        elif o.kind is Kind.CREDIT:
            self.stop.request("credit", f"out of credit or key limit reached in batch "
                              f"{e.batch_id} ({o.status} {o.type}: {o.message}); the run is "
                              "resumable once credit is added")
        else:
            charged += 1
            if charged >= self.s.max_attempts:
                failed = self.c.failed
                rec.failure(p, o, sent, gave_up=True)
                if self.c.failed > failed:
                    index.failed.add(h)
                    return 1
        self.again[h] = (sent, charged)
        return 0  # asked again in a later batch

    def _prompt(self, key: str, offset: int) -> Prompt | None:
        """The prompt of `key`, read back from the input at its offset (or found by a scan,
        when the input was edited since)."""
        if self._input is None:
            self._input = self.s.input.open("rb")
        for where in (offset, None):
            if where is None:
                if self._offsets is None:
                    self._offsets = self._index_input()
                where = self._offsets.get(key)
                if where is None:
                    break
            self._input.seek(where)
            text = decode_line(self._input.readline())
            if isinstance(text, BadRecord):
                continue
            try:
                p = parse_prompt(text, 0)
            except BadRecord:
                continue
            if p.key == key:
                return p
        self.say.warn(f"batch: id {key!r} is no longer in {self.s.input}: its answer is not "
                      "recorded")
        return None

    def _index_input(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self.s.input.open("rb") as fh:
            offset = 0
            for raw in fh:
                start, offset = offset, offset + len(raw)
                text = decode_line(raw)
                if isinstance(text, str) and text.strip():
                    try:
                        out.setdefault(parse_prompt(text, 0).key, start)
                    except BadRecord:
                        pass
        return out

    # -- stopping ------------------------------------------------------------------------------
    async def _cancel_and_collect(self, wait_s: float) -> None:
        """Cancel every live batch, wait up to `wait_s` for them to end, record what they
        answered; those still ending are collected by the next run."""
        assert self.ledger is not None
        await cancel_live(self.ledger, self.api, self.say)
        deadline = time.monotonic() + wait_s
        signals = self.stop.signals
        while self.ledger.live and time.monotonic() < deadline:
            if self.stop.signals > max(1, signals):  # the signal again: stop waiting
                return
            try:
                await self._poll()
            except (ApiError, _Interrupted):
                return
            self._show()
            if self.ledger.live:
                await asyncio.sleep(min(self.s.batch_poll, max(0.0, deadline - time.monotonic())))

    # -- plumbing ------------------------------------------------------------------------------
    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """A call retried while its failure is transient (network, 5xx, 429), up to
        `--outage-timeout`; a permanent one raises ApiError."""
        started = time.monotonic()
        while True:
            try:
                return await call()
            except ApiError as exc:
                if exc.outcome.kind is not Kind.RETRY:
                    raise
                if time.monotonic() - started > self.s.outage_timeout:
                    self.stop.request("outage", f"stopping: the Batch API has been failing for "
                                      f"{time.monotonic() - started:.0f}s ({exc}; "
                                      f"--outage-timeout {self.s.outage_timeout:g}s); rerun the "
                                      "same command once it is back: it resumes")
                    raise _Interrupted from None
                await self._retry_wait(exc)

    async def _retry_wait(self, exc: ApiError) -> None:
        o = exc.outcome
        self.c.errors_by_kind[o.type] += 1
        self.c.last_error = str(exc)[:500]
        n = self.c.errors_by_kind[o.type]
        delay = min(60.0, self.s.backoff_base * 2 ** min(n, 6))
        if o.retry_after is not None:
            delay = max(delay, o.retry_after)
        if self._interrupted():
            raise _Interrupted
        if self.stop.stopping:  # waiting for the live batches: the stop must not cut the wait
            await asyncio.sleep(delay)
        else:
            await self.stop.sleep(delay)
        if self._interrupted():
            raise _Interrupted

    def _interrupted(self) -> bool:
        """Stopping, and not (only) to wait for the live batches: a signal during that wait
        interrupts it too."""
        stop = self.stop
        return stop.stopping and (stop.reason not in WAIT_ON or stop.signals > 0)

    def _show(self) -> None:
        assert self.ledger is not None
        c = self.c
        c.in_flight = sum(e.requests for e in self.ledger.live)
        c.batches = self.ledger.summary()
        if self.status.write(c) is not None and self.status.disk_full:
            self.stop.abandon("disk_full", f"stopping: no space left on device writing "
                              f"{self.s.status_file}; free space, then rerun the same "
                              "command: it resumes")
        self.display.update()


def _result_lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict):
                yield line


def _outcome(line: dict[str, Any], think: str) -> Outcome | None:
    """A result line as a synchronous answer's Outcome; None for a line that never ran."""
    resp, err = line.get("response"), line.get("error")
    if isinstance(resp, dict) and "body" in resp:
        status = resp.get("status_code")
        status = status if isinstance(status, int) and not isinstance(status, bool) else 200
        body = resp["body"]
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        return client.classify_body(status, raw, None, content_type="application/json",
                                    think=think)
    code = err.get("code") if isinstance(err, dict) else None
    if code in UNRUN or not isinstance(err, dict):
        return None
    message = str(err.get("message") or code or "error")
    return Outcome(Kind.RETRY, None, str(code or "batch_error")[:60], message[:500])


async def cancel_live(ledger: Ledger, api: BatchAPI, say: Reporter) -> int:
    """Ask the provider to cancel every live batch of the ledger (one whose submission's
    answer was lost is found first); the ledger notes it. Returns how many were asked."""
    asked = 0
    for e in ledger.live:
        if e.step == "uploaded" and e.file_id is not None:
            try:
                found = await api.find_batch(e.file_id, ledger.metadata(e)["handoff"])
            except ApiError as exc:
                say.warn(f"batch {e.n}: cannot look it up ({exc})")
                continue
            if found is not None:
                e.batch_id, e.step, e.submitted_at = found.id, "submitted", time.time()
        if e.step in ("prepared", "uploaded"):  # never submitted: its prompts are asked again
            e.step, e.released, e.note = "done", e.requests, "not submitted: cancelled"
            ledger.requests_path(e).unlink(missing_ok=True)
            continue
        if e.step != "submitted" or e.batch_id is None or e.status in ("cancelling", "cancelled"):
            continue
        try:
            info = await api.cancel(e.batch_id)
        except ApiError as exc:
            if exc.outcome.status == 400:  # it ended meanwhile: nothing to cancel
                continue
            say.warn(f"batch {e.n}: cancelling {e.batch_id} failed ({exc})")
            continue
        e.cancel, e.status = True, info.status
        asked += 1
    ledger.save()
    if asked:
        say.say(f"batch: asked the provider to cancel {asked} live batch(es); what they "
                "answered is recorded by the next run, the rest asked again")
    return asked


async def batches_command(ledger_path: Path, base_url: str, api_key: str, *, cancel: bool,
                          as_json: bool, say: Reporter) -> int:
    """`payload batches [--cancel]`: the job's batches as the provider sees them now; with
    `--cancel` the live ones are cancelled (refused while a run holds the ledger)."""
    ledger = Ledger.load(ledger_path)
    if ledger is None:
        out = {"batches": 0, "live": 0, "cancelled": 0}
        print(json.dumps(out) if as_json else f"no batch ledger at {ledger_path}: nothing to do")
        return 0
    if ledger.base_url and ledger.base_url.rstrip("/") != base_url.rstrip("/"):
        raise UsageError(f"the batches in {ledger_path} were submitted to {ledger.base_url}, "
                         f"not {base_url}")
    ledger.lock()
    headers = {"Authorization": f"Bearer {api_key}", "X-Title": "handoff"}
    try:
        async with aiohttp.ClientSession(trust_env=False) as session:
            api = BatchAPI(session, base_url, headers, client.env_proxy(base_url))
            cancelled = await cancel_live(ledger, api, say) if cancel else 0
            for e in ledger.live:
                if e.step == "submitted" and e.batch_id is not None:
                    try:
                        BatchRun._note(e, await api.get(e.batch_id))
                    except ApiError as exc:
                        say.warn(f"batch {e.n}: polling {e.batch_id} failed ({exc})")
            ledger.save()
    finally:
        ledger.unlock()
    summary = {**ledger.summary(), "cancelled": cancelled}
    if as_json:
        print(json.dumps(summary, sort_keys=True))
    else:
        for e in ledger.entries:
            print(f"batch {e.n}: {e.batch_id or '-'} {e.status or e.step}, {e.requests} "
                  f"requests ({e.completed} answered, {e.failed} errors)"
                  + (" [cancel asked]" if e.cancel else ""))
    return 0


__all__ = ["MODES", "BatchRun", "batches_command", "cancel_live", "check_mode"]
