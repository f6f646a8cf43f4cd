"""The time series under the plots (handoff/ops/report/plots.py): bins no narrower than the
metrics' interval, a finished host's spend kept in the run's total, "now" fields dropped
once a host is done."""

from __future__ import annotations

import json
from pathlib import Path

from handoff.ops.report import plots, runs, series


def host(tmp_path: Path, name: str, lines: list[dict]) -> runs.HostCopy:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return runs.HostCopy(name, None, series=series.read(path), state="running")


def test_metrics_bins_and_totals(tmp_path: Path) -> None:
    t0 = 1_800_000_000.0
    early = host(tmp_path, "a", [{"t": t0 + 10 * i, "interval_s": 10, "cost": 1.0 * i, "done": 5 * i,
                                  "in_flight": 8} for i in range(1, 7)])  # done at +60 s
    late = host(tmp_path, "b", [{"t": t0 + 10 * i, "interval_s": 10, "cost": 2.0 * i, "done": 5 * i,
                                 "in_flight": 8} for i in range(1, 19)])  # done at +180 s
    data = runs.live("j", [early, late])
    start, end, source = runs.span(data)
    assert source == "metrics" and start == t0
    bins = plots.job_bins(data, start, end)
    assert bins is not None and bins.width >= 10  # never narrower than a line's interval
    cost = plots._add(plots._levels(early.series, bins, "cost", hold=True),  # type: ignore[arg-type]
                      plots._levels(late.series, bins, "cost", hold=True))  # type: ignore[arg-type]
    assert cost[-1] == 6.0 + 36.0  # a's spend stays in the total after a is done
    flight = plots._add(plots._levels(early.series, bins, "in_flight"),  # type: ignore[arg-type]
                        plots._levels(late.series, bins, "in_flight"))  # type: ignore[arg-type]
    assert flight[-1] == 8.0 and max(v or 0 for v in flight) == 16.0  # a's in-flight ends with a
    for plot in (plots.throughput(data, bins), plots.cost(data, bins), plots.hosts(data, bins)):
        assert plot is not None and plot.svg.startswith("<svg")
