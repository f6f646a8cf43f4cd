"""metrics.jsonl read as the host's word (handoff/ops/report/series.py): bounded, every field
optional and typed, a torn last line left out, a long series thinned."""

from __future__ import annotations

import json
from pathlib import Path

from handoff.ops.report import series


def write(path: Path, lines: list, tail: bytes = b"") -> Path:
    path.write_bytes(b"".join((json.dumps(x) if not isinstance(x, bytes) else x.decode()).encode()
                              + b"\n" for x in lines) + tail)
    return path


def test_every_field_optional_and_typed(tmp_path: Path) -> None:
    path = write(tmp_path / "metrics.jsonl", [
        {"t": 100.0, "role": "generator", "done": 5, "cost": 0.5, "in_flight": 3,
         "latency_s": {"p50": 1.5, "p90": 2.5, "p99": "slow"}, "errors_by_kind": {"timeout": 2}},
        {"t": 110.0},  # an older payload's line: only the time
        {"t": 120.0, "done": "7", "cost": -1, "failed": 1.5, "retries": -5,
         "errors_by_kind": {"x": -1}, "state": "r" * 100},
        {"t": 125.0, "done": 10 ** 400},  # past the bounded reader's digits: the line refused
        {"done": 9},  # no time: not a point
        [1, 2, 3],
        b"{not json",
        b'{"t": NaN, "done": 1}',
        b'{"t": 130, "done": 1e400}',
    ], tail=b'{"t": 140, "done": 99')  # torn: being written
    s = series.read(path)
    assert s is not None
    assert [p.t for p in s.points] == [100.0, 110.0, 120.0, 130.0]
    first, bare, bad, huge = s.points
    assert (first.role, first.done, first.cost, first.in_flight) == ("generator", 5, 0.5, 3.0)
    assert first.latency_s == {"p50": 1.5, "p90": 2.5} and first.errors_by_kind == {"timeout": 2}
    assert bare.done is None and bare.latency_s is None
    assert (bad.done, bad.cost, bad.failed, bad.retries, bad.errors_by_kind) == (None,) * 5
    assert bad.state == "r" * 32 + "… (68 more characters)"
    assert huge.done is None
    assert s.skipped == 5  # no time, a list, not JSON, NaN time, a 401-digit number
    assert s.end == path.stat().st_size - len(b'{"t": 140, "done": 99')  # the torn line comes next


def test_error_kinds_are_capped(tmp_path: Path) -> None:
    kinds = {f"kind{i}": i + 1 for i in range(50)}
    s = series.read(write(tmp_path / "m.jsonl", [{"t": 1.0, "errors_by_kind": kinds}]))
    assert s is not None and s.points[0].errors_by_kind is not None
    got = s.points[0].errors_by_kind
    assert len(got) == 32 and sum(got.values()) == sum(kinds.values())


def test_a_long_series_is_thinned_keeping_its_sums(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(series, "MAX_POINTS", 64)
    lines = [{"t": 1000.0 + i, "done": i * 2, "answers": 2, "interval_s": 1.0} for i in range(1000)]
    s = series.read(write(tmp_path / "m.jsonl", lines))
    assert s is not None and len(s.points) <= 64
    assert sum(p.answers or 0 for p in s.points) == 2000  # interval counts add up
    assert sum(p.interval_s or 0 for p in s.points) == 1000
    assert s.points[-1].done == 1998 and s.points[-1].t == 1999.0  # the last line kept as it is


def test_a_huge_file_is_read_from_its_end(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(series, "MAX_FILE_BYTES", 4096)
    lines = [{"t": 1000.0 + i, "done": i} for i in range(2000)]
    path = write(tmp_path / "m.jsonl", lines)
    s = series.read(path)
    assert s is not None and s.cut_at > 0 and s.skipped == 0  # started at a line's start
    assert s.points[-1].done == 1999 and len(s.points) < 200
    assert series.read(tmp_path / "missing.jsonl") is None
