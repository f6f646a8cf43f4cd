"""The extractor's `metrics.jsonl` line (the file's rules: payload/metrics.py; the fields:
docs/records.md, "metrics.jsonl").

Every rank of a launch writes the job's figures (its status, summed over the ranks:
`status.job_status`) from the status path, so the last rank to end writes the line that
says `finished`; the run id is the launch's (torchrun's), the same in every rank. The
totals a run only counts for itself (tokens, supervised tokens, bytes) go on from the last
line of the run before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from payload.metrics import NAME, Line, MetricsFile, run_id

__all__ = ["NAME", "Metrics"]

# cumulative across resumed runs as written: the run's own count plus the last run's
CARRIED = ("tokens", "supervised_tokens", "bytes_written")


class Metrics:
    """Appends the job's metrics lines to `path` (see the module docstring)."""

    def __init__(self, path: Path, every_s: float, started: float, run_id_text: str) -> None:
        self.file = MetricsFile(path, every_s, run_id(run_id_text), "extract")
        self.path = path
        self.started = started  # this process's start (elapsed_s)
        self.base: dict[str, float] | None = None  # the last run's carried totals

    def tick(self, status: dict[str, Any], final: bool = False) -> bool:
        """Append a line for the job's `status` when one is due (or `final`); True if written."""
        def build(now: float, run: int, last: Line | None, before: Line | None) -> Line:
            if self.base is None:
                self.base = {k: float(before.get(k) or 0) if before else 0.0 for k in CARRIED}
            return self._line(status, now, run, last)
        return self.file.tick(build, final)

    def _line(self, st: dict[str, Any], now: float, run: int,
              last: dict[str, Any] | None) -> dict[str, Any]:
        base = self.base or {}
        samples = int(st.get("done") or 0)
        tokens = int(base.get("tokens", 0)) + int(st.get("tokens_written") or 0)
        since = self.file.since(now, last, self.started)
        return {
            "t": round(now, 3), "role": "extractor", "interval_s": round(since, 3),
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
