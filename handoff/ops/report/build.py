"""`fab report`: the pages of a fetched run, written beside what fetch wrote.

`DIR/report.html` for the run (every job: the summed figures, a row per job linking to its
page, throughput and cost by job) and `DIR/<job>/report.html` per job (`--job J`: that
page alone), each one self-contained file (handoff.ops.report.page). `render` makes the
same pages from job data read elsewhere (the live page: handoff.ops.report.live).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handoff.errors import HandoffError, UsageError, did_you_mean
from handoff.host import untrusted
from handoff.ops.report import page, plots, runs
from handoff.ops.report.runs import JobData
from payload import atomic

REPORT = "report.html"


class NothingToReport(HandoffError):
    """No fetched job under the folder: exit 1, naming the command that fetches one."""


@dataclass
class Built:
    run: Path | None = None  # DIR/report.html (None with --job)
    jobs: dict[str, Path] = field(default_factory=dict)  # job -> DIR/<job>/report.html
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    run_summary: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def job_plots(data: JobData, summary: dict[str, Any]) -> tuple[list[plots.Plot], list[str]]:
    """A job's figures, and a line for each that could not be drawn, saying why."""
    start, end, _ = runs.span(data)  # live: up to the hosts' last metrics line
    bins = plots.job_bins(data, start, end)
    no_time = ("no timeline: the records carry no answered_at and no metrics.jsonl was "
               "fetched (a payload from before round 4)")
    made: list[plots.Plot] = []
    missing: list[str] = []

    def add(what: str, plot: plots.Plot | None, why: str) -> None:
        if plot is not None:
            made.append(plot)
        else:
            missing.append(f"{what}: not drawn: {why}.")

    if data.kind == "extractor":
        add("Extraction over time", plots.extract_rate(data, bins),
            "no metrics.jsonl from the hosts (a payload from before round 4)")
        add("Sample lengths", plots.spans(data), "no features/manifest.jsonl fetched yet")
    else:
        add("Throughput over time", plots.throughput(data, bins), no_time)
        add("Cost", plots.cost(data, bins), "no answer with a usage.cost")
        add("Latency", plots.latency(data, bins),
            "no answer yet" if not data.live else "no answer's latency in the metrics yet")
        if not data.live:
            add("Token lengths", plots.tokens(data), "no answer yet")
        err = plots.errors(data, bins)
        if err is not None:
            made.append(err)
        add("Providers and finish reasons", plots.mix(data), "no answer yet")
    if len(data.copies) > 1:
        add("Hosts compared", plots.hosts(data, bins), no_time)
    return made, missing


def render(jobs: list[JobData], *, sample_size: int, live_every: float | None = None,
           now: float | None = None) -> tuple[dict[str, str], dict[str, dict[str, Any]], dict[str, Any]]:
    """The pages of these jobs: {"" (the run), job: html}, each job's summary, the run's."""
    pages: dict[str, str] = {}
    summaries: dict[str, dict[str, Any]] = {}
    for data in jobs:
        s = runs.summary(data, now)
        summaries[data.job] = s
        made, missing = job_plots(data, s)
        answers = data.records.sampled() if data.records is not None else []
        pages[data.job] = page.job_page(data, s, made, missing, answers=answers,
                                        sample_size=sample_size, live_every=live_every,
                                        run_link=f"../{REPORT}" if len(jobs) else None)
    run = runs.run_summary(jobs, list(summaries.values()))
    starts = [s["started"] for s in summaries.values() if s.get("started")]
    ends = [s["started"] + s["wall_s"] for s in summaries.values()
            if s.get("started") and s.get("wall_s")]
    bins = plots.Bins.over(min(starts), max(ends)) if starts and ends else None
    made = [p for p in (plots.run_throughput(jobs, bins),
                        plots.run_cost(jobs, list(summaries.values()))) if p is not None]
    missing = [] if bins is not None else ["Throughput by job: not drawn: no job has a timeline."]
    links = {d.job: f"{urllib.parse.quote(d.job)}/{REPORT}" for d in jobs}
    pages[""] = page.run_page([(d, summaries[d.job]) for d in jobs], run, made, missing,
                              live_every=live_every, links=links)
    return pages, summaries, run


def jobs_in(dest: Path, job: str | None) -> dict[str, list[tuple[str, Path]]]:
    """The fetched jobs under `dest` (or the `--job` one), refusing what cannot be reported."""
    if not dest.is_dir():
        raise UsageError(f"--dest {dest}: no such folder; fetch the run first: "
                         f"fab fetch --dest {dest}")
    found = runs.discover(dest)
    if job is not None:
        if job not in found:
            raise UsageError(f"--job {job}: not fetched under {dest} (jobs there: "
                             f"{', '.join(found) or 'none'}){did_you_mean(job, list(found))}; "
                             f"fab fetch --job {job} --dest {dest} brings it")
        found = {job: found[job]}
    if not found:
        raise NothingToReport(f"no fetched job under {dest} (a job folder is "
                              f"{dest}/<host>/<job>/ with its status.json); run fab fetch --dest "
                              f"{dest} first")
    return found


def build(dest: Path, job: str | None = None, sample_size: int = 200) -> Built:
    """Read every job fetched under `dest` (or `job`) and write its pages."""
    found = jobs_in(dest, job)
    data = [runs.load(dest, name, copies, sample_size) for name, copies in sorted(found.items())]
    pages, summaries, run = render(data, sample_size=sample_size)
    built = Built(summaries=summaries, run_summary=run)
    for d in data:
        folder = untrusted.inside(dest, d.job)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / REPORT
        html = pages[d.job] if job is None else pages[d.job].replace(
            f'<p><a href="../{REPORT}">← the whole run</a></p>', "")
        atomic.write_text(path, html, durable=False)
        built.jobs[d.job] = path
        built.warnings += _warnings(d)
    if job is None:
        built.run = dest / REPORT
        atomic.write_text(built.run, pages[""], durable=False)
    return built


def _warnings(d: JobData) -> list[str]:
    out = []
    rec = d.records
    if rec is not None and (rec.unreadable or rec.torn):
        out.append(f"{d.job}: {rec.unreadable} unreadable line(s) and {rec.torn} line(s) still "
                   f"being written when fetched were left out of the figures")
    if d.kind == "generator" and rec is None:
        out.append(f"{d.job}: no records fetched (output.jsonl): its figures are the hosts' "
                   f"status files'")
    for c in d.copies:
        for problem in c.problems:
            out.append(f"{d.job} on {c.host}: {problem}")
        if c.series is not None and c.series.skipped:
            out.append(f"{d.job} on {c.host}: {c.series.skipped} metrics.jsonl line(s) skipped "
                       f"(not a metrics object)")
    return out
