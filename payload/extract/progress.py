"""Progress: samples/s, tokens/s, GB written, ETA, skip and fail counts.

rich on a TTY (when installed), plain lines every few seconds otherwise (a log file
under nohup must stay readable). Both report through stderr; stdout stays clean.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from payload import units


class Progress:
    def __init__(self, total: int, total_tokens: int, mode: str, label: str,
                 interval: float = 10.0) -> None:
        self.total, self.total_tokens = total, total_tokens
        self.done = self.tokens = self.bytes = self.skipped = self.failed = 0
        self.start = time.monotonic()
        self.interval = interval
        self._last = 0.0
        self.label = label
        self._rich: Any = None
        if mode == "rich" or (mode == "auto" and sys.stderr.isatty()):
            try:
                from rich.console import Console
                from rich.progress import BarColumn, TextColumn
                from rich.progress import Progress as RichProgress

                self._rich = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                          TextColumn("{task.fields[stats]}"),
                                          console=Console(stderr=True), transient=False)
                self._task = self._rich.add_task(label, total=max(total, 1), stats="")
                self._rich.start()
            except ImportError:
                self._rich = None
        self.quiet = mode == "none"

    def line(self) -> str:
        el = max(time.monotonic() - self.start, 1e-9)
        sps, tps = self.done / el, self.tokens / el
        left = self.total_tokens - self.tokens
        eta = units.eta(left, tps)
        return (f"{self.done}/{self.total} samples  {sps:.2f} samples/s  {tps:.0f} tok/s  "
                f"{self.bytes / 1e9:.2f} GB written  ETA {eta}  "
                f"skipped {self.skipped}  failed {self.failed}")

    def update(self, *, done: int = 0, tokens: int = 0, nbytes: int = 0, skipped: int = 0,
               failed: int = 0) -> None:
        self.done += done
        self.tokens += tokens
        self.bytes += nbytes
        self.skipped += skipped
        self.failed += failed
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done, stats=self.line())
            return
        now = time.monotonic()
        if not self.quiet and now - self._last >= self.interval:
            self._last = now
            print(f"[{self.label}] {self.line()}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
        elif not self.quiet:
            print(f"[{self.label}] {self.line()}", file=sys.stderr, flush=True)
