"""The merged dataset of a job: its hosts' shards as one `output.jsonl` and one
`output.errors.jsonl`, every id exactly once, checked (`fab fetch` writes them to
`DIR/<job>/`, beside the per-host copies `DIR/<host>/<job>/` it merges).

Only local files are read: the per-host copies fetch just brought (their `output.jsonl`,
`output.errors.jsonl`, `status.json` and `job.json`). Each id is read in place from the
start of its line (the payload writes `id` first; `payload.generate.journal.record_key`)
and remembered as an 8-byte hash, so a merge of a 1 GB output keeps memory flat. An id
answered on one host is written once; a second copy (a job relaunched over another set of
hosts) is dropped and counted; an id that failed on one host but was answered on another
keeps the answer. A last line without its newline (a copy fetched while the job wrote it)
is left out and counted: the next fetch brings it whole.

Checked: when every shard (`job.json`'s `shard` i/n) is present and finished, the merged
ids must number the shards' `total`s summed; anything else is an error naming both counts.
A merge of a job still running, stopped, or missing a shard is written and called partial.
Both files are replaced atomically (payload.atomic; a single copy kept whole is hard-linked
instead: see `_write`), and `merge.json` records what they were merged from, so a fetch
that brought nothing new leaves them as they are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handoff.host.transfer import copy_range
from payload import atomic
from payload.generate.journal import IdSet, id_hash, leading_id, record_key

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


# A long line's id is read from its first bytes when written first (`{"id":...`, as the
# payload writes it); a short line, or another layout, is parsed whole.
_HEAD = 512


@dataclass
class _Kept:
    """What a merge keeps of one source file: byte ranges, each a run of whole lines."""

    path: Path
    size: int = 0
    runs: list[tuple[int, int]] = field(default_factory=list)
    lines: int = 0

    @property
    def whole(self) -> bool:
        return self.runs == [(0, self.size)]


def _scan(path: Path, seen: IdSet, merged: Merged, skip: IdSet | None = None) -> _Kept:
    """Which lines of `path` the merge keeps (their ids new); what it leaves out is counted
    in `merged`. The file is mapped, not read: lines are found in place and only their heads
    are decoded, so a 1 GB shard costs a scan, not a Python object per line."""
    kept = _Kept(path)
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return kept
    with fh:
        kept.size = os.fstat(fh.fileno()).st_size
        if kept.size == 0:
            return kept
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos, run, size = 0, 0, kept.size  # lines [run, pos) are kept
            while pos < size:
                nl = mm.find(b"\n", pos)
                if nl < 0:  # still being written when fetched: the next fetch brings it whole
                    if mm[pos:size].strip():
                        merged.torn += 1
                    break
                if _admit(mm, pos, nl, seen, skip, merged):
                    kept.lines += 1
                else:
                    if pos > run:
                        kept.runs.append((run, pos))
                    run = nl + 1
                pos = nl + 1
            if pos > run:
                kept.runs.append((run, pos))
    return kept


def _write(dest: Path, kept: list[_Kept]) -> None:
    """`dest` replaced atomically by the kept lines. A single source kept whole (one host's
    finished job: the usual case) is hard-linked, not copied: 1 GB costs nothing more. The
    fetch that later appends to that host's copy grows a private copy first
    (transfer.download), so the merged file never changes under its name."""
    sources = [k for k in kept if k.runs]
    if len(sources) == 1 and sources[0].whole:
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


def _admit(mm: mmap.mmap, pos: int, end: int, seen: IdSet, skip: IdSet | None,
           merged: Merged) -> bool:
    """Is the line mm[pos:end] kept (its id new)? Counts what is left out, and why."""
    h = _string_id_hash(mm, pos, end)
    if h is None:
        key = leading_id(mm[pos:min(end, pos + _HEAD)]) if end - pos > _HEAD else None
        if key is None:
            line = mm[pos:end]
            if not line.strip():
                return False  # a blank line: left out, not counted
            key = record_key(line)
        if key is None:
            merged.unreadable += 1
            return False
        h = id_hash(key)
    if h in seen or (skip is not None and h in skip):
        merged.duplicates += 1
        return False
    seen.add(h)
    return True


_STRING_ID = b'{"id":"'


def _string_id_hash(mm: mmap.mmap, pos: int, end: int) -> int | None:
    """`id_hash` of a line that starts `{"id":"<id>"` with no escape in <id> (the payload's
    own lines), from its bytes in place: no slice of the line, no decoding. None otherwise."""
    start = pos + len(_STRING_ID)
    if mm[pos:start] != _STRING_ID:
        return None
    q = mm.find(b'"', start, min(end, pos + _HEAD))
    if q < 0:
        return None
    raw = mm[start:q]
    if b"\\" in raw:
        return None
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")


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
    kept = [_scan(c.folder / OUTPUT, answered, merged) for c in copies]
    merged.answers = sum(k.lines for k in kept)
    _write(folder / OUTPUT, kept)
    failed = IdSet()
    kept = [_scan(c.folder / ERRORS, failed, merged, skip=answered) for c in copies]
    merged.failures = sum(k.lines for k in kept)
    _write(folder / ERRORS, kept)
    atomic.write_json(manifest, {"job": job, "sources": sources, "answers": merged.answers,
                                 "failures": merged.failures, "duplicates": merged.duplicates},
                      durable=False)
    return merged


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
