"""The extractor's `metrics.jsonl`: one JSON line per interval in the job folder (the status
file's), the time series `fab report` plots (the fields: docs/records.md, "metrics.jsonl").

Every rank of a launch writes the job's figures (its status, summed over the ranks:
`status.job_status`) from the status path, under an exclusive lock on the file: a line
goes in when the file's last line is at least `every_s` old, and once more when a rank
ends, so the last rank to end writes the line that says `finished`. A resumed run appends
(never truncates): a torn last line (a kill mid-write) is cut away first, and the totals
a run only counts for itself (tokens, supervised tokens, bytes) go on from the last line of
the run before. A failure to write is said once on stderr and never stops the extraction.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any

NAME = "metrics.jsonl"
TAIL = 64 << 10  # bytes read from the end at a time, looking for the last whole line
# cumulative across resumed runs as written: the run's own count plus the last run's
CARRIED = ("tokens", "supervised_tokens", "bytes_written")


def _last_lines(fh: Any, size: int, stop: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None, int]:
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


class Metrics:
    """Appends the job's metrics lines to `path` (see the module docstring)."""

    def __init__(self, path: Path, every_s: float, started: float, run_id: str) -> None:
        self.path = path
        self.every_s = max(1.0, every_s)
        self.started = started  # this process's start (elapsed_s)
        # the launch, the same in every rank (torchrun's run id): lines of a resumed run differ
        self.run = zlib.crc32(run_id.encode())
        self.base: dict[str, float] | None = None  # the last run's carried totals
        self.failed = False

    def tick(self, status: dict[str, Any], final: bool = False) -> bool:
        """Append a line for the job's `status` when one is due (or `final`); True if written."""
        if self.failed:
            return False
        try:
            return self._tick(status, final)
        except OSError as exc:
            self.failed = True
            print(f"extract: metrics: cannot write {self.path}: {exc}; the extraction goes on "
                  "without them", file=sys.stderr, flush=True)
            return False

    def _tick(self, status: dict[str, Any], final: bool) -> bool:
        now, run = time.time(), self.run
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+b", buffering=0) as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            size = os.fstat(fh.fileno()).st_size
            last, before, whole = _last_lines(fh, size, lambda line: line.get("run") != run)
            if (last is not None and not final and last.get("run") == run
                    and now - float(last.get("t") or 0) < self.every_s):
                return False  # this run's last line is recent: not due yet
            if self.base is None:
                self.base = {k: float(before.get(k) or 0) if before else 0.0 for k in CARRIED}
            if whole < size:
                fh.truncate(whole)
            line = self._line(status, now, run, last)
            fh.write((json.dumps(line) + "\n").encode())
            fh.flush()
        return True

    def _line(self, st: dict[str, Any], now: float, run: int,
              last: dict[str, Any] | None) -> dict[str, Any]:
        base = self.base or {}
        samples = int(st.get("done") or 0)
        tokens = int(base.get("tokens", 0)) + int(st.get("tokens_written") or 0)
        # since this run's previous line; a run's first line: since this process started
        since = (now - float(last.get("t") or now) if last is not None and last.get("run") == run
                 else now - self.started)
        return {
            "t": round(now, 3), "role": "extractor", "interval_s": round(max(0.0, since), 3),
            "elapsed_s": round(now - self.started, 3), "run": run, "state": st.get("state"),
            "samples": samples, "failed": int(st.get("failed") or 0),
            "dropped": sum(int(st.get(k) or 0) for k in ("skipped_overlong", "dropped_unsupervised",
                                                          "skipped_mismatch")),
            "tokens": tokens,
            "supervised_tokens": (int(base.get("supervised_tokens", 0))
                                  + int(st.get("supervised_written") or 0)),
            "mismatches": int(st.get("retokenized_mismatch") or 0),
            "bytes_written": int(base.get("bytes_written", 0)) + int(st.get("bytes_written") or 0),
            "samples_interval": max(0, samples - int(last.get("samples") or 0)) if last else samples,
            "tokens_interval": max(0, tokens - int(last.get("tokens") or 0)) if last else tokens,
        }
