"""Which lines a fetched copy holds, remembered beside it, so a merge reads only what is new.

For a per-host copy's `output.jsonl` and `output.errors.jsonl` (`DIR/<host>/<job>/NAME`),
`DIR/<job>/.<host>.NAME.tmp-index` (in the merged folder: `index_path`) records, for the file's first `length` bytes (whole lines): where each line starts, its
id's 8-byte hash (or BLANK / UNREADABLE), and the probe sha256 of those bytes
(fetch_list.probe_sha256: their first and last MiB). `fab fetch` extends it while a
download writes (`Growing`), so a cut download leaves the index of what it wrote and the
resumed one indexes only the rest; the merge (handoff.ops.merge) extends it to the file's
end and reads the ids from it instead of the file. A 1 GB output of 143k lines costs a
2.3 MB index. The name holds `atomic.TMP_MARK`, so every reader of the folder skips it.

The index also records which host file the bytes were downloaded from (its `file_id`:
device and inode on the host) and the copy's size, mtime and inode once they were written
(`stamp`), so a resumed fetch can tell a prefix it wrote itself from that host file and
left untouched (`untouched`): such a prefix needs no whole-prefix hash on either side.

An index whose probe does not match the file's bytes now (the file was replaced, cut
and rewritten) is dropped and the file indexed again from its start. Its limit: a copy
edited by hand in its middle, keeping its ends, keeps its old index, and the merge would
keep that copy's lines by their old ids. fetch never leaves that state itself: a resumed
download proves its whole prefix against the host before it is renamed into place, and
the index of a prefix that fails the proof is dropped (`drop`).
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import json
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from handoff.host.remote_code import fetch_list
from payload import atomic
from payload.generate.journal import id_hash, leading_id, record_key

BLANK, UNREADABLE = 0, 1  # hashes that are no id: a blank line (left out, not counted), an unreadable one
INDEXED = fetch_list.WHOLE_LINES  # the files a merge reads (fetched by whole lines)
_HEAD = 512  # a long line's id is read from its first bytes (the payload writes `id` first)
# A line whose id is not in its first bytes is parsed whole, up to this size: a longer one
# (no payload writes one: a host's bytes) is unreadable, never a multi-GB parse.
MAX_PARSED_LINE = 16 << 20
_STRING_ID = b'{"id":"'
_MAGIC = b"handoff-merge-index 1\n"


def index_path(path: Path) -> Path:
    """Where the index of `path` (`DIR/<host>/<job>/NAME`, a per-host copy) is kept: in the
    job's merged folder, `DIR/<job>/.<host>.NAME.tmp-index`, so the per-host copy holds
    the host's files and nothing else."""
    job, host = path.parent, path.parent.parent
    return host.parent / job.name / f".{host.name}.{path.name}{atomic.TMP_MARK}index"


@dataclass
class Index:
    """The lines of a file's first `length` bytes: starts[i] and hashes[i] per line."""

    length: int = 0
    starts: array.array[int] = field(default_factory=lambda: array.array("Q"))
    hashes: array.array[int] = field(default_factory=lambda: array.array("Q"))
    host_file: str | None = None  # the host file the bytes were downloaded from (its file_id)

    def extend(self, path: Path) -> None:
        """Index the whole lines `path` holds after `length` (a last line without its
        newline is left for later: it is still being written). The file is mapped, not
        read: lines are found in place and only their heads are decoded."""
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size <= self.length:
                return
            with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as mm:
                pos, find = self.length, mm.find
                starts, hashes = self.starts, self.hashes
                while True:
                    nl = find(b"\n", pos)
                    if nl < 0:
                        break
                    starts.append(pos)
                    hashes.append(line_hash(mm, pos, nl))
                    pos = nl + 1
                self.length = pos

    def save(self, path: Path, source: Path | None = None) -> None:
        """Written beside `path` (atomically; not fsync'ed: a lost index costs a rescan);
        `source`: the file indexed, when it is not `path` yet (a download's partial file)."""
        indexed = str(source or path)
        head = json.dumps({"length": self.length, "lines": len(self.starts),
                           "probe": fetch_list.probe_sha256(indexed, self.length),
                           "host_file": self.host_file, "written": stamp(indexed)})
        where = index_path(path)
        if where.parent.is_symlink():
            return  # the merged folder is reached through no symlink (fetch refuses one)
        where.parent.mkdir(parents=True, exist_ok=True)
        with atomic.atomic_file(where, durable=False) as out:
            out.write(_MAGIC + head.encode() + b"\n")
            out.write(self.starts.tobytes())
            out.write(self.hashes.tobytes())


def load(path: Path, *, against: Path | None = None) -> Index | None:
    """The index saved beside `path`, if it still describes the first bytes of `against`
    (default: `path`) by their probe; None otherwise (none, unreadable, stale)."""
    try:
        with index_path(path).open("rb") as fh:
            head = _head(fh)
            body = memoryview(fh.read())
        length, lines = int(head["length"]), int(head["lines"])
        if len(body) != 16 * lines or length < 0:
            return None
        if fetch_list.probe_sha256(str(against or path), length) != head["probe"]:
            return None
        host_file = head.get("host_file")
        idx = Index(length, host_file=host_file if isinstance(host_file, str) else None)
        idx.starts.frombytes(body[:8 * lines])
        idx.hashes.frombytes(body[8 * lines:])
        return idx
    except (OSError, ValueError, KeyError, TypeError):
        return None


def current(path: Path) -> Index:
    """`path`'s index brought to its end (saved again when it grew or was rebuilt)."""
    idx = load(path) or Index()
    before = idx.length
    idx.extend(path)
    if idx.length != before:
        idx.host_file = None  # lines no download wrote: the next resume proves its prefix whole
    if idx.length != before or not index_path(path).exists():
        with contextlib.suppress(OSError):  # an index that cannot be saved costs a rescan
            idx.save(path)
    return idx


def stamp(path: str) -> list[int]:
    """What changes whenever a file's bytes do: its size, mtime, device and inode (not its
    ctime, which the merge's hard link to a copy kept whole changes too)."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino]


def untouched(final: Path, written: Path, host_file: str | None, length: int) -> bool:
    """Are `written`'s `length` bytes (the prefix a fetch resumes from: `final` itself or its
    partial file) exactly what a download from the host file `host_file` wrote there, and
    untouched since? Yes when `final`'s index says that download wrote them (its host
    file id) and `written`'s size, mtime and inode are still what they were once it had;
    then its bytes need no whole-prefix proof (handoff.ops.fetch.Proof). A file replaced,
    written to or cut since, an index from before this check existed, or one from another
    host file: no."""
    if not host_file:
        return False
    try:
        with index_path(final).open("rb") as fh:
            head = _head(fh)  # the head only: the lines' arrays are not needed here
        return (head.get("host_file") == host_file and head.get("written") == stamp(str(written))
                and head["written"][0] == length)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False


def _head(fh: IO[bytes]) -> dict[str, Any]:
    """An index file's head: the JSON line after the magic (ValueError: no index)."""
    if fh.read(len(_MAGIC)) != _MAGIC:
        raise ValueError("not a merge index")
    head = json.loads(fh.readline())
    if not isinstance(head, dict):
        raise ValueError("not a merge index")
    return head


def drop(path: Path) -> None:
    with contextlib.suppress(OSError):
        index_path(path).unlink()


class Growing:
    """The index of a file a download is writing, extended as it writes (`__call__`, by
    handoff.host.transfer.download every few MB and when it ends or is cut), saved beside
    the final name. Resumed from `offset`: the index left of those bytes, if it still
    matches them, else they are indexed too."""

    def __init__(self, final: Path, offset: int, host_file: str | None = None) -> None:
        self.final = final
        self.offset = offset
        self.host_file = host_file
        self.idx: Index | None = None
        self.target = final

    def __call__(self, target: Path) -> None:
        self.target = target
        if self.idx is None:
            old = load(self.final, against=target) if self.offset else None
            self.idx = old if old is not None and old.length <= self.offset else Index()
            self.idx.host_file = self.host_file
        self.idx.extend(target)

    def save(self, *, landed: bool = False) -> None:
        """`landed`: the download is complete and renamed to the final name, so its partial
        file (what the probe was read from so far) is gone."""
        if self.idx is not None:
            with contextlib.suppress(OSError):  # an index that cannot be saved costs a rescan
                self.idx.save(self.final, self.final if landed else self.target)


def line_hash(mm: mmap.mmap, pos: int, end: int) -> int:
    """The id hash of the line mm[pos:end] (journal.id_hash of its id), BLANK or UNREADABLE."""
    start = pos + len(_STRING_ID)
    if mm[pos:start] == _STRING_ID:  # the payload's own lines: the id read in place
        q = mm.find(b'"', start, min(end, pos + _HEAD))
        if q >= 0:
            raw = mm[start:q]
            if b"\\" not in raw:
                return _real(int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little"))
    key = leading_id(mm[pos:min(end, pos + _HEAD)]) if end - pos > _HEAD else None
    if key is None:
        if end - pos > MAX_PARSED_LINE:
            return UNREADABLE
        line = mm[pos:end]
        if not line.strip():
            return BLANK
        key = record_key(line)
    if key is None:
        return UNREADABLE
    return _real(id_hash(key))


def _real(h: int) -> int:
    """A real id's hash never reads as BLANK or UNREADABLE (a 2^-63 chance, remapped)."""
    return h if h > UNREADABLE else h + 2
