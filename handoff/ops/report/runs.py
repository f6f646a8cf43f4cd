"""What a run is made of, as `fab report` reads it: the jobs under a fetch's `--dest`, each
job's host copies (`HostCopy`: its status, job.json and metrics), its records or features,
and the figures of the summary block (`summary`, `run_summary`).

Layout (what `fab fetch --dest DIR` writes): `DIR/<host>/<job>/` per host (status.json,
job.json, metrics.jsonl, the records or the features) and `DIR/<job>/` the merged dataset
of a generator job. A host folder is any folder of DIR holding job folders (a folder with
a `job.json` or `status.json`); names are checked as fetch checks them. Every file is the
host's word: read with a size cap and through handoff.host.untrusted.

The summary's figures come from the records (the merged dataset, or the per-host copies
each id once), never from what a host's status claims, except on the live page
(`live=True`), which has no records yet: there the counts are the hosts' status files'.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handoff.host import untrusted
from handoff.ops.merge import ERRORS, OUTPUT
from handoff.ops.report import features as feature_files
from handoff.ops.report import records as record_files
from handoff.ops.report import series as metrics_files
from handoff.ops.report.features import FeatureStats
from handoff.ops.report.records import RecordStats, quantiles
from handoff.ops.report.series import Series

MAX_JSON_BYTES = 1 << 20  # status.json / job.json (a few KB when honest)


@dataclass
class HostCopy:
    """One host's part of a job: fetched (`folder`) or, on the live page, read just now."""

    host: str
    folder: Path | None
    status: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    series: Series | None = None
    state: str = "unknown"  # the status file's, or (live) the job's as `fab status` tells it
    problems: list[str] = field(default_factory=list)

    @property
    def shard(self) -> tuple[int, int]:
        spec = str(self.meta.get("shard") or "0/1")
        try:
            i, n = (int(x) for x in spec.split("/"))
            return i, n
        except ValueError:
            return 0, 1


@dataclass
class JobData:
    job: str
    copies: list[HostCopy]  # in shard order
    kind: str = "generator"  # or "extractor"
    records: RecordStats | None = None
    features: FeatureStats | None = None
    live: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def meta(self) -> dict[str, Any]:
        """job.json of the first host (what was launched: the same on every host)."""
        return next((c.meta for c in self.copies if c.meta), {})

    @property
    def hosts(self) -> list[str]:
        return [c.host for c in self.copies]

    @property
    def series(self) -> list[tuple[str, Series]]:
        return [(c.host, c.series) for c in self.copies if c.series is not None and c.series.points]


# -- reading the files --------------------------------------------------------------------------

def read_json(path: Path) -> Any:
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_JSON_BYTES:
        return None
    try:
        return untrusted.loads(raw)
    except (ValueError, RecursionError):
        return None


def sampling(raw: Any) -> dict[str, Any] | None:
    """job.json's `sampling` (what the payload was told: model, temperature, max_tokens,
    reasoning, ...): plain values kept, objects as compact JSON text, each cut."""
    value = raw.get("sampling") if isinstance(raw, dict) else None
    if not isinstance(value, dict):
        return None
    out: dict[str, Any] = {}
    for key, v in list(value.items())[:32]:
        if not isinstance(key, str) or v is None:
            continue
        if isinstance(v, (dict, list)):
            try:
                v = json.dumps(v, separators=(",", ":"))[:200]
            except (TypeError, ValueError):
                continue
        kept = untrusted.integer(v) if isinstance(v, int) else untrusted.scalar(v)
        if kept is not None:
            out[untrusted.shown_name(key)] = kept
    return out


def host_copy(host: str, folder: Path) -> HostCopy:
    status, problems = untrusted.status(read_json(folder / "status.json"))
    raw_meta = read_json(folder / "job.json")
    meta, meta_problems = untrusted.meta(raw_meta)
    if meta is not None and (chosen := sampling(raw_meta)):
        meta["sampling"] = chosen
    copy = HostCopy(host, folder, status or {}, meta or {}, metrics_files.read(folder / "metrics.jsonl"),
                    problems=problems + meta_problems)
    copy.state = str(copy.status.get("state") or "unknown")
    return copy


def discover(dest: Path) -> dict[str, list[tuple[str, Path]]]:
    """job -> [(host, DIR/<host>/<job>)] for every job fetched under `dest`."""
    jobs: dict[str, list[tuple[str, Path]]] = {}
    for host_dir in sorted(p for p in dest.iterdir() if p.is_dir() and not p.is_symlink()):
        if untrusted.name_problem(host_dir.name):
            continue
        for job_dir in sorted(p for p in host_dir.iterdir() if p.is_dir() and not p.is_symlink()):
            if untrusted.name_problem(job_dir.name):
                continue
            if (job_dir / "job.json").is_file() or (job_dir / "status.json").is_file():
                jobs.setdefault(job_dir.name, []).append((host_dir.name, job_dir))
    return jobs


def load(dest: Path, job: str, found: list[tuple[str, Path]], sample_size: int = 200) -> JobData:
    """A job's data from its fetched files: its host copies, and its records (generator) or
    features (extractor)."""
    copies = sorted((host_copy(host, folder) for host, folder in found),
                    key=lambda c: (c.shard, c.host))
    data = JobData(job, copies)
    if any(feature_files.is_extractor(folder, c.meta, c.status)
           for c in copies if (folder := c.folder) is not None):
        data.kind = "extractor"
        data.features = feature_files.read(found)
        return data
    data.records = read_records(dest, job, copies, found, sample_size)
    return data


def live(job: str, copies: list[HostCopy]) -> JobData:
    """A job as the hosts tell it now (the live page): status, job.json and metrics only;
    its records come with `fab fetch`."""
    copies = sorted(copies, key=lambda c: (c.shard, c.host))
    kind = "extractor" if any(c.meta.get("role") == "extractor" or c.status.get("format")
                              for c in copies) else "generator"
    return JobData(job, copies, kind=kind, live=True)


def shard_hosts(copies: list[HostCopy]) -> list[str]:
    """The host of each shard: job.json's `shard_hosts`, else the copies in shard order."""
    named = next((c.meta.get("shard_hosts") for c in copies if c.meta.get("shard_hosts")), None)
    if isinstance(named, list) and named:
        return [str(h) for h in named]
    return [c.host for c in copies]


def read_records(dest: Path, job: str, copies: list[HostCopy], folders: list[tuple[str, Path]],
                 sample_size: int) -> RecordStats | None:
    stats = RecordStats(hosts=shard_hosts(copies), sample_size=sample_size)
    merged = dest / job
    if (merged / OUTPUT).is_file():
        record_files.read_merged(stats, merged / OUTPUT, merged / ERRORS)
        return stats
    present = [(h, f / OUTPUT, f / ERRORS) for h, f in folders
               if (f / OUTPUT).exists() or (f / ERRORS).exists()]
    order = {c.host: i for i, c in enumerate(copies)}
    present.sort(key=lambda x: order.get(x[0], 0))
    if not present:
        return None
    record_files.read_copies(stats, present)
    return stats


# -- times -------------------------------------------------------------------------------------------

def epoch(value: Any) -> float | None:
    """A status file's time: ISO 8601 text (the generator's) or unix seconds (the extractor's)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) and value > 0 else None
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    return parsed.timestamp()


def span(data: JobData) -> tuple[float | None, float | None, str]:
    """(start, end, from what): the first request sent and the last answer (records with
    `answered_at`), else the metrics' first and last line, else the status files'
    started/updated."""
    rec = data.records
    if rec is not None and rec.answers + rec.failures:
        ends = [a for a in (*rec.at, *rec.error_at) if not math.isnan(a)]
        if ends:
            starts = [a - (lat if not math.isnan(lat) else 0.0)
                      for a, lat in zip(rec.at, rec.latency, strict=True) if not math.isnan(a)] or ends
            return min(starts), max(ends), "answered_at"
    if data.series:
        first = [s.points[0] for _, s in data.series]
        starts = [p.t - (p.elapsed_s if p.elapsed_s is not None else (p.interval_s or 0.0))
                  for p in first]
        return min(starts), max(s.points[-1].t for _, s in data.series), "metrics"
    starts = [t for t in (epoch(c.status.get("started")) for c in data.copies) if t]
    ends = [t for t in (epoch(c.status.get("updated")) for c in data.copies) if t]
    if starts and ends:
        return min(starts), max(ends), "status"
    return None, None, "none"


# -- the summary block -----------------------------------------------------------------------------

def _sum(copies: list[HostCopy], key: str) -> float | None:
    values = [untrusted.number(c.status.get(key), minimum=0) for c in copies]
    known = [v for v in values if v is not None]
    if not known:
        return None
    total = sum(known)
    return int(total) if total == int(total) and all(
        isinstance(c.status.get(key), int) for c in copies if c.status.get(key) is not None) else total


def _last(data: JobData, name: str) -> float | None:
    values = [getattr(s.last, name) for _, s in data.series if s.last is not None]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def summary(data: JobData, now: float | None = None) -> dict[str, Any]:
    """The figures of the summary block (and of the `handoff-summary` JSON): at least
    samples, failed, cut, cost_usd, prompt_tokens, completion_tokens, reasoning_tokens,
    latency_s {p50, p90, p99} and wall_s (DESIGN.md, "Run report")."""
    meta = data.meta
    start, end, timeline = span(data)
    if data.live and any(c.state in ("running", "starting", "stopping") for c in data.copies):
        end = now or time.time()
    wall = (end - start) if start is not None and end is not None else None
    out: dict[str, Any] = {"job": data.job, "kind": data.kind, "hosts": data.hosts,
                           "states": {c.host: c.state for c in data.copies},
                           "source": "records", "timeline": timeline}
    rec, feat = data.records, data.features
    if data.kind == "extractor":
        out.update(source="features", samples=feat.samples if feat else int(_sum(data.copies, "done") or 0),
                   failed=int(_sum(data.copies, "failed") or 0), cut=None, cost_usd=0.0,
                   prompt_tokens=None, completion_tokens=None, reasoning_tokens=None,
                   latency_s=None)
        tokens = sum(feat.tokens) if feat and feat.samples else _sum(data.copies, "tokens_written")
        out.update(tokens=tokens, supervised_tokens=sum(feat.supervised) if feat else None,
                   bytes_written=_last(data, "bytes_written") or _sum(data.copies, "bytes_written"),
                   mismatches=feat.mismatches if feat else _sum(data.copies, "retokenized_mismatch"),
                   dropped=_sum(data.copies, "dropped_unsupervised"),
                   meta=dict(feat.meta) if feat else {})
        if data.live:
            out.update(source="live status", samples=int(_sum(data.copies, "done") or 0))
    elif data.live or rec is None:
        done = _sum(data.copies, "done")
        recent = [(s.last.latency_s, s.last.answers or 0) for _, s in data.series
                  if s.last is not None and s.last.latency_s]
        weight = sum(n for _, n in recent) or len(recent)
        latency = ({q: sum(d.get(q, 0.0) * (n or 1) for d, n in recent) / weight
                    for q in ("p50", "p90", "p99")} if recent else None)
        out.update(source="live status" if data.live else "status", samples=int(done or 0),
                   failed=int(_sum(data.copies, "failed") or 0),
                   cut=int(_sum(data.copies, "cut") or 0), cost_usd=_round(_sum(data.copies, "cost"), 6),
                   prompt_tokens=_sum(data.copies, "prompt_tokens"),
                   completion_tokens=_sum(data.copies, "completion_tokens"),
                   reasoning_tokens=_last(data, "reasoning_tokens"), latency_s=latency,
                   in_flight=_sum(data.copies, "in_flight"),
                   total=_sum(data.copies, "total"))
    else:
        lat = quantiles(rec.latency)
        out.update(samples=rec.answers, failed=rec.failures, cut=rec.cut,
                   cost_usd=round(rec.cost, 6), prompt_tokens=rec.prompt_tokens,
                   completion_tokens=rec.completion_tokens,
                   reasoning_tokens=rec.reasoning_tokens if rec.with_reasoning_count else None,
                   content_tokens=(rec.completion_tokens - rec.reasoning_tokens
                                   if rec.with_reasoning_count else None),
                   latency_s={k: round(v, 3) for k, v in lat.items()} if lat else None,
                   priced=rec.priced, unreadable=rec.unreadable, torn=rec.torn,
                   providers=dict(rec.providers.ranked()),
                   finish_reasons=dict(rec.finish_reasons.ranked()),
                   models=dict(rec.models.ranked()), errors_by_kind=dict(rec.errors.ranked()))
    tokens_all = (out.get("prompt_tokens") or 0) + (out.get("completion_tokens") or 0)
    cost = out.get("cost_usd")
    out["usd_per_mtok"] = round(cost / tokens_all * 1e6, 4) if cost and tokens_all else None
    out["wall_s"] = _round(wall, 3)
    if wall and wall > 0:
        out["answers_per_s"] = round((out["samples"] or 0) / wall, 4)
        per_s = out.get("completion_tokens") if data.kind != "extractor" else out.get("tokens")
        out["tokens_per_s"] = round(per_s / wall, 2) if per_s else None
    out["started"] = start
    out["budget_usd"] = untrusted.number(meta.get("max_cost"), minimum=0)
    sampling = meta.get("sampling") if isinstance(meta.get("sampling"), dict) else None
    out["settings"] = {k: untrusted.visible(str(v), 200) for k, v in (sampling or {}).items()
                       if v is not None}
    out["total"] = out.get("total") or _sum(data.copies, "total")
    if data.kind != "extractor":
        # requests cancelled in flight by a stop or a budget (each asked again): the hosts'
        # metrics, else their status files
        cancelled = _last(data, "cancelled")
        out["cancelled"] = int(cancelled if cancelled is not None
                               else _sum(data.copies, "cancelled") or 0)
    return out


def run_summary(jobs: list[JobData], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's figures: every job's summed (latency quantiles over every answer)."""
    latencies: list[float] = []
    for data in jobs:
        if data.records is not None and not data.live:
            latencies += [v for v in data.records.latency if not math.isnan(v)]
    lat = quantiles(latencies)
    starts = [s["started"] for s in summaries if s.get("started")]
    ends = [s["started"] + s["wall_s"] for s in summaries if s.get("started") and s.get("wall_s")]

    def total(key: str) -> Any:
        values = [s.get(key) for s in summaries if s.get(key) is not None]
        return sum(values) if values else None

    out: dict[str, Any] = {
        "jobs": [s["job"] for s in summaries],
        "hosts": sorted({h for s in summaries for h in s["hosts"]}),
        "samples": total("samples") or 0, "failed": total("failed") or 0, "cut": total("cut") or 0,
        "cost_usd": round(total("cost_usd") or 0.0, 6), "prompt_tokens": total("prompt_tokens"),
        "completion_tokens": total("completion_tokens"),
        "reasoning_tokens": total("reasoning_tokens"),
        "latency_s": {k: round(v, 3) for k, v in lat.items()} if lat else None,
        "wall_s": round(max(ends) - min(starts), 3) if starts and ends else None,
        "started": min(starts) if starts else None,
        "source": "live status" if any(d.live for d in jobs) else "records",
    }
    tokens_all = (out["prompt_tokens"] or 0) + (out["completion_tokens"] or 0)
    out["usd_per_mtok"] = round(out["cost_usd"] / tokens_all * 1e6, 4) if tokens_all else None
    return out
