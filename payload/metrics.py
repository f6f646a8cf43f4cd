"""`metrics.jsonl`: one JSON line per interval in a job folder, the time series `fab report`
plots (the fields: docs/records.md, "metrics.jsonl"). Shared by the generator and the
extractor; each builds its own line.

A line goes in under an exclusive lock on the file (several extractor ranks write one
file) when this run's last line is at least `every_s` old, or when `final`. A resumed
run appends, never truncates: a torn last line (a kill mid-write) is cut away first, and
the line builder sees the previous run's last line, from which totals a run only counts
for itself go on. A failure to write is said once on stderr and never stops the job.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

NAME = "metrics.jsonl"
TAIL = 64 << 10  # bytes read from the end at a time, looking for the last whole line

Line = dict[str, Any]
# (now, this run's id, the file's last line, the last line of an earlier run) -> a new line
Builder = Callable[[float, int, "Line | None", "Line | None"], Line]


def _last_lines(fh: Any, size: int, stop: Callable[[Line], bool]
                ) -> tuple[Line | None, Line | None, int]:
    """(the last whole line, the last line `stop` accepts, where the file's whole lines
    end), reading backwards from `size`."""
    end, last, found = size, None, None
    pos, buf = size, b""
    whole_end = None
    while pos > 0 and (last is None or found is None):
        step = min(TAIL, pos)
        pos -= step
        fh.seek(pos)
        buf = fh.read(step) + buf
        parts = buf.split(b"\n")
        buf = parts[0] if pos > 0 else b""
        lines = parts[1:] if pos > 0 else parts
        if whole_end is None:
            # what follows the last newline is a torn line (no newline yet): cut away
            whole_end = end - len(lines[-1]) if lines else end
            lines = lines[:-1]
        for raw in reversed(lines):
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(line, dict):
                continue
            last = last or line
            if found is None and stop(line):
                found = line
            if last is not None and found is not None:
                break
    return last, found, end if whole_end is None else whole_end


def run_id(text: str) -> int:
    """A run's id in its lines: the same text (a launch's id) gives the same number."""
    return zlib.crc32(text.encode())


class MetricsFile:
    """Appends lines built by a `Builder` to `path` (see the module docstring)."""

    def __init__(self, path: Path, every_s: float, run: int, role: str) -> None:
        self.path = path
        self.every_s = max(1.0, every_s)
        self.run = run
        self.role = role
        self.failed = False

    def tick(self, build: Builder, final: bool = False) -> bool:
        """Append a line when one is due (or `final`); True if written."""
        if self.failed:
            return False
        try:
            return self._tick(build, final)
        except OSError as exc:
            self.failed = True
            print(f"{self.role}: metrics: cannot write {self.path}: {exc}; the job goes on "
                  "without them", file=sys.stderr, flush=True)
            return False

    def _tick(self, build: Builder, final: bool) -> bool:
        now, run = time.time(), self.run
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+b", buffering=0) as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            size = os.fstat(fh.fileno()).st_size
            last, before, whole = _last_lines(fh, size, lambda line: line.get("run") != run)
            if (last is not None and not final and last.get("run") == run
                    and now - _number(last.get("t"), now) < self.every_s):
                return False  # this run's last line is recent: not due yet
            if whole < size:
                fh.truncate(whole)
            line = build(now, run, last, before)
            fh.write((json.dumps(line) + "\n").encode())
            fh.flush()
        return True

    def since(self, now: float, last: Line | None, started: float) -> float:
        """Seconds since this run's previous line, or since `started` for its first."""
        if last is not None and last.get("run") == self.run:
            return max(0.0, now - _number(last.get("t"), now))
        return max(0.0, now - started)


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else default
