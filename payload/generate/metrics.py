"""The generator's `metrics.jsonl` line (the file's rules: payload/metrics.py; the fields:
docs/records.md, "metrics.jsonl").

A line is the status file's counters at that moment plus what only an interval has: the
answers recorded since the previous line and their latency quantiles. It goes in with each
status write that finds the last line `every_s` old, and with the final status, so the
synchronous and the batch paths write it alike. Reasoning tokens and cancelled requests,
which the resume index cannot count, go on from the previous run's last line.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

from payload.metrics import NAME, Line, MetricsFile, run_id

if TYPE_CHECKING:
    from payload.generate.progress import Counters

MAX_KINDS = 32  # error kinds on a line; the rest are summed as "other"
SAMPLE = 4096  # latencies kept per interval (a uniform reservoir beyond)
CARRIED = ("reasoning_tokens", "cancelled")  # this run's count + the previous run's total


class Latencies:
    """The latencies of one interval's answers: a bounded uniform sample and the count."""

    def __init__(self) -> None:
        self.count = 0
        self.sample: list[float] = []

    def add(self, seconds: float) -> None:
        self.count += 1
        if len(self.sample) < SAMPLE:
            self.sample.append(seconds)
        else:
            j = random.randrange(self.count)
            if j < SAMPLE:
                self.sample[j] = seconds

    def take(self) -> tuple[int, dict[str, float] | None]:
        """(answers, {p50, p90, p99}) of the interval, and a new interval begins."""
        count, xs = self.count, sorted(self.sample)
        self.count, self.sample = 0, []
        if not xs:
            return count, None
        def q(p: float) -> float:
            return round(xs[min(len(xs) - 1, int(p * len(xs)))], 3)
        return count, {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


def _kinds(errors: dict[str, int]) -> dict[str, int]:
    ranked = sorted(errors.items(), key=lambda kv: -kv[1])
    kept = dict(ranked[:MAX_KINDS])
    rest = sum(n for _, n in ranked[MAX_KINDS:])
    if rest:
        kept["other"] = kept.get("other", 0) + rest
    return kept


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _size(path: Path | None) -> int:
    try:
        return os.stat(path).st_size if path is not None else 0
    except OSError:
        return 0


class GeneratorMetrics:
    """Appends the generator's lines to `metrics.jsonl` beside the status file."""

    def __init__(self, status_file: Path, every_s: float, written: tuple[Path, Path]) -> None:
        self.started = time.time()
        self.file = MetricsFile(status_file.with_name(NAME), every_s,
                                run_id(f"{os.getpid()}:{self.started}"), "generate")
        self.written = written  # the output and errors files: bytes_written
        self.base: dict[str, int] | None = None  # CARRIED, from the previous run's last line

    def tick(self, c: Counters, final: bool = False) -> bool:
        def build(now: float, run: int, last: Line | None, before: Line | None) -> Line:
            if self.base is None:
                self.base = {k: _count(before.get(k) if before else 0) for k in CARRIED}
            return self._line(c, now, run, last)
        return self.file.tick(build, final)

    def _carried(self, name: str) -> int:
        return (self.base or {}).get(name, 0)

    def _line(self, c: Counters, now: float, run: int, last: Line | None) -> Line:
        answers, latency = c.latencies.take()
        return {
            "t": round(now, 3), "role": "generator",
            "interval_s": round(self.file.since(now, last, self.started), 3),
            "elapsed_s": round(now - self.started, 3), "run": run, "state": c.state,
            "done": c.done, "failed": c.failed, "cut": c.by_finish_reason.get("length", 0),
            "cancelled": self._carried("cancelled") + c.cancelled, "retries": c.retries, "in_flight": c.in_flight,
            "window": c.window, "capacity": c.capacity,
            "prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "reasoning_tokens": self._carried("reasoning_tokens") + c.reasoning_tokens,
            "cost": round(c.cost, 8), "errors_by_kind": _kinds(dict(c.errors_by_kind)),
            "answers": answers, "latency_s": latency,
            "bytes_written": sum(_size(p) for p in self.written),
        }


def metrics_for(status_file: Path | None, every_s: float, output: Path, errors: Path
                ) -> GeneratorMetrics | None:
    """The job's metrics writer, or None without a status file (no job folder)."""
    return None if status_file is None else GeneratorMetrics(status_file, every_s,
                                                              (output, errors))


__all__ = ["GeneratorMetrics", "Latencies", "metrics_for"]
