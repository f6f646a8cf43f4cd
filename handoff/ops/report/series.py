"""A host's `metrics.jsonl` read as a time series (`Series`), the file being the host's word.

The payload appends one line per interval (docs/records.md, "metrics.jsonl"); this reader
takes it as untrusted data: at most the last `MAX_FILE_BYTES` of the file are read, a line
longer than `MAX_LINE_BYTES` or that is not a JSON object with a finite time `t` is skipped
and counted, a last line without its newline (being written, or torn by a kill) is left
out, every field is optional and read by type (finite numbers, counts >= 0, names cut,
at most `untrusted.MAX_NAMES` error kinds), and a series longer than `MAX_POINTS` is
thinned by merging neighbours (cumulative fields keep the later value, interval counts add
up), so memory stays bounded whatever the file holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from handoff.host import untrusted

MAX_FILE_BYTES = 32 << 20  # a day at a line a second is ~20 MB
MAX_LINE_BYTES = 64 << 10  # the contract's lines stay under ~2 KB
MAX_POINTS = 4096  # per host and job; past it neighbours merge


@dataclass(slots=True)
class Point:
    """One metrics line: every field optional (None when missing or of the wrong type)."""

    t: float
    role: str | None = None
    interval_s: float | None = None
    elapsed_s: float | None = None
    run: int | None = None
    state: str | None = None
    # the generator's (cumulative unless said)
    done: int | None = None
    failed: int | None = None
    cut: int | None = None
    cancelled: int | None = None  # requests cancelled in flight (asked again)
    retries: int | None = None
    in_flight: float | None = None  # now
    window: float | None = None  # now
    capacity: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost: float | None = None
    errors_by_kind: dict[str, int] | None = None
    answers: int | None = None  # in this interval
    latency_s: dict[str, float] | None = None  # this interval's p50/p90/p99
    bytes_written: int | None = None
    # the extractor's
    samples: int | None = None
    dropped: int | None = None
    tokens: int | None = None
    supervised_tokens: int | None = None
    mismatches: int | None = None
    samples_interval: int | None = None
    tokens_interval: int | None = None


_COUNTS = ("done", "failed", "cut", "cancelled", "retries", "prompt_tokens", "completion_tokens",
           "reasoning_tokens", "answers", "bytes_written", "samples", "dropped", "tokens",
           "supervised_tokens", "mismatches", "samples_interval", "tokens_interval")
_NUMBERS = ("interval_s", "elapsed_s", "in_flight", "window", "capacity", "cost")
# interval counts: merged points add them up (the rest is cumulative or "now": the later wins)
_INTERVAL = ("answers", "samples_interval", "tokens_interval", "interval_s")


def _latency(value: Any) -> dict[str, float] | None:
    if not isinstance(value, dict):
        return None
    out = {q: untrusted.number(value.get(q), minimum=0) for q in ("p50", "p90", "p99")}
    kept = {q: v for q, v in out.items() if v is not None}
    return kept or None


def point(raw: Any) -> Point | None:
    """One line's object as a Point; None without a finite, positive `t`."""
    if not isinstance(raw, dict):
        return None
    t = untrusted.number(raw.get("t"), minimum=0)
    if not t:
        return None
    p = Point(t)
    for name in _COUNTS:
        setattr(p, name, untrusted.count(raw.get(name)))
    for name in _NUMBERS:
        setattr(p, name, untrusted.number(raw.get(name), minimum=0))
    p.role = untrusted.text(raw.get("role"), 32)
    p.state = untrusted.text(raw.get("state"), 32)
    p.run = untrusted.integer(raw.get("run"))
    p.errors_by_kind = untrusted.counts_by_name(raw.get("errors_by_kind"))
    p.latency_s = _latency(raw.get("latency_s"))
    return p


@dataclass
class Series:
    """One host's metrics of one job, oldest first."""

    points: list[Point] = field(default_factory=list)
    skipped: int = 0  # lines that were not a metrics object (or too long)
    cut_at: int = 0  # bytes of the file's start not read (past MAX_FILE_BYTES)
    end: int = 0  # where the reading stopped in the file (the live page goes on from there)

    def add_lines(self, lines: Iterable[bytes]) -> None:
        for line in lines:
            if not line.strip():
                continue
            if len(line) > MAX_LINE_BYTES:
                self.skipped += 1
                continue
            try:
                p = point(untrusted.loads(line))
            except (ValueError, RecursionError):
                p = None
            if p is None:
                self.skipped += 1
                continue
            if self.points and p.t < self.points[-1].t:
                self.skipped += 1  # time runs backwards (a clock set back): not plotted
                continue
            self.points.append(p)
            if len(self.points) > MAX_POINTS:
                self.points = thinned(self.points)

    def add_text(self, data: bytes) -> None:
        """Whole lines (a live read ends at a newline)."""
        self.add_lines(data.split(b"\n"))

    @property
    def last(self) -> Point | None:
        return self.points[-1] if self.points else None

    @property
    def role(self) -> str | None:
        return next((p.role for p in reversed(self.points) if p.role), None)


def thinned(points: list[Point]) -> list[Point]:
    """Every two neighbours merged into one: the later's values, interval counts added."""
    out: list[Point] = []
    for i in range(0, len(points) - 1, 2):
        a, b = points[i], points[i + 1]
        for name in _INTERVAL:
            x, y = getattr(a, name), getattr(b, name)
            if x is not None and y is not None:
                setattr(b, name, x + y)
        out.append(b)
    if len(points) % 2:
        out.append(points[-1])
    return out


def read(path: Path) -> Series | None:
    """The series of a fetched `metrics.jsonl`; None when there is no such file."""
    series = Series()
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_FILE_BYTES:
            series.cut_at = size - MAX_FILE_BYTES
            fh.seek(series.cut_at)
            fh.readline()  # the rest of a line cut in two
        data = fh.read(MAX_FILE_BYTES)
    whole = data.rfind(b"\n") + 1  # a last line without its newline: not yet whole
    series.end = size - (len(data) - whole)
    series.add_text(data[:whole])
    return series


def fields_of(p: Point) -> dict[str, Any]:
    """A point as plain data (tests, debugging)."""
    return {f.name: getattr(p, f.name) for f in fields(p)}
