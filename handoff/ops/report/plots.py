"""The report's figures: matplotlib drawn to inline SVG (`Plot`), no JavaScript needed.

Why matplotlib: it is the plotting library every Python ML engineer already has and
trusts, it is kept up to date (3.11 as pinned in pyproject.toml), and it renders
SVG with no browser, no JavaScript and no network: the report stays one small file that
opens offline, and the text of every figure is text (searchable, selectable); a library
that draws in the browser would inline its JavaScript (megabytes) into every file. A
40k-answer report's figures weigh ~280 KB (BENCHMARKS.md, "Run report"): everything is
binned before it is drawn (time in at most `BINS` bins, histograms in 50), and the one
scatter plot (latency against answer length, every answer) is rasterized inside its SVG.

Every function takes a job's data (handoff.ops.report.runs) and returns a Plot, or None
when the data for it is missing (the page then says what is missing and why). The time
series come from the records' `answered_at` when they have it, else from the hosts'
metrics.jsonl; a run with neither (an older payload) is drawn against the answers in file
order where that still says something (cost, latency).
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from handoff.ops.report.records import RecordStats, quantiles
from handoff.ops.report.runs import JobData
from handoff.ops.report.series import Series

BINS = 120  # time bins across a run, at most
NICE_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200,
          86400)
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")
WIDE, HIGH = 7.6, 2.7  # inches: one row of a figure
STYLE: dict[str, Any] = {
    "svg.fonttype": "none",  # text stays text: smaller, selectable, found by the browser test
    "font.size": 8.5, "axes.titlesize": 9.5, "axes.labelsize": 8.5, "legend.fontsize": 7.5,
    "xtick.labelsize": 7.5, "ytick.labelsize": 7.5, "axes.spines.top": False,
    "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.25, "figure.dpi": 96,
    "savefig.dpi": 96, "legend.frameon": False,
}


@dataclass
class Plot:
    key: str  # the figure's id in the page (`fig-<key>`)
    title: str
    svg: str
    note: str = ""  # what the figure is drawn from, said under it


@dataclass
class Bins:
    """Time bins over [t0, t0 + n * width)."""

    t0: float
    width: float
    n: int

    @classmethod
    def over(cls, start: float, end: float, target: int = BINS, at_least: float = 0.0) -> Bins:
        """Nice bins over [start, end]: at most `target`, each at least `at_least` seconds
        (the metrics' interval: a bin narrower than a line's interval is empty or a spike)."""
        length = max(end - start, 1.0)
        width = next((w for w in NICE_S if length / w <= target and w >= at_least), NICE_S[-1])
        return cls(start, float(width), max(1, math.ceil(length / width)))

    def at(self, t: float) -> int:
        return min(self.n - 1, max(0, int((t - self.t0) // self.width)))

    def axis(self) -> tuple[list[float], str]:
        """Bin centres in seconds, minutes or hours since t0, and the axis label."""
        unit = self.scale()
        xs = [(k + 0.5) * self.width / unit for k in range(self.n)]
        name = {1.0: "seconds", 60.0: "minutes", 3600.0: "hours"}[unit]
        return xs, f"{name} since the start"

    def scale(self) -> float:
        """Seconds in the axis' unit: seconds up to 3 minutes, minutes up to 3 hours."""
        length = self.n * self.width
        return 1.0 if length <= 180 else 60.0 if length <= 3 * 3600 else 3600.0


# -- drawing ---------------------------------------------------------------------------------------

def _rc(key: str) -> Any:
    """The style, with SVG ids salted by the figure's key: several SVGs inline in one page
    never share an id, and the same figure always gets the same ids."""
    return {**STYLE, "svg.hashsalt": f"handoff-{key}"}


@contextlib.contextmanager
def _figure(key: str, rows: int = 1, cols: int = 1, high: float = HIGH,
            sharex: bool = False) -> Iterator[tuple[Any, Any]]:
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_rc(key)):
        fig = Figure(figsize=(WIDE, high * rows), layout="constrained")
        axes = fig.subplots(rows, cols, sharex=sharex, squeeze=False)
        yield fig, axes


_SVG_SIZE = re.compile(r'<svg([^>]*?) width="[^"]*" height="[^"]*"')


def _svg(fig: Any, key: str) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(_rc(key)):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # the XML prolog and doctype do not belong in HTML
    # scale with the page: the viewBox keeps the proportions
    return _SVG_SIZE.sub(lambda m: f'<svg{m.group(1)} class="plot" role="img"', text, count=1)


def _done(fig: Any, key: str, title: str, note: str = "") -> Plot:
    return Plot(key, title, _svg(fig, key), note)


# -- time series -----------------------------------------------------------------------------------

def _records_timed(rec: RecordStats | None) -> bool:
    return rec is not None and any(not math.isnan(a) for a in rec.at)


def job_bins(data: JobData, start: float | None, end: float | None) -> Bins | None:
    """The job's time bins; drawn from the metrics, none narrower than their interval."""
    if start is None or end is None:
        return None
    at_least = 0.0
    if not _records_timed(data.records) and data.series:
        intervals = [p.interval_s for _, s in data.series for p in s.points if p.interval_s]
        at_least = sorted(intervals)[len(intervals) // 2] if intervals else 0.0
    return Bins.over(start, end, at_least=at_least)


def _from_records(rec: RecordStats, bins: Bins, values: Any = None,
                  only: set[int] | None = None) -> list[float]:
    """Per bin, the answers (or the sum of `values`) whose answered_at falls in it."""
    out = [0.0] * bins.n
    for i, at in enumerate(rec.at):
        if math.isnan(at) or (only is not None and rec.host_of[i] not in only):
            continue
        v = 1.0 if values is None else values[i]
        if v >= 0:
            out[bins.at(at)] += v
    return out


def _deltas(series: Series, bins: Bins, name: str) -> list[float]:
    """Per bin, how much a cumulative field of one host grew (a drop, a restart, counts 0)."""
    out = [0.0] * bins.n
    prev: float | None = None
    for p in series.points:
        v = getattr(p, name)
        if v is None:
            continue
        if prev is not None and v >= prev:
            out[bins.at(p.t)] += v - prev
        prev = v
    return out


def _interval(series: Series, bins: Bins, name: str) -> list[float]:
    out = [0.0] * bins.n
    for p in series.points:
        v = getattr(p, name)
        if v is not None:
            out[bins.at(p.t)] += v
    return out


def _levels(series: Series, bins: Bins, name: str, hold: bool = False) -> list[float | None]:
    """Per bin, the field's last value, carried forward until the host's last line (a "now"
    field: in flight, window), or with `hold` to the end (a total: what a host spent stays
    spent once it is done)."""
    out: list[float | None] = [None] * bins.n
    for p in series.points:
        v = getattr(p, name)
        if v is not None:
            out[bins.at(p.t)] = float(v)
    last_bin = bins.n - 1 if hold else bins.at(series.points[-1].t) if series.points else -1
    current = None
    for k in range(bins.n):
        if out[k] is not None:
            current = out[k]
        elif k <= last_bin:
            out[k] = current
    return out


def _add(a: list[float | None], b: list[float | None]) -> list[float | None]:
    return [None if x is None and y is None else (x or 0.0) + (y or 0.0) for x, y in zip(a, b, strict=True)]


def _rate(values: list[float], bins: Bins) -> list[float]:
    return [v / bins.width for v in values]


def throughput(data: JobData, bins: Bins | None) -> Plot | None:
    """Answers/s and tokens/s over time; in flight and the limiter's window under them."""
    if bins is None:
        return None
    rec = data.records
    answers: list[float] | None = None
    tokens: list[float] | None = None
    source = ""
    if _records_timed(rec) and rec is not None:
        answers = _from_records(rec, bins)
        tokens = _from_records(rec, bins, rec.completion)
        source = "the records' answered_at"
    elif data.series:
        answers, tokens = [0.0] * bins.n, [0.0] * bins.n
        for _, s in data.series:
            answers = [x + y for x, y in zip(answers, _deltas(s, bins, "done"), strict=True)]
            tokens = [x + y for x, y in zip(tokens, _deltas(s, bins, "completion_tokens"), strict=True)]
        source = "the hosts' metrics.jsonl"
    if answers is None or tokens is None:
        return None
    levels: dict[str, list[float | None]] = {name: [None] * bins.n for name in ("in_flight", "window")}
    for _, s in data.series:
        for name in levels:
            levels[name] = _add(levels[name], _levels(s, bins, name))
    has_levels = any(v is not None for v in levels["in_flight"])
    xs, label = bins.axis()
    with _figure("throughput", rows=2 if has_levels else 1, sharex=True) as (fig, axes):
        ax = axes[0][0]
        ax.plot(xs, _rate(answers, bins), color=COLORS[0], label="answers/s")
        ax.set_ylabel("answers/s")
        ax2 = ax.twinx()
        ax2.plot(xs, _rate(tokens, bins), color=COLORS[1], linestyle="--", alpha=0.8,
                 label="completion tokens/s")
        ax2.set_ylabel("tokens/s")
        ax2.grid(False)
        ax2.spines["right"].set_visible(True)
        ax.legend(handles=[*ax.get_lines(), *ax2.get_lines()], loc="upper right")
        ax.set_title(f"Throughput ({bins.width:g} s bins)")
        if has_levels:
            low = axes[1][0]
            low.plot(xs, [v if v is not None else math.nan for v in levels["in_flight"]],
                     color=COLORS[2], label="in flight")
            if any(v is not None for v in levels["window"]):
                low.plot(xs, [v if v is not None else math.nan for v in levels["window"]],
                         color=COLORS[3], linestyle="--", label="limiter window")
            low.set_ylabel("requests")
            low.legend(loc="upper right")
            low.set_xlabel(label)
        else:
            ax.set_xlabel(label)
        return _done(fig, "throughput", "Throughput over time",
                     f"From {source}" + ("; in flight and window from the hosts' metrics.jsonl"
                                         if has_levels else "; no metrics.jsonl: in flight and the "
                                         "window are not shown") + ".")


def cost(data: JobData, bins: Bins | None) -> Plot | None:
    """Cumulative cost against the budget (over time, or over the answers in file order)."""
    rec = data.records
    budget = data.meta.get("max_cost")
    xs: list[float] = []
    ys: list[float] = []
    xlabel = ""
    note = ""
    if _records_timed(rec) and rec is not None and bins is not None:
        order = sorted((a, c) for a, c in zip(rec.at, rec.costs, strict=True)
                       if not math.isnan(a) and not math.isnan(c))
        step = max(1, len(order) // 2000)
        total = 0.0
        for k, (a, c) in enumerate(order):
            total += c
            if k % step == 0 or k == len(order) - 1:
                xs.append((a - bins.t0) / bins.scale())
                ys.append(total)
        xlabel = bins.axis()[1]
        note = "From the records' usage.cost and answered_at."
    elif data.series and bins is not None:
        levels: list[float | None] = [None] * bins.n
        for _, s in data.series:
            levels = _add(levels, _levels(s, bins, "cost", hold=True))
        axis, xlabel = bins.axis()
        xs = [x for x, v in zip(axis, levels, strict=True) if v is not None]
        ys = [v for v in levels if v is not None]
        note = "From the hosts' metrics.jsonl (cost, cumulative)."
    elif rec is not None and rec.answers:
        total = 0.0
        step = max(1, rec.answers // 2000)
        for k, c in enumerate(rec.costs):
            if not math.isnan(c):
                total += c
            if k % step == 0 or k == rec.answers - 1:
                xs.append(k + 1)
                ys.append(total)
        xlabel = "answers, in file order (the records carry no answered_at)"
        note = "From the records' usage.cost, in file order: no timeline in these records."
    if not xs:
        return None
    with _figure("cost") as (fig, axes):
        ax = axes[0][0]
        ax.plot(xs, ys, color=COLORS[0], label="spent")
        if isinstance(budget, (int, float)) and budget > 0:
            ax.axhline(budget, color=COLORS[3], linestyle="--", label=f"budget ${budget:,.2f}")
        ax.set_ylabel("USD")
        ax.set_xlabel(xlabel)
        ax.set_title("Cumulative cost")
        ax.legend(loc="upper left")
        return _done(fig, "cost", "Cost against the budget", note)


def _hist(ax: Any, values: Any, bins: Any, color: str) -> None:
    """A histogram as one filled outline (numpy counts it): one SVG path, not a bar each."""
    import numpy as np

    counts, edges = np.histogram(np.asarray(values, dtype=float), bins=bins)
    ax.stairs(counts, edges, fill=True, color=color, alpha=0.8)


def _log_bins(values: list[float], n: int = 50) -> Any:
    lo, hi = min(values), max(values)
    if lo <= 0 or hi / lo < 30:
        return n
    return [lo * (hi / lo) ** (k / n) for k in range(n + 1)]


def latency(data: JobData, bins: Bins | None) -> Plot | None:
    """The latency distribution with p50/p90/p99, and latency against answer length; live
    (no records): the interval quantiles over time."""
    rec = data.records
    if rec is None or not any(not math.isnan(v) for v in rec.latency):
        return _latency_over_time(data, bins)
    values = [v for v in rec.latency if not math.isnan(v)]
    q = quantiles(values) or {}
    pairs = [(c, v) for c, v in zip(rec.completion, rec.latency, strict=True)
             if c >= 0 and not math.isnan(v)]
    with _figure("latency", cols=2) as (fig, axes):
        ax = axes[0][0]
        edges = _log_bins(values)
        _hist(ax, values, edges, COLORS[0])
        if not isinstance(edges, int):
            ax.set_xscale("log")
        for (name, v), color in zip(q.items(), (COLORS[2], COLORS[1], COLORS[3]), strict=False):
            ax.axvline(v, color=color, linestyle="--", label=f"{name} {v:.2f} s")
        ax.set_xlabel("latency (s)")
        ax.set_ylabel("answers")
        ax.set_title("Latency")
        ax.legend(loc="upper right")
        right = axes[0][1]
        if pairs:
            right.scatter([c for c, _ in pairs], [v for _, v in pairs], s=3, alpha=0.35,
                          color=COLORS[0], linewidths=0, rasterized=True)
        right.set_xlabel("completion tokens")
        right.set_ylabel("latency (s)")
        right.set_title("Latency against answer length")
        return _done(fig, "latency", "Latency", f"{len(values):,} answers' latency_s; "
                     "quantiles interpolated between the closest ranks.")


def _latency_over_time(data: JobData, bins: Bins | None) -> Plot | None:
    if bins is None or not data.series:
        return None
    xs, label = bins.axis()
    rows: dict[str, list[float]] = {q: [math.nan] * bins.n for q in ("p50", "p90", "p99")}
    for _, s in data.series:
        for p in s.points:
            if p.latency_s:
                for q, v in p.latency_s.items():
                    k = bins.at(p.t)
                    rows[q][k] = max(v, rows[q][k]) if not math.isnan(rows[q][k]) else v
    if all(math.isnan(v) for v in rows["p50"]):
        return None
    with _figure("latency") as (fig, axes):
        ax = axes[0][0]
        for (q, ys), color in zip(rows.items(), (COLORS[2], COLORS[1], COLORS[3]), strict=True):
            ax.plot(xs, ys, color=color, marker=".", label=q)
        ax.set_ylabel("latency (s)")
        ax.set_xlabel(label)
        ax.set_title("Latency of each interval's answers")
        ax.legend(loc="upper right")
        return _done(fig, "latency", "Latency", "From the hosts' metrics.jsonl (each interval's "
                     "quantiles; the slowest host's where several).")


def tokens(data: JobData) -> Plot | None:
    """Prompt, reasoning, content and completion token lengths, the max_tokens cut marked."""
    rec = data.records
    if rec is None or not rec.answers:
        return None
    prompt = [v for v in rec.prompt if v >= 0]
    reasoning = [v for v in rec.reasoning if v >= 0]
    content = [c - r for c, r in zip(rec.completion, rec.reasoning, strict=True) if c >= 0 and r >= 0]
    completion = [v for v in rec.completion if v >= 0]
    sampling = data.meta.get("sampling")
    cap = sampling.get("max_tokens") if isinstance(sampling, dict) else None
    panels = [("prompt tokens", prompt), ("reasoning tokens", reasoning),
              ("content tokens", content), ("completion tokens", completion)]
    with _figure("tokens", rows=2, cols=2, high=2.2) as (fig, axes):
        for (name, values), ax, color in zip(panels, [a for row in axes for a in row], COLORS, strict=False):
            if values:
                _hist(ax, values, 50, color)
            else:
                ax.text(0.5, 0.5, "not in the records", ha="center", va="center",
                        transform=ax.transAxes)
            if isinstance(cap, int) and name in ("completion tokens", "reasoning tokens") and values:
                ax.axvline(cap, color=COLORS[3], linestyle="--", label=f"max_tokens {cap:,}")
                ax.legend(loc="upper right")
            ax.set_title(name)
            ax.set_ylabel("answers")
        return _done(fig, "tokens", "Token lengths", f"From the records' usage; {rec.cut:,} answers "
                     f"cut by max_tokens (finish_reason length).")


def errors(data: JobData, bins: Bins | None) -> Plot | None:
    """Error answers by kind over time (the metrics' errors_by_kind, which also counts errors
    retried), else the failures' kinds."""
    rec = data.records
    kinds: dict[str, list[float]] = {}
    note = ""
    if data.series and bins is not None and any(p.errors_by_kind for _, s in data.series for p in s.points):
        for _, s in data.series:
            prev: dict[str, int] = {}
            for p in s.points:
                for kind, n in (p.errors_by_kind or {}).items():
                    grew = n - prev.get(kind, 0)
                    if grew > 0:
                        kinds.setdefault(kind, [0.0] * bins.n)[bins.at(p.t)] += grew
                    prev[kind] = n
        note = "From the hosts' metrics.jsonl: every error answer by kind, retried ones included."
    elif rec is not None and rec.failures and bins is not None and any(
            not math.isnan(a) for a in rec.error_at):
        for at, k in zip(rec.error_at, rec.error_kind, strict=True):
            if not math.isnan(at):
                kinds.setdefault(rec.error_names[k], [0.0] * bins.n)[bins.at(at)] += 1
        note = "From the errors file: the permanent failures by kind."
    elif rec is not None and rec.failures:
        with _figure("errors") as (fig, axes):
            ax = axes[0][0]
            ranked = rec.errors.ranked()[:12]
            ax.barh([k for k, _ in ranked][::-1], [n for _, n in ranked][::-1], color=COLORS[3])
            ax.set_xlabel("failed ids")
            ax.set_title("Failures by kind")
            return _done(fig, "errors", "Errors", "From the errors file (no timeline in it).")
    if not kinds or bins is None:
        return None
    label = bins.axis()[1]
    by_size = sorted(kinds.items(), key=lambda kv: -sum(kv[1]))
    with _figure("errors") as (fig, axes):
        ax = axes[0][0]
        bottom = [0.0] * bins.n
        edges = [k * bins.width / bins.scale() for k in range(bins.n + 1)]
        for (kind, counts), color in zip(by_size, (*COLORS[3:], *COLORS[:3]) * 4, strict=False):
            top = [a + b for a, b in zip(bottom, counts, strict=True)]
            ax.stairs(top, edges, baseline=bottom, fill=True, color=color, label=kind)
            bottom = top
        ax.set_xlabel(label)
        ax.set_ylabel(f"errors per {bins.width:g} s")
        ax.set_title("Errors by kind")
        ax.legend(loc="upper right", ncols=2)
        return _done(fig, "errors", "Errors over time", note)


def mix(data: JobData) -> Plot | None:
    """Answers by provider and by finish reason."""
    rec = data.records
    if rec is not None and rec.answers:
        providers, reasons = rec.providers.ranked(), rec.finish_reasons.ranked()
        note = "From the records."
    else:
        totals: dict[str, dict[str, int]] = {"by_provider": {}, "by_finish_reason": {}}
        for c in data.copies:
            for key, into in totals.items():
                for name, n in (c.status.get(key) or {}).items():
                    into[name] = into.get(name, 0) + n
        providers = sorted(totals["by_provider"].items(), key=lambda kv: -kv[1])
        reasons = sorted(totals["by_finish_reason"].items(), key=lambda kv: -kv[1])
        note = "From the hosts' status files."
    if not providers and not reasons:
        return None
    with _figure("mix", cols=2) as (fig, axes):
        for ax, (title, ranked), color in zip(axes[0], (("Provider", providers),
                                                        ("Finish reason", reasons)),
                                              (COLORS[0], COLORS[4]), strict=True):
            shown = ranked[:10]
            ax.barh([k for k, _ in shown][::-1], [n for _, n in shown][::-1], color=color)
            ax.set_title(title)
            ax.set_xlabel("answers")
        return _done(fig, "mix", "Providers and finish reasons", note)


def hosts(data: JobData, bins: Bins | None) -> Plot | None:
    """Each host's answers (or samples) per second, for a job over several hosts."""
    if bins is None or len(data.copies) < 2:
        return None
    rec = data.records
    per_host: dict[str, list[float]] = {}
    if _records_timed(rec) and rec is not None:
        for host in rec.host_names:
            per_host[host] = _rate(_from_records(rec, bins, only={rec.host_names.index(host)}), bins)
        note = "From the records' answered_at; each record's host is its shard's."
    elif data.series:
        field = "samples" if data.kind == "extractor" else "done"
        for host, s in data.series:
            per_host[host] = _rate(_deltas(s, bins, field), bins)
        note = "From each host's metrics.jsonl."
    if not per_host:
        return None
    xs, label = bins.axis()
    unit = "samples/s" if data.kind == "extractor" else "answers/s"
    with _figure("hosts") as (fig, axes):
        ax = axes[0][0]
        for (host, ys), color in zip(sorted(per_host.items()), COLORS * 10, strict=False):
            ax.plot(xs, ys, color=color, label=host)
        ax.set_xlabel(label)
        ax.set_ylabel(unit)
        ax.set_title(f"{unit} per host")
        ax.legend(loc="upper right", ncols=3)
        return _done(fig, "hosts", "Hosts compared", note)


# -- the extractor ---------------------------------------------------------------------------------

def extract_rate(data: JobData, bins: Bins | None) -> Plot | None:
    """Samples/s and tokens/s over time, and the GB written (the hosts' metrics)."""
    if bins is None or not data.series:
        return None
    samples, toks = [0.0] * bins.n, [0.0] * bins.n
    written: list[float | None] = [None] * bins.n
    for _, s in data.series:
        samples = [a + b for a, b in zip(samples, _interval(s, bins, "samples_interval"), strict=True)]
        toks = [a + b for a, b in zip(toks, _interval(s, bins, "tokens_interval"), strict=True)]
        written = _add(written, _levels(s, bins, "bytes_written", hold=True))
    xs, label = bins.axis()
    with _figure("extract", rows=2, sharex=True) as (fig, axes):
        ax = axes[0][0]
        ax.plot(xs, _rate(samples, bins), color=COLORS[0], label="samples/s")
        ax.set_ylabel("samples/s")
        ax2 = ax.twinx()
        ax2.plot(xs, _rate(toks, bins), color=COLORS[1], linestyle="--", alpha=0.8, label="tokens/s")
        ax2.set_ylabel("tokens/s")
        ax2.grid(False)
        ax2.spines["right"].set_visible(True)
        ax.legend(handles=[*ax.get_lines(), *ax2.get_lines()], loc="upper right")
        ax.set_title(f"Extraction ({bins.width:g} s bins)")
        low = axes[1][0]
        low.plot(xs, [v / 1e9 if v is not None else math.nan for v in written], color=COLORS[2])
        low.set_ylabel("GB written")
        low.set_xlabel(label)
        return _done(fig, "extract", "Extraction over time", "From the hosts' metrics.jsonl.")


def spans(data: JobData) -> Plot | None:
    """Sample lengths and supervised span lengths (the manifests)."""
    feat = data.features
    if feat is None or not feat.samples:
        return None
    with _figure("spans", cols=2) as (fig, axes):
        for ax, (title, values), color in zip(axes[0], (("tokens per sample", list(feat.tokens)),
                                                        ("supervised tokens per sample",
                                                         list(feat.supervised))),
                                              (COLORS[0], COLORS[2]), strict=True):
            _hist(ax, values, 50, color)
            ax.set_title(title)
            ax.set_ylabel("samples")
        return _done(fig, "spans", "Sample and supervised span lengths",
                     "From the hosts' features/manifest.jsonl.")


# -- the run ---------------------------------------------------------------------------------------

def _job_rate(data: JobData, bins: Bins) -> list[float] | None:
    rec = data.records
    if _records_timed(rec) and rec is not None:
        return _rate(_from_records(rec, bins), bins)
    if data.series:
        field = "samples" if data.kind == "extractor" else "done"
        total = [0.0] * bins.n
        for _, s in data.series:
            total = [a + b for a, b in zip(total, _deltas(s, bins, field), strict=True)]
        return _rate(total, bins)
    return None


def run_throughput(jobs: list[JobData], bins: Bins | None) -> Plot | None:
    if bins is None:
        return None
    lines = [(d.job, r) for d in jobs if (r := _job_rate(d, bins)) is not None]
    if not lines:
        return None
    xs, label = bins.axis()
    with _figure("run-throughput") as (fig, axes):
        ax = axes[0][0]
        for (job, ys), color in zip(lines, COLORS * 10, strict=False):
            ax.plot(xs, ys, color=color, label=job)
        ax.set_xlabel(label)
        ax.set_ylabel("answers (samples)/s")
        ax.set_title("Throughput by job")
        ax.legend(loc="upper right", ncols=3)
        return _done(fig, "run-throughput", "Throughput by job",
                     "Answers/s of generator jobs, samples/s of extractor jobs.")


def run_cost(jobs: list[JobData], summaries: list[dict[str, Any]]) -> Plot | None:
    costs = [(s["job"], s.get("cost_usd") or 0.0) for s in summaries if s.get("cost_usd")]
    if not costs:
        return None
    with _figure("run-cost") as (fig, axes):
        ax = axes[0][0]
        ax.barh([j for j, _ in costs][::-1], [c for _, c in costs][::-1], color=COLORS[0])
        for (job, _), s in zip(costs, [s for s in summaries if s.get("cost_usd")], strict=True):
            budget = s.get("budget_usd")
            if budget:
                ax.plot([budget], [job], marker="|", markersize=14, color=COLORS[3])
        ax.set_xlabel("USD (| the job's budget)")
        ax.set_title("Cost by job")
        return _done(fig, "run-cost", "Cost by job", "From each job's records.")
