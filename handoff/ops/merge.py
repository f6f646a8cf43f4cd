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

The shards are the workstation's (handoff.config.shards: the layout `fab launch` recorded),
never a host's `job.json`: the hosts are merged in launch order (so which copy of an id is
kept never depends on a host's word), and every line a host returns must be of its shard
(the payload's id -> shard function, in some launch of the job): a line whose id is not
is refused, counted and named per host (`Merged.foreign`), and that is an error. Checked:
when every shard of the launch is present and finished, the merged ids must number the
input's prompts as the workstation counted them (else the shards' `total`s summed, for an
input never read here); anything else is an error naming both counts. A merge of a job
still running, stopped, or missing a shard is written and called partial, as is one of a
job this workstation did not launch (no layout: its completeness cannot be told). The
status.json and job.json of each copy are read with the bounded reader
(handoff.host.untrusted): a bomb in one is that copy's note, never a traceback.
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
import functools
import hashlib
import json
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from handoff.config.shards import ShardLayout
from handoff.host import untrusted
from handoff.host.remote_code import fetch_list
from handoff.host.transfer import copy_range
from handoff.ops import merge_index
from payload import atomic
from payload.generate.journal import IdSet, leading_id, record_key
from payload.records import shard_hash

OUTPUT, ERRORS = "output.jsonl", "output.errors.jsonl"
MANIFEST = "merge.json"


@dataclass(frozen=True)
class ShardCopy:
    """One host's local copy of the job (`DIR/<host>/<job>/`). `stale`: why it was not
    fetched by this command (its host unreachable, not asked): its last fetched copy."""

    host: str
    folder: Path
    stale: str | None = None

    @property
    def fetched(self) -> float | None:
        """When the copy was last written here (its newest file's mtime)."""
        times = [(self.folder / name).stat().st_mtime for name in (OUTPUT, ERRORS, "status.json")
                 if (self.folder / name).exists()]
        return max(times) if times else None

    def _read(self, name: str, read: Any) -> tuple[dict[str, Any], list[str]]:
        """A fetched status.json / job.json: the host's bytes, read bounded and by shape."""
        try:
            with (self.folder / name).open("rb") as fh:
                raw = fh.read(untrusted.SMALL_FILE.max_bytes + 1)
        except OSError:
            return {}, []
        try:
            parsed, problems = read(untrusted.loads(raw, f"{self.host}'s {name}",
                                                    untrusted.SMALL_FILE))
        except untrusted.Untrusted as exc:
            return {}, [str(exc)]
        return parsed or {}, problems

    @functools.cached_property
    def _status(self) -> tuple[dict[str, Any], list[str]]:
        return self._read("status.json", untrusted.status)

    @functools.cached_property
    def _meta(self) -> tuple[dict[str, Any], list[str]]:
        return self._read("job.json", untrusted.meta)

    @property
    def status(self) -> dict[str, Any]:
        return self._status[0]

    @property
    def meta(self) -> dict[str, Any]:
        return self._meta[0]

    @property
    def problems(self) -> list[str]:
        """What was wrong with its status.json and job.json (shown, never fatal)."""
        return self._status[1] + self._meta[1]

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
    # Per host: lines whose id is not of that host's shard (the workstation's layout), refused.
    foreign: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # copies' unreadable status/job files
    error: str | None = None  # the merge could not be written (no room), said with the fix
    # Answers the last merge held that no copy holds now (a copy lost or cut here, a host
    # that lost its outputs): kept from that merge, so a merge never loses an id.
    carried: int = 0

    @property
    def ids(self) -> int:
        return self.answers + self.failures

    @property
    def problem(self) -> str | None:
        """Records refused as not of their host's shard, or a finished job whose merge does
        not hold exactly its ids: an error."""
        found = [f"job {self.job}: {self.error}"] if self.error else []
        if self.foreign:
            hosts = ", ".join(f"{host} ({n})" for host, n in self.foreign.items())
            found.append(f"job {self.job}: refused {sum(self.foreign.values())} record(s) whose "
                         f"id is not in the returning host's shard: {hosts}; they are not in "
                         f"the merge (a host may return only its own shard's answers)")
        if self.expected is not None and self.ids != self.expected:
            found.append(f"job {self.job}: the merge holds {self.ids} ids but the job has "
                         f"{self.expected}; check the per-host copies under {self.folder.parent}")
        return "; ".join(found) or None

    def describe(self) -> str:
        what = (f"{self.answers} answers + {self.failures} failures = {self.ids} ids, each once, "
                f"from {len(self.hosts)} host(s)")
        extras = [f"{n} {label}" for n, label in ((self.duplicates, "duplicate copies dropped"),
                                                  (self.torn, "lines still being written left out"),
                                                  (self.unreadable, "unreadable lines left out"),
                                                  (sum(self.foreign.values()),
                                                   "lines of another host's shard REFUSED")) if n]
        if self.carried:
            extras.append(f"{self.carried} answers kept from the last merge (no copy here holds "
                          f"them now)")
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


_STRING_ID = b'{"id":"'


def _foreign(path: Path, idx: merge_index.Index, owns: Callable[[int], bool],
             first: int = 0) -> set[int]:
    """The lines of `path` (by number) whose id `owns` says is not the host's (`owns` takes
    the id's payload.records.shard_hash), from line `first` on. The payload's own lines (`{"id":"…"` first) are
    hashed from their raw bytes in place; any other is read as the merge reads it."""
    out: set[int] = set()
    if not idx.starts:
        return out
    sha256, skip = hashlib.sha256, (merge_index.BLANK, merge_index.UNREADABLE)
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), idx.length, access=mmap.ACCESS_READ) as mm:
        starts, hashes, n = idx.starts, idx.hashes, len(idx.starts)
        for i in range(first, n):
            if hashes[i] in skip:
                continue
            start, end = starts[i], (starts[i + 1] if i + 1 < n else idx.length) - 1
            if mm[start:start + 7] == _STRING_ID:
                q = mm.find(b'"', start + 7, min(end, start + 512))
                raw = mm[start + 7:q] if q >= 0 else b"\\"
                if b"\\" not in raw:  # no escape: the raw bytes are the id's UTF-8
                    if not owns(int.from_bytes(sha256(raw).digest()[:8], "big")):
                        out.add(i)
                    continue
            key = leading_id(mm[start:min(end, start + 4096)])
            if key is None and end - start <= merge_index.MAX_PARSED_LINE:
                key = record_key(mm[start:end])
            if key is not None and not owns(shard_hash(key)):
                out.add(i)
    return out


def _scan(path: Path, seen: IdSet, merged: Merged, skip: IdSet | None = None,
          idx: merge_index.Index | None = None, first: int = 0,
          owns: Callable[[int], bool] | None = None, host: str = "") -> _Kept:
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
    refused = _foreign(path, idx, owns, first) if owns is not None else set()
    if refused:
        merged.foreign[host] = merged.foreign.get(host, 0) + len(refused)
    if n and not first and not len(seen) and not (skip is not None and len(skip)) and not refused \
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
        elif i in refused:
            pass  # another shard's id: refused, counted above
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


def _carried(path: Path, seen: IdSet, merged: Merged) -> _Kept:
    """The lines of the last merged `path` whose id no copy holds now (`seen`: the copies'
    answers), kept: a merge never loses an answer it held. Indexed here, not saved (the
    merged file is about to be replaced)."""
    kept = _Kept(path)
    try:
        kept.size = path.stat().st_size
    except FileNotFoundError:
        return kept
    idx = merge_index.Index()
    idx.extend(path)
    kept.indexed = idx.length
    starts, n = idx.starts, len(idx.starts)
    for i, h in enumerate(idx.hashes):
        if h in (merge_index.BLANK, merge_index.UNREADABLE) or h in seen:
            continue
        seen.add(h)
        end = starts[i + 1] if i + 1 < n else idx.length
        if kept.runs and kept.runs[-1][1] == starts[i]:
            kept.runs[-1] = (kept.runs[-1][0], end)
        else:
            kept.runs.append((starts[i], end))
        kept.lines += 1
    merged.carried = kept.lines
    return kept


def _carry_from(path: Path, before: Any, layout: ShardLayout | None,
                copies: list[ShardCopy]) -> bool:
    """Whether the last merged `path` may hold answers the copies do not: it exists, it was
    merged from the same input (merge.json), and it is no copy's own file (a copy kept
    whole is linked: its answers are that copy's)."""
    if not path.exists() or not isinstance(before, dict):
        return False
    if "input" in before and before.get("input") != (layout.input_sha256 if layout else None):
        return False  # the job was launched anew with another input: other answers
    for c in copies:
        with contextlib.suppress(OSError):
            if os.path.samefile(c.folder / OUTPUT, path):
                return False
    return True


def _ordered(copies: list[ShardCopy], layout: ShardLayout | None) -> list[ShardCopy]:
    """The copies in the workstation's order: the launch's hosts first, in launch order
    (a host a shard was taken over by after them), then any other host by name. Never by
    what a host says of itself."""
    rank = {host: i for i, host in enumerate(layout.order)} if layout is not None else {}
    return sorted(copies, key=lambda c: (rank.get(c.host, len(rank)), c.host))


def merge(job: str, copies: list[ShardCopy], dest: Path,
          layout: ShardLayout | None = None) -> Merged:
    """Merge `copies` (one per host) into `dest/<job>/`, judged by `layout` (the one this
    workstation recorded at launch; None: launched elsewhere); see the module's docstring."""
    copies = _ordered(copies, layout)
    folder = dest / job
    merged = Merged(job, folder, [c.host for c in copies])
    sources = {c.host: c.sizes() for c in copies}
    for c in copies:
        merged.notes += [f"{c.host}: {problem}" for problem in c.problems]
        if c.stale is not None:
            # Its last fetched copy stands in: partial while its shard may have more to come
            # (a shard it runs, not finished when fetched), else said only.
            when = c.fetched
            said = (f"{c.host} not fetched now ({c.stale}): its last fetched copy"
                    + (f", from {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))}"
                       if when else "") + ", is merged")
            done = c.status.get("state") == "finished" or (
                layout is not None and c.host not in layout.holders)
            (merged.notes if done else merged.partial).append(
                said + (" (it had finished)" if c.status.get("state") == "finished" else ""))
    _expectations(merged, copies, layout)
    owners = {c.host: layout.hash_owner(c.host) for c in copies} if layout is not None else {}
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / MANIFEST
    try:
        before = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = None
    # A merge judged by another layout (a relaunch) is done again, even with the same bytes.
    layout_seen = hashlib.sha256(layout.to_json().encode()).hexdigest()[:16] if layout else None
    if (isinstance(before, dict) and before.get("sources") == sources
            and before.get("layout") == layout_seen
            and (folder / OUTPUT).exists() and (folder / ERRORS).exists()):
        merged.answers, merged.failures = int(before.get("answers", 0)), int(before.get("failures", 0))
        merged.duplicates = int(before.get("duplicates", 0))
        foreign = before.get("foreign")
        merged.foreign = {str(k): int(v) for k, v in foreign.items()} if isinstance(foreign, dict) else {}
        merged.carried = int(before.get("carried") or 0)
        merged.unchanged = True
        return merged
    answered = IdSet()
    # Only lines new since the last merge are read, when it was judged by the same layout.
    last = (before.get("output") if isinstance(before, dict) and before.get("layout") == layout_seen
            else None)
    grown = _grow(folder / OUTPUT, copies, last, answered, merged, owners)
    if grown is None:
        merged.foreign = {}
        kept = [_scan(c.folder / OUTPUT, answered, merged, owns=owners.get(c.host), host=c.host)
                for c in copies]
        # What the last merge held and no copy holds now stays: the merge only grows.
        carried = ([_carried(folder / OUTPUT, answered, merged)]
                   if _carry_from(folder / OUTPUT, before, layout, copies) else [])
        merged.answers = sum(k.lines for k in [*kept, *carried])
        _write(folder / OUTPUT, [*kept, *carried])
        grown = kept
    output = _record(folder / OUTPUT, copies, grown, merged)
    failed = IdSet()
    kept = [_scan(c.folder / ERRORS, failed, merged, skip=answered, owns=owners.get(c.host),
                  host=c.host) for c in copies]
    merged.failures = sum(k.lines for k in kept)
    _write(folder / ERRORS, kept)
    atomic.write_json(manifest, {"job": job, "sources": sources, "answers": merged.answers,
                                 "failures": merged.failures, "duplicates": merged.duplicates,
                                 "foreign": merged.foreign, "layout": layout_seen,
                                 "input": layout.input_sha256 if layout else None,
                                 "carried": merged.carried, "output": output},
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
            "unreadable": merged.unreadable, "foreign": dict(merged.foreign),
            "carried": merged.carried}


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _grow(path: Path, copies: list[ShardCopy], record: Any, seen: IdSet, merged: Merged,
          owners: dict[str, Callable[[int], bool] | None]) -> list[_Kept] | None:
    """Append to the merged `path` only the lines its sources gained since the last merge,
    when that merge's `record` (`_record`) still describes them: the same hosts in the same
    order, the merged file untouched since it was written and its own file (no source's
    link), each source's merged bytes unchanged (their probe). The ids merged already come
    from the sources' indexes (into `seen`); the new lines are scanned and kept as a whole
    merge would keep them. None, with nothing changed: the record does not hold, and the
    caller merges everything again."""
    if not isinstance(record, dict) or record.get("hosts") != [c.host for c in copies] \
            or record.get("carried"):
        return None  # (answers kept from an earlier merge: no copy's index holds their ids)
    lengths, probes = record.get("lengths"), record.get("probes")
    answers, duplicates, unreadable = (record.get(k) for k in ("answers", "duplicates", "unreadable"))
    foreign = record.get("foreign", {})
    if not isinstance(lengths, dict) or not isinstance(probes, dict) or not (
            _whole(answers) and _whole(duplicates) and _whole(unreadable)) or not (
            isinstance(foreign, dict) and all(_whole(v) for v in foreign.values())):
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
    merged.foreign = {str(k): v for k, v in foreign.items()}
    kept = [_scan(source, seen, merged, idx=idx, first=first, owns=owners.get(c.host), host=c.host)
            if idx is not None else _Kept(source)
            for c, (source, idx, first) in zip(copies, plans, strict=True)]
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


def _expectations(merged: Merged, copies: list[ShardCopy], layout: ShardLayout | None) -> None:
    """How many ids the whole job holds, when that is known: every shard of the launch
    present and finished; else why the merge is partial."""
    fetched = {c.host for c in copies}
    if layout is None:
        merged.partial.append("not launched from this workstation (no launch record in its "
                              "state dir): whether every shard is here cannot be told")
    elif layout.sharded:
        missing = [f"{h} ({layout.spec(h)})" for h in layout.holders if h not in fetched]
        if missing:
            merged.partial.append(f"shard{'s' if len(missing) > 1 else ''} of "
                                  f"{', '.join(missing)} not fetched")
    else:
        if not fetched & set(layout.hosts):
            merged.partial.append(f"none of the hosts it was launched on ({', '.join(layout.hosts)}) "
                                  f"was fetched")
    # The hosts that run a shard now (a host a shard moved away from is done with it).
    states = {c.host: str(c.status.get("state") or "unknown") for c in copies
              if layout is None or c.host in layout.holders}
    unfinished = [f"{host} {state}" for host, state in states.items() if state != "finished"]
    if unfinished:
        merged.partial.append("not finished on " + ", ".join(unfinished))
    if merged.partial or layout is None:
        return
    if layout.prompts is not None:
        merged.expected = layout.prompts  # what the workstation read: never a host's word
        return
    totals = [t for t in (c.status.get("total") for c in copies if c.host in layout.holders)
              if isinstance(t, int)]
    if len(totals) == len(states):
        # --no-shard: every host did the whole input; sharded: the shards add up.
        merged.expected = max(totals) if not layout.sharded else sum(totals)
