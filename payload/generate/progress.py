"""Where the run stands: counters, the status file, and the progress display.

The status file is the contract `fab status` reads (DESIGN: state, done, failed,
in_flight, total, tokens, cost, rates, times, last_error), replaced atomically (temp file
+ rename) so a reader never sees half a file. On a TTY a rich progress bar shows the same
numbers; without a TTY (a detached job writing a log), or where rich is not installed on
the container, plain lines are printed every few seconds.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import atomic, units
from ..redact import REDACTOR


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
    duplicates: int = 0
    retries: int = 0
    done_this_run: int = 0
    tokens_this_run: int = 0
    errors_by_kind: collections.Counter[str] = field(default_factory=collections.Counter)
    last_error: str | None = None
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
            "bad_lines": self.bad_lines, "duplicates": self.duplicates, "retries": self.retries,
            "errors_by_kind": dict(self.errors_by_kind), "pid": os.getpid()})


def write_status(path: Path | None, counters: Counters) -> None:
    if path is None:
        return
    try:
        # Rewritten every few seconds: atomic for readers, not fsync'ed (the final one is
        # rewritten at exit anyway, and a lost update costs nothing).
        atomic.write_json(path, counters.snapshot(), durable=False)
    except OSError as exc:
        print(f"warning: cannot write status file {path}: {exc.strerror}", file=sys.stderr)


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

    def __init__(self, counters: Counters, *, plain_every: float = 10.0) -> None:
        self.c = counters
        self.plain_every = plain_every
        self._last_plain = time.monotonic()
        self._progress: Any = None
        self._task: Any = None
        if sys.stderr.isatty():
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
                    console=Console(file=sys.stderr), transient=False)

    def start(self) -> None:
        if self._progress is not None:
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
            print(describe(c), file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self._progress is not None:
            self.update()
            self._progress.stop()
        print(describe(self.c), file=sys.stderr, flush=True)
