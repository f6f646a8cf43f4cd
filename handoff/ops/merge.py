"""The merged dataset of a job: its hosts' shards as one `output.jsonl` and one
`output.errors.jsonl`, every id exactly once, checked (`fab fetch` writes them to
`DIR/<job>/`, beside the per-host copies `DIR/<host>/<job>/` it merges).

Only local files are read: the per-host copies fetch just brought (their `output.jsonl`,
`output.errors.jsonl`, `status.json` and `job.json`). Each id is read in place from the
start of its line (the payload writes `id` first; `payload.generate.journal.record_key`)
and remembered as an 8-byte hash, so a merge of a 1 GB output keeps memory flat. The ids
are kept per copy in an index beside it (handoff.ops.merge_index), which the fetch that
brought the bytes extends as it writes them: a merge reads only lines no index holds yet
(a resumed fetch's merge, the bytes that came; a grown output's, what it grew by). An id
answered on one host is written once; a second copy (a job relaunched over another set of
hosts) is dropped and counted; an id that failed on one host but was answered on another
keeps the answer. A last line without its newline (a copy fetched while the job wrote it)
is left out and counted: the next fetch brings it whole.

Checked: when every shard (`job.json`'s `shard` i/n) is present and finished, the merged
ids must number the shards' `total`s summed; anything else is an error naming both counts.
A merge of a job still running, stopped, or missing a shard is written and called partial.
Both files are replaced atomically (payload.atomic; a single copy kept whole is hard-linked
instead: see `_write`), and `merge.json` records what they were merged from, so a fetch
that brought nothing new leaves them as they are. A merged `output.jsonl` that is its own
file grows instead (`_grow`): while `merge.json` still describes it and its copies (how far
each was merged, the probe of those bytes, the merged file's stamp), a merge appends only
the lines the copies gained, reading only those; a linked copy grows with its host's copy
(fetch appends whole lines only: handoff.host.transfer.WholeLines).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from handoff.host.remote_code import fetch_list
from handoff.host.transfer import copy_range
from handoff.ops import merge_index
from payload import atomic
from payload.generate.journal import IdSet

OUTPUT, ERRORS = "output.jsonl", "output.errors.jsonl"
MANIFEST = "merge.json"


@dataclass(frozen=True)
class ShardCopy:
    """One host's local copy of the job (`DIR/<host>/<job>/`)."""

    host: str
    folder: Path

    def _json(self, name: str) -> dict[str, Any]:
        try:
            data = json.loads((self.folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def status(self) -> dict[str, Any]:
        return self._json("status.json")

    @property
    def meta(self) -> dict[str, Any]:
        return self._json("job.json")

    def sizes(self) -> dict[str, int]:
        return {name: (self.folder / name).stat().st_size if (self.folder / name).exists() else 0
                for name in (OUTPUT, ERRORS)}


@dataclass
class Merged:
    job: str
    folder: Path
    hosts: list[str]
    answers: int = 0
    failures: int = 0
    duplicates: int = 0  # second copies of an id, dropped
    torn: int = 0  # last lines still being written when fetched, left out
    unreadable: int = 0  # lines with no readable id, left out
    expected: int | None = None  # the shards' totals summed, once all are in and finished
    partial: list[str] = field(default_factory=list)  # why the merge is not the whole job
    unchanged: bool = False  # nothing new since the last merge: files left as they were

    @property
    def ids(self) -> int:
        return self.answers + self.failures

    @property
    def problem(self) -> str | None:
        """A finished job whose merge does not hold exactly its ids: an error."""
        if self.expected is not None and self.ids != self.expected:
            return (f"job {self.job}: the merge holds {self.ids} ids but its shards' totals say "
                    f"{self.expected}; check the per-host copies under {self.folder.parent}")
        return None

    def describe(self) -> str:
        what = (f"{self.answers} answers + {self.failures} failures = {self.ids} ids, each once, "
                f"from {len(self.hosts)} host(s)")
        extras = [f"{n} {label}" for n, label in ((self.duplicates, "duplicate copies dropped"),
                                                  (self.torn, "lines still being written left out"),
                                                  (self.unreadable, "unreadable lines left out")) if n]
        if self.expected is not None and self.ids == self.expected:
            extras.append(f"complete: all {self.expected} ids of the job")
        if self.partial:
            extras.append("partial: " + "; ".join(self.partial))
        if self.unchanged:
            extras.append("unchanged since the last fetch")
        return what + (f" ({'; '.join(extras)})" if extras else "")


@dataclass
class _Kept:
    """What a merge keeps of one source file: byte ranges, each a run of whole lines, and
    how far the file was read (`indexed`: its whole lines' end)."""

    path: Path
    size: int = 0
    runs: list[tuple[int, int]] = field(default_factory=list)
    lines: int = 0
    indexed: int = 0

    @property
    def whole(self) -> bool:
        return self.runs == [(0, self.size)]


def _scan(path: Path, seen: IdSet, merged: Merged, skip: IdSet | None = None,
          idx: merge_index.Index | None = None, first: int = 0) -> _Kept:
    """Which lines of `path` the merge keeps (their ids new); what it leaves out is counted
    in `merged`. The ids come from the file's index (handoff.ops.merge_index), extended
    over what is new since it was last indexed (by the fetch that wrote it, or the last
    merge): a resumed fetch's merge reads only the bytes that came. `first`: the line to
    start from (a merge that only appends: the lines before it were merged already)."""
    kept = _Kept(path)
    try:
        kept.size = path.stat().st_size
    except FileNotFoundError:
        return kept
    if kept.size == 0:
        return kept
    idx = idx or merge_index.current(path)
    kept.indexed = idx.length
    if idx.length < kept.size:  # still being written when fetched: the next fetch brings it whole
        with path.open("rb") as fh:
            fh.seek(idx.length)
            if fh.read(kept.size - idx.length).strip():
                merged.torn += 1
    hashes, starts, n = idx.hashes, idx.starts, len(idx.hashes)
    if n and not first and not len(seen) and not (skip is not None and len(skip)) \
            and min(hashes) > merge_index.UNREADABLE and len(unique := set(hashes)) == n:
        # The usual case (the first copy, every line a new id): kept whole, no per-line work.
        seen.adopt(unique)
        kept.lines, kept.runs = n, [(0, idx.length)]
        return kept
    run = starts[first] if first < n else idx.length  # lines [run, the current one) are kept
    for i in range(first, n):
        h = hashes[i]
        if h == merge_index.BLANK:
            pass  # a blank line: left out, not counted
        elif h == merge_index.UNREADABLE:
            merged.unreadable += 1
        elif h in seen or (skip is not None and h in skip):
            merged.duplicates += 1
        else:
            seen.add(h)
            kept.lines += 1
            continue
        if starts[i] > run:
            kept.runs.append((run, starts[i]))
        run = starts[i + 1] if i + 1 < n else idx.length
    if idx.length > run:
        kept.runs.append((run, idx.length))
    return kept


def _write(dest: Path, kept: list[_Kept]) -> None:
    """`dest` replaced atomically by the kept lines. A single source kept whole (one host's
    job: the usual case) is hard-linked, not copied: 1 GB costs nothing more. The fetch
    that later appends to that host's copy appends whole lines only (transfer.WholeLines),
    which the merged file then holds too until this merge checks them: kept whole, the link
    stays; a line left out, this merge writes the merged file on its own."""
    sources = [k for k in kept if k.runs]
    if len(sources) == 1 and sources[0].whole:
        with contextlib.suppress(OSError):
            if os.path.samefile(sources[0].path, dest):
                return  # linked already (and rename() of one file onto itself does nothing)
        tmp = atomic.temp_name(dest)
        try:
            os.link(sources[0].path, tmp)
            os.replace(tmp, dest)
            return
        except OSError:  # no hard links on this filesystem: copy
            with contextlib.suppress(OSError):
                tmp.unlink()
    with atomic.atomic_file(dest, durable=False) as out:
        for k in sources:
            with k.path.open("rb") as src:
                for start, end in k.runs:
                    copy_range(src, out, start, end)


def _shard_index(copy: ShardCopy) -> tuple[int, str]:
    spec = str(copy.meta.get("shard") or "0/1")
    try:
        return int(spec.split("/")[0]), copy.host
    except ValueError:
        return 0, copy.host


def merge(job: str, copies: list[ShardCopy], dest: Path) -> Merged:
    """Merge `copies` (one per host) into `dest/<job>/`; see the module's docstring."""
    copies = sorted(copies, key=_shard_index)
    folder = dest / job
    merged = Merged(job, folder, [c.host for c in copies])
    sources = {c.host: c.sizes() for c in copies}
    _expectations(merged, copies)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / MANIFEST
    try:
        before = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = None
    if (isinstance(before, dict) and before.get("sources") == sources
            and (folder / OUTPUT).exists() and (folder / ERRORS).exists()):
        merged.answers, merged.failures = int(before.get("answers", 0)), int(before.get("failures", 0))
        merged.duplicates = int(before.get("duplicates", 0))
        merged.unchanged = True
        return merged
    answered = IdSet()
    grown = _grow(folder / OUTPUT, copies, before.get("output") if isinstance(before, dict)
                  else None, answered, merged)
    if grown is None:
        kept = [_scan(c.folder / OUTPUT, answered, merged) for c in copies]
        merged.answers = sum(k.lines for k in kept)
        _write(folder / OUTPUT, kept)
        grown = kept
    output = _record(folder / OUTPUT, copies, grown, merged)
    failed = IdSet()
    kept = [_scan(c.folder / ERRORS, failed, merged, skip=answered) for c in copies]
    merged.failures = sum(k.lines for k in kept)
    _write(folder / ERRORS, kept)
    atomic.write_json(manifest, {"job": job, "sources": sources, "answers": merged.answers,
                                 "failures": merged.failures, "duplicates": merged.duplicates,
                                 "output": output},
                      durable=False)
    return merged


def _record(path: Path, copies: list[ShardCopy], kept: list[_Kept], merged: Merged) -> dict[str, Any]:
    """What a later merge needs to append only the lines new since this one (`_grow`): the
    merged output.jsonl as written (its stamp), per source how far it was read (its whole
    lines' end) and the probe of those bytes, and the output side's counts so far."""
    return {"hosts": [c.host for c in copies], "merged": merge_index.stamp(str(path)),
            "lengths": {c.host: k.indexed for c, k in zip(copies, kept, strict=True)},
            "probes": {c.host: fetch_list.probe_sha256(str(k.path), k.indexed) if k.indexed
                       else None for c, k in zip(copies, kept, strict=True)},
            "answers": merged.answers, "duplicates": merged.duplicates,
            "unreadable": merged.unreadable}


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _grow(path: Path, copies: list[ShardCopy], record: Any, seen: IdSet,
          merged: Merged) -> list[_Kept] | None:
    """Append to the merged `path` only the lines its sources gained since the last merge,
    when that merge's `record` (`_record`) still describes them: the same hosts in the same
    order, the merged file untouched since it was written and its own file (no source's
    link), each source's merged bytes unchanged (their probe). The ids merged already come
    from the sources' indexes (into `seen`); the new lines are scanned and kept as a whole
    merge would keep them. None, with nothing changed: the record does not hold, and the
    caller merges everything again."""
    if not isinstance(record, dict) or record.get("hosts") != [c.host for c in copies]:
        return None
    lengths, probes = record.get("lengths"), record.get("probes")
    answers, duplicates, unreadable = (record.get(k) for k in ("answers", "duplicates", "unreadable"))
    if not isinstance(lengths, dict) or not isinstance(probes, dict) or not (
            _whole(answers) and _whole(duplicates) and _whole(unreadable)):
        return None
    try:
        written = merge_index.stamp(str(path))
    except OSError:
        return None
    if written != record.get("merged"):
        return None
    plans: list[tuple[Path, merge_index.Index | None, int]] = []
    for c in copies:
        source, length = c.folder / OUTPUT, lengths.get(c.host)
        if not _whole(length):
            return None
        try:
            st = source.stat()
        except FileNotFoundError:
            if length:
                return None
            plans.append((source, None, 0))
            continue
        if [st.st_dev, st.st_ino] == written[2:]:
            return None  # the merged file is this source's link: appending would change it
        if length and fetch_list.probe_sha256(str(source), length) != probes.get(c.host):
            return None
        idx = merge_index.current(source)
        first = bisect.bisect_left(idx.starts, length)
        if (idx.starts[first] if first < len(idx.starts) else idx.length) != length:
            return None  # not where a line starts: not what the last merge read
        plans.append((source, idx, first))
    seen.adopt({h for _, idx, first in plans if idx is not None for h in idx.hashes[:first]}
               - {merge_index.BLANK, merge_index.UNREADABLE})
    merged.answers, merged.duplicates, merged.unreadable = answers, duplicates, unreadable
    kept = [_scan(source, seen, merged, idx=idx, first=first) if idx is not None
            else _Kept(source) for source, idx, first in plans]
    with path.open("r+b") as out:
        out.seek(written[0])
        out.truncate()  # nothing after what the record describes (it held, by its stamp)
        for k in kept:
            if k.runs:
                with k.path.open("rb") as src:
                    for start, end in k.runs:
                        copy_range(src, out, start, end)
    merged.answers += sum(k.lines for k in kept)
    return kept


def _expectations(merged: Merged, copies: list[ShardCopy]) -> None:
    """How many ids the whole job holds, when that is known: every shard present and
    finished; else why the merge is partial."""
    counts = {str(c.meta.get("shard") or "0/1").split("/")[-1] for c in copies}
    n = int(counts.pop()) if len(counts) == 1 and next(iter(counts)).isdigit() else None
    present = {_shard_index(c)[0] for c in copies}
    if n is not None and len(present) < n:
        missing = sorted(set(range(n)) - present)
        merged.partial.append(f"shard{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(f'{i}/{n}' for i in missing)} not fetched")
    states = {c.host: str(c.status.get("state") or "unknown") for c in copies}
    unfinished = [f"{host} {state}" for host, state in states.items() if state != "finished"]
    if unfinished:
        merged.partial.append("not finished on " + ", ".join(unfinished))
    totals = [t for t in (c.status.get("total") for c in copies) if isinstance(t, int)]
    if not merged.partial and len(totals) == len(copies):
        # --no-shard: every host did the whole input; sharded: the shards add up.
        merged.expected = max(totals) if n == 1 and len(copies) > 1 else sum(totals)
