"""Exactly-once bookkeeping: the resume index and the single writer.

Each completed id is one line in the output (answers) or the errors file (permanent
failures), written by ONE writer that appends a whole line and flushes it. A kill -9 can
only leave the last line torn (no trailing newline); it is truncated away before anything
is appended, so that id is simply asked again.

The resume index must be fast on a 1 GB output: records are written with `"id"` as the
FIRST key, `"usage"` second, then the short fields the status breaks answers down by
(`finish_reason`, `provider`, and with `--turns all` the per-turn `turns`), then
`"response"`; so the id, the cost and the breakdown are read in place (mmap) from a short
prefix of each line without parsing the whole record (a full parse is the fallback for
lines written by anything else). The breakdown prefix of most lines is one of a handful
of strings: it is counted as bytes and decoded once per distinct value. Ids are kept as
64-bit blake2b digests of `str(id)` in an IdSet (~8 bytes each), which keeps memory flat
on large inputs.
"""

from __future__ import annotations

import array
import bisect
import collections
import errno
import hashlib
import heapq
import json
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from payload import atomic
from payload.report import Reporter

_DECODER = json.JSONDecoder()
_PREFIX = b'{"id":'
_CHUNK = 8 * 1024 * 1024


def id_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


class IdSet:
    """A set of 64-bit id hashes at ~8 bytes each (a Python set of ints costs ~80).

    New hashes go to a small set; every MERGE_AT of them are merged into one sorted
    array('Q') searched by bisection. This keeps peak RSS flat when the input grows 10x.
    """

    MERGE_AT = 1 << 16

    def __init__(self) -> None:
        self._recent: set[int] = set()
        self._sorted = array.array("Q")

    def add(self, h: int) -> None:
        self._recent.add(h)
        if len(self._recent) >= self.MERGE_AT:
            merged = array.array("Q", heapq.merge(self._sorted, sorted(self._recent)))
            self._sorted = merged
            self._recent = set()

    def adopt(self, hashes: set[int]) -> None:
        """Take over a set of hashes none of which is here yet (a merge's first copy: no
        add per id); an empty IdSet keeps the set itself until its next `add`."""
        if not self._sorted and not self._recent:
            self._recent = hashes
            return
        for h in hashes:
            self.add(h)

    def __contains__(self, h: object) -> bool:
        if h in self._recent:
            return True
        arr = self._sorted
        if not arr or not isinstance(h, int):
            return False
        i = bisect.bisect_left(arr, h)
        return i < len(arr) and arr[i] == h

    def __len__(self) -> int:
        # Merged entries are unique (add() never re-adds a merged hash twice in practice: the
        # callers check membership first), so the count is the sum.
        return len(self._recent) + len(self._sorted)


@dataclass
class Index:
    done: IdSet = field(default_factory=IdSet)  # id hashes in the output file
    failed: IdSet = field(default_factory=IdSet)  # id hashes in the errors file
    cost: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Answers whose usage has no `cost` (a server that does not report it): their tokens,
    # so a resumed budget can price them.
    uncosted_prompt_tokens: int = 0
    uncosted_completion_tokens: int = 0
    uncosted_records: int = 0
    skipped_lines: int = 0  # unreadable lines (reported, not fatal)
    truncated_bytes: int = 0
    # Answers by provider and by finish reason (one per turn with --turns all).
    by_provider: collections.Counter[str] = field(default_factory=collections.Counter)
    by_finish_reason: collections.Counter[str] = field(default_factory=collections.Counter)

    def count_answer(self, provider: Any, finish_reason: Any, n: int = 1) -> None:
        self.by_provider[str(provider) if provider is not None else "unknown"] += n
        self.by_finish_reason[str(finish_reason) if finish_reason is not None else "unknown"] += n

    def count_record(self, fields: dict[str, Any], n: int = 1) -> None:
        """An output record's answers, from its fields (`turns` when it has them)."""
        turns = fields.get("turns")
        if isinstance(turns, list) and turns:
            for t in turns:
                if isinstance(t, dict):
                    self.count_answer(t.get("provider"), t.get("finish_reason"), n)
            return
        self.count_answer(fields.get("provider"), fields.get("finish_reason"), n)


def truncate_torn_tail(path: Path) -> int:
    """Cut a last line that has no newline (a write interrupted by kill -9). Returns bytes cut."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with path.open("rb+") as fh:
        pos = size
        block = 64 * 1024
        while pos > 0:
            start = max(0, pos - block)
            fh.seek(start)
            chunk = fh.read(pos - start)
            if pos == size and chunk.endswith(b"\n"):
                return 0
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                fh.truncate(keep)
                return size - keep
            pos = start
        fh.truncate(0)
        return size


def iter_raw_lines(path: Path) -> Iterator[bytes]:
    """Lines of a big file, read in 8 MB chunks (faster than readline on 1 GB)."""
    with path.open("rb") as fh:
        rest = b""
        while True:
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            yield from lines
        if rest:
            yield rest


def _fast_id(line: bytes) -> tuple[str, str] | None:
    """(key, decoded prefix) from a line that starts with `{"id":`; None if it does not."""
    if not line.startswith(_PREFIX):
        return None
    head = line[:4096].decode("utf-8", "ignore")
    try:
        value, end = _DECODER.raw_decode(head, 6)
    except ValueError:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return str(value), head[end:]


Fields = dict[str, Any] | str  # a record's breakdown fields, or their raw JSON prefix


def _fast_record(mm: mmap.mmap, pos: int, end: int, is_output: bool
                 ) -> tuple[str, dict[str, Any] | None, Fields | None] | None:
    """(key, usage, breakdown prefix) read in place from a line
    `{"id":…,"usage":{…},"finish_reason":…,"provider":…,"response":…`; None when the line
    has another layout (the caller then parses it whole). No copy of the whole line."""
    if mm[pos:pos + 6] != _PREFIX:
        return None
    p = pos + 6
    if mm[p] == 0x22:  # a string id
        q = mm.find(b'"', p + 1, end)
        if q < 0:
            return None
        raw = mm[p + 1:q]
        if b"\\" in raw:
            return None  # escapes: let json decide where the string ends
        key = raw.decode("utf-8")
        after = q + 1
    else:  # an integer id
        q = mm.find(b",", p, end)
        if q < 0:
            return None
        try:
            key = str(int(mm[p:q]))
        except ValueError:
            return None
        after = q
    if not is_output:
        return key, None, None
    if mm[after:after + 9] != b',"usage":':
        return None
    u = after + 9
    r = mm.find(b',"response":', u, min(end, u + 65536))
    if r < 0:
        return None
    try:
        text = mm[u:r].decode("utf-8")
        usage, k = _DECODER.raw_decode(text)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(usage, dict):
        return None
    # The breakdown fields between usage and response: `,"finish_reason":…,"provider":…`
    # ("" in records written before they were there).
    return key, usage, text[k:]


def _scan(path: Path, target: IdSet, is_output: bool, index: Index,
          reporter: Reporter | None) -> None:
    size = path.stat().st_size
    if size == 0:
        return
    middles: collections.Counter[str] = collections.Counter()  # breakdown prefixes, raw
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        pos = line_no = 0
        while pos < size:
            end = mm.find(b"\n", pos)
            if end < 0:
                end = size
            line_no += 1
            if end > pos:
                got = _fast_record(mm, pos, end, is_output)
                if got is None:
                    got = _slow_record(mm[pos:end])
                if got is None:
                    if mm[pos:end].strip():
                        index.skipped_lines += 1
                        if reporter is not None:
                            reporter.warn(f"{path}:{line_no}: unreadable record skipped")
                else:
                    key, usage, fields = got
                    h = id_hash(key)
                    # A duplicate line (an edited file?) is counted once.
                    fresh = h not in target
                    target.add(h)
                    if fresh and is_output:
                        if isinstance(fields, str) and '"turns":' in fields:
                            index.count_record(_prefix_fields(fields))  # unique: decode now
                        elif isinstance(fields, str):
                            middles[fields] += 1
                        elif fields is not None:
                            index.count_record(fields)
                    if fresh and is_output and usage:
                        cost = usage.get("cost")
                        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
                        pt = pt if isinstance(pt, int) else 0
                        ct = ct if isinstance(ct, int) else 0
                        index.prompt_tokens += pt
                        index.completion_tokens += ct
                        if isinstance(cost, (int, float)):
                            index.cost += cost
                        else:
                            index.uncosted_records += 1
                            index.uncosted_prompt_tokens += pt
                            index.uncosted_completion_tokens += ct
            pos = end + 1
    for middle, n in middles.items():
        index.count_record(_prefix_fields(middle), n)


def _prefix_fields(middle: str) -> dict[str, Any]:
    """`,"finish_reason":"stop","provider":"P"` (the text between usage and response) as a
    dict; {} for an empty or unreadable one."""
    if not middle.startswith(","):
        return {}
    try:
        fields = json.loads("{" + middle[1:] + "}")
    except ValueError:
        return {}
    return fields if isinstance(fields, dict) else {}


def _slow_record(line: bytes) -> tuple[str, dict[str, Any] | None, Fields | None] | None:
    try:
        record = json.loads(line)
        key = str(record["id"])
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: a JSON bomb
        return None
    usage = record.get("usage")
    return key, usage if isinstance(usage, dict) else None, record


def leading_id(head: bytes) -> str | None:
    """The id of a line whose first bytes are `head`, when `id` comes first (as the payload
    writes it) and ends within them; else None."""
    fast = _fast_id(head)
    return fast[0] if fast is not None else None


def record_key(line: bytes) -> str | None:
    """The id (as `str(id)`) of one output or errors line, read in place when `id` comes
    first (as the payload writes it), else from a full parse; None for an unreadable line.
    (handoff's merge of fetched shards reads ids this way too.)"""
    fast = _fast_id(line)
    if fast is not None:
        return fast[0]
    slow = _slow_record(line)
    return slow[0] if slow is not None else None


def load_index(output: Path, errors: Path, *, warn: bool = True,
               reporter: Reporter | None = None) -> Index:
    """Read both files (truncating torn tails first) into an Index. Unreadable lines are
    skipped, and said (to `reporter`, else stderr) unless `warn` is off."""
    if warn and reporter is None:
        reporter = Reporter()
    elif not warn:
        reporter = None
    index = Index()
    for path, target, is_output in ((output, index.done, True), (errors, index.failed, False)):
        index.truncated_bytes += truncate_torn_tail(path)
        if path.exists():
            _scan(path, target, is_output, index, reporter)
    return index


def drop_failures(errors: Path, should_drop: Any) -> int:
    """`--retry-failed`: atomically rewrite the errors file without the records to retry.

    `should_drop(key)` says which ids this run retries (those its shard owns). The ids
    dropped are in neither file until retried, so each still ends in exactly one file.
    """
    if not errors.exists():
        return 0
    dropped = 0
    with atomic.atomic_file(errors) as out:
        for line in iter_raw_lines(errors):
            if not line.strip():
                continue
            fast = _fast_id(line)
            key: str | None = fast[0] if fast else None
            if key is None:
                try:
                    key = str(json.loads(line)["id"])
                except (ValueError, KeyError, TypeError):
                    key = None
            if key is not None and should_drop(key):
                dropped += 1
                continue
            out.write(line + b"\n")
    return dropped


def encode_record(record: dict[str, Any]) -> bytes:
    """One JSONL line; callers build `record` with "id" first (and "usage" second for answers)."""
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class WriteFailed(OSError):
    """A record could not be written (disk full, I/O error): the run must stop, resumably.
    Whatever part of the line reached the file is a torn tail the next run truncates."""

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(exc.errno, exc.strerror)
        self.path = path
        self.disk_full = exc.errno in DISK_FULL_ERRNOS


class Writer:
    """The single writer: appends each whole line with unbuffered `write` calls (O_APPEND),
    so a kill -9 loses at most the line being written (which the next run truncates), and a
    full disk surfaces on the very record that did not fit, never later from a buffer."""

    def __init__(self, output: Path, errors: Path, turns: Path | None = None) -> None:
        self._paths = (output, errors, turns)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        self._out = os.open(output, flags, 0o644)
        self._err = os.open(errors, flags, 0o644)
        # The turn journal of --turns all (opened only then: no empty file beside others).
        self._turns = -1 if turns is None else os.open(turns, flags, 0o644)
        self.failed: WriteFailed | None = None

    def _write(self, fd: int, path: Path, line: bytes) -> None:
        if self.failed is not None:
            raise self.failed
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            self.failed = WriteFailed(path, exc)
            raise self.failed from None

    def write_output(self, line: bytes) -> None:
        self._write(self._out, self._paths[0], line)

    def write_error(self, line: bytes) -> None:
        self._write(self._err, self._paths[1], line)

    def write_turn(self, line: bytes) -> None:
        path = self._paths[2]
        assert path is not None, "a turn journal is opened only for --turns all"
        self._write(self._turns, path, line)

    def close(self) -> None:
        for fd in (self._out, self._err, self._turns):
            if fd < 0:
                continue
            try:
                os.fsync(fd)
            except OSError:
                pass
            os.close(fd)
