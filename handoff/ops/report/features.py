"""An extractor job's fetched features, summed over its hosts (`FeatureStats`).

What `fab report` shows of a job of the extractor role: the samples written (each host's
`features/manifest.jsonl`, or while it runs the ranks' `manifest.parts/*.jsonl`), their
token and supervised-span lengths, the re-tokenization mismatches (`mismatches.*.jsonl`:
counted, the first few kept), and `features/meta.json`'s format, layers and model. The
files are the host's word: read line by line with the records' limits, every field
optional; only two numbers a sample are kept.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handoff.host import untrusted
from handoff.ops.report.records import RecordStats, lines

FEATURES = "features"
MAX_KEPT = 20  # mismatches listed
MAX_META_BYTES = 1 << 20


@dataclass
class FeatureStats:
    samples: int = 0
    tokens: array[int] = field(default_factory=lambda: array("l"))
    supervised: array[int] = field(default_factory=lambda: array("l"))
    per_host: dict[str, int] = field(default_factory=dict)
    mismatches: int = 0
    mismatch_samples: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # format, layers, model, dtype, ...
    unreadable: int = 0


def _entries(folder: Path) -> list[Path]:
    manifest = folder / "manifest.jsonl"
    if manifest.is_file():
        return [manifest]
    parts = folder / "manifest.parts"
    return sorted(parts.glob("*.jsonl")) if parts.is_dir() else []


def _meta(folder: Path) -> dict[str, Any]:
    path = folder / "meta.json"
    try:
        with path.open("rb") as fh:
            raw = untrusted.loads(fh.read(MAX_META_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(raw, dict):
        return {}
    out: dict[str, Any] = {}
    for key in ("format", "final_state", "dtype", "model", "num_layers", "hidden_size", "turns"):
        value = untrusted.scalar(raw.get(key))
        if value is not None:
            out[key] = untrusted.text(str(value), 200)
    layers = raw.get("layers")
    if isinstance(layers, list) and len(layers) <= 16:
        out["layers"] = ", ".join(str(untrusted.integer(x)) for x in layers)
    return out


def read(copies: list[tuple[str, Path]]) -> FeatureStats:
    """The features under each host's copy (`(host, DIR/<host>/<job>)`), each id once."""
    stats = FeatureStats()
    counter = RecordStats(sample_size=0)  # counts what is no entry
    seen: set[str] = set()
    for host, folder in copies:
        features = folder / FEATURES
        if not stats.meta:
            stats.meta = _meta(features)
        n = 0
        for path in _entries(features):
            for entry in lines(path, counter):
                key = str(entry.get("id"))
                if key in seen:
                    continue
                seen.add(key)
                n += 1
                stats.tokens.append(untrusted.count(entry.get("num_tokens")) or 0)
                stats.supervised.append(untrusted.count(entry.get("num_supervised")) or 0)
        stats.per_host[host] = n
        stats.samples += n
        for path in sorted(features.glob("mismatches.*.jsonl")):
            for entry in lines(path, counter):
                stats.mismatches += 1
                if len(stats.mismatch_samples) < MAX_KEPT:
                    stats.mismatch_samples.append({
                        "host": host, "id": untrusted.shown_name(entry.get("id")),
                        "turn": untrusted.count(entry.get("turn")),
                        "supervised": untrusted.count(entry.get("supervised")),
                        "completion_tokens": untrusted.count(entry.get("completion_tokens")),
                        "action": untrusted.text(entry.get("action"), 20)})
    stats.unreadable = counter.unreadable
    return stats


def is_extractor(folder: Path, meta: dict[str, Any] | None, status: dict[str, Any] | None) -> bool:
    """An extractor job: its role says so, or it has features and no answers."""
    role = (meta or {}).get("role")
    if role is not None:
        return role == "extractor"
    if (status or {}).get("format") is not None:
        return True
    return (folder / FEATURES).is_dir() and not (folder / "output.jsonl").exists()
