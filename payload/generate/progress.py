"""Where the run stands: counters, the status file, and the progress display.

The status file is the contract `fab status` reads (docs/records.md: state, done, failed,
in_flight, total, tokens, cost, rates, times, last_error; docs/records.md lists every
field), replaced atomically (temp file + rename) so a reader never sees half a file. On
a TTY a rich progress bar shows the same numbers; without a TTY (a detached job writing
a log), or where rich is not installed on the container, plain lines go to the run's
reporter every few seconds.

A full disk must not silence the status: the writer keeps a small reserve file beside
the status file from the start and gives it up to write the final status, and it says
"cannot write" once, not every two seconds.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from payload import atomic, units
from payload.generate.metrics import GeneratorMetrics, Latencies
from payload.redact import REDACTOR
from payload.report import Reporter


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")


@dataclass
class Counters:
    done: int = 0  # cumulative across resumed runs
    failed: int = 0  # cumulative across resumed runs
    cost: float = 0.0  # cumulative usage.cost of recorded answers + this run's failed attempts
    prompt_tokens: int = 0
    completion_tokens: int = 0
    in_flight: int = 0
    total: int | None = None
    bad_lines: int = 0
    bad_line_samples: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0
    retries: int = 0
    done_this_run: int = 0
    tokens_this_run: int = 0
    errors_by_kind: collections.Counter[str] = field(default_factory=collections.Counter)
    # Answers (one per turn with --turns all) by provider and finish reason, cumulative
    # across resumed runs; `cut` is the answers cut by max_tokens (finish_reason "length").
    by_provider: collections.Counter[str] = field(default_factory=collections.Counter)
    by_finish_reason: collections.Counter[str] = field(default_factory=collections.Counter)
    timeouts: int = 0  # requests of this run that timed out (each retried <= --max-timeouts)
    think_split: int = 0  # answers of this run whose <think> markers were split from content
    last_error: str | None = None
    stop_reason: str | None = None  # auth, credit, budget, signal, disk_full, outage, ...
    exit_code: int | None = None  # set in the final status
    max_failed: int | None = None  # failures allowed before exit 1 (resolved --max-failed)
    budget_enforced: bool | None = None  # None without --max-cost
    max_cost: float | None = None
    outage_s: float | None = None  # how long the server has been failing, while it is
    outages: int = 0
    window: int | None = None  # requests the limiter allows in flight now
    batches: dict[str, Any] | None = None  # --mode batch: the batches by state, their counts
    # For metrics.jsonl only: this run's reasoning tokens, requests cancelled in flight, the
    # capacity the limiter found, and the latencies of the answers since the last line.
    reasoning_tokens: int = 0
    cancelled: int = 0
    capacity: int | None = None
    latencies: Latencies = field(default_factory=Latencies)
    state: str = "running"
    started: float = field(default_factory=time.time)
    _t0: float = field(default_factory=time.monotonic)

    def rates(self) -> tuple[float, float]:
        elapsed = max(1e-6, time.monotonic() - self._t0)
        return self.done_this_run / elapsed, self.tokens_this_run / elapsed

    def snapshot(self) -> dict[str, Any]:
        rps, tps = self.rates()
        return REDACTOR.redact_any({
            "state": self.state, "done": self.done, "failed": self.failed,
            "in_flight": self.in_flight, "total": self.total,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "cost": round(self.cost, 8), "rate_rps": round(rps, 3),
            "tokens_per_s": round(tps, 1), "started": _iso(self.started),
            "updated": _iso(time.time()), "last_error": self.last_error,
            "bad_lines": self.bad_lines, "bad_line_samples": self.bad_line_samples,
            "duplicates": self.duplicates, "retries": self.retries,
            "errors_by_kind": dict(self.errors_by_kind), "stop_reason": self.stop_reason,
            "by_provider": dict(self.by_provider),
            "by_finish_reason": dict(self.by_finish_reason),
            "cut": self.by_finish_reason.get("length", 0), "timeouts": self.timeouts,
            "think_split": self.think_split,
            "exit_code": self.exit_code, "max_failed": self.max_failed,
            "max_cost": self.max_cost, "budget_enforced": self.budget_enforced,
            "outage_s": None if self.outage_s is None else round(self.outage_s, 1),
            "outages": self.outages, "window": self.window, "pid": os.getpid(),
            **({"batches": self.batches} if self.batches is not None else {})})


RESERVE_BYTES = 256 * 1024
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class StatusWriter:
    """Writes the status file; holds the disk-space reserve that guarantees the last one."""

    def __init__(self, path: Path | None, reporter: Reporter,
                 metrics: GeneratorMetrics | None = None) -> None:
        self.path = path
        self.say = reporter
        self.metrics = metrics  # a metrics.jsonl line goes with the status when one is due
        self.reserve = None if path is None else path.with_name(f".{path.name}.reserve")
        self._warned: set[int] = set()
        self.disk_full = False

    def hold_reserve(self) -> None:
        """Claim RESERVE_BYTES of real blocks (zeros written, not a sparse file)."""
        if self.reserve is None:
            return
        try:
            with self.reserve.open("wb") as fh:
                fh.write(bytes(RESERVE_BYTES))
                fh.flush()
                os.fsync(fh.fileno())
        except OSError:  # already full: nothing to hold; the final write may still fit
            self.release_reserve()

    def release_reserve(self) -> None:
        if self.reserve is not None:
            with contextlib.suppress(OSError):
                self.reserve.unlink()

    def write(self, counters: Counters, *, final: bool = False) -> OSError | None:
        """Replace the status file; returns the error when it could not (said once)."""
        if self.path is None:
            return None
        if final:
            self.release_reserve()
        try:
            # Rewritten every few seconds: atomic for readers, not fsync'ed except the final
            # one (a lost intermediate update costs nothing).
            atomic.write_json(self.path, counters.snapshot(), durable=final)
        except OSError as exc:
            if exc.errno in DISK_FULL:
                self.disk_full = True
            if exc.errno not in self._warned:
                self._warned.add(exc.errno or 0)
                self.say.warn(f"cannot write status file {self.path}: {exc.strerror}")
            return exc
        if self.metrics is not None:
            self.metrics.tick(counters, final=final)
        return None


def _eta(c: Counters) -> str:
    rps, _ = c.rates()
    left = None if c.total is None else max(0, c.total - c.done - c.failed)
    return units.eta(left, rps)


def describe(c: Counters) -> str:
    rps, tps = c.rates()
    total = "?" if c.total is None else str(c.total)
    errs = " ".join(f"{k}={v}" for k, v in c.errors_by_kind.most_common(6))
    return (f"done {c.done}/{total} failed {c.failed} in-flight {c.in_flight} "
            f"{rps:.1f} req/s {tps:.0f} tok/s ${c.cost:.4f} eta {_eta(c)}"
            + (f" | errors: {errs}" if errs else ""))


class Display:
    """A rich bar on a TTY (if rich is importable), else a plain line every `plain_every` s."""

    def __init__(self, counters: Counters, reporter: Reporter, *,
                 plain_every: float = 10.0) -> None:
        self.c = counters
        self.say = reporter
        self.plain_every = plain_every
        self._last_plain = time.monotonic()
        self._progress: Any = None
        self._task: Any = None
        stream = reporter.stream
        if stream.isatty():
            with contextlib.suppress(ImportError):
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeRemainingColumn,
                )
                self._progress = Progress(
                    TextColumn("generate"), BarColumn(), MofNCompleteColumn(),
                    TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                    console=Console(file=stream), transient=False)

    def start(self) -> None:
        if self._progress is not None and self._task is None:
            self._progress.start()
            self._task = self._progress.add_task("generate", total=self.c.total, info="")

    def update(self) -> None:
        c = self.c
        if self._progress is not None:
            rps, tps = c.rates()
            errs = " ".join(f"{k}={v}" for k, v in c.errors_by_kind.most_common(4))
            info = REDACTOR.redact(f"{rps:.1f} req/s {tps:.0f} tok/s ${c.cost:.4f} "
                                   f"failed {c.failed} in-flight {c.in_flight} {errs}")
            self._progress.update(self._task, completed=c.done + c.failed, total=c.total,
                                  info=info)
            return
        now = time.monotonic()
        if now - self._last_plain >= self.plain_every:
            self._last_plain = now
            self.say.say(describe(c))

    def stop(self) -> None:
        if self._progress is not None:
            self.update()
            self._progress.stop()
        self.say.say(describe(self.c))
