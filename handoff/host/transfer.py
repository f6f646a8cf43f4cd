"""Moving bytes to and from a host, safely: folders, atomic uploads, resumable downloads.

Everything goes through a Session's files (SFTP for real hosts, at wire speed: see
handoff.ssh.sftp), never through a command line, and every transfer of a few MB or more
shows its progress (handoff.host.progress).

An upload goes to a temp name in the destination folder and is renamed into place, so a
reader (a job, a later deploy) sees the old file or the new one, never a torn one, and a
dropped connection leaves at most a temp file that the next upload clears.

A download is written under a stable partial name (`partial`) and renamed into place
when complete, so a reader never sees half a file under the final name and a cut
download leaves what it got for the next one to resume (handoff.ops.fetch checks that it
is a prefix of the host's file: a 2 MiB probe first, the whole prefix's sha256 beside the
transfer before the rename). That is why downloads do not use payload.atomic, whose
temp files are private to one write and removed on failure. An append-only file that
grew since it was fetched is appended to in place; a JSONL file the merge reads gets
only whole lines (`WholeLines`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets as pysecrets
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO

from handoff import threads
from handoff.host import progress
from handoff.host.remote_code import fetch_list
from handoff.host.session import RemoteFiles
from payload import atomic

UPLOAD_CHUNK = 1 << 20  # bytes handed to the writer at once (it splits them into requests)
WATCH_EVERY = 32 << 20  # bytes a download writes between two `on_written` calls


def temp_name(final: str) -> str:
    """A fresh temp name next to `final` (`.NAME.tmp-<random>`)."""
    folder, name = final.rsplit("/", 1)
    return f"{folder}/{temp_prefix(name)}{pysecrets.token_hex(6)}"


def temp_prefix(name: str) -> str:
    """The start of every temp name `temp_name` makes for a file called `name`."""
    return f".{name}.tmp-"


def mkdirs(files: RemoteFiles, path: str, mode: int = 0o700,
           known: Mapping[str, bool] | None = None) -> bool:
    """mkdir -p; True when it created `path` itself.

    `known` (absolute path -> is a directory, from the probe) saves the stat of each level
    it covers; other levels cost one stat. A level created meanwhile by a concurrent run
    is fine (its mkdir fails, a stat confirms it).
    """
    known = known or {}
    missing = []
    p = path
    while p not in ("", "/"):
        if known.get(p) is True:
            break
        if known.get(p) is None:
            try:
                files.stat(p)
                break
            except FileNotFoundError:
                pass
        missing.append(p)
        p = p.rsplit("/", 1)[0]
    for d in reversed(missing):
        try:
            files.mkdir(d, mode)
        except OSError:
            files.stat(d)  # created meanwhile by a concurrent run: fine; else this raises
    return bool(missing)


def upload_atomic(files: RemoteFiles, data: bytes, final: str, mode: int = 0o644, *,
                  durable: bool = False, label: str = "") -> None:
    """Write to a temp name in the same folder, created exclusively with `mode` from its
    first instant, then rename: readers never see a partial file, and a failure leaves no
    temp file behind. `durable` fsyncs before the rename (the key: a power cut must not
    leave an empty file under the final name); bulk uploads skip that and are pipelined.
    `label` names the host on the progress display."""
    view = memoryview(data)
    chunks = (view[i : i + UPLOAD_CHUNK] for i in range(0, len(view), UPLOAD_CHUNK))
    _upload(files, chunks, len(data), final, mode, durable=durable, label=label)


def upload_file(files: RemoteFiles, local: Path, final: str, mode: int = 0o644, *,
                label: str = "") -> None:
    """`upload_atomic` of a local file, read as it is sent (never whole in memory)."""
    size = local.stat().st_size
    with local.open("rb") as src:
        chunks = iter(lambda: src.read(UPLOAD_CHUNK), b"")
        _upload(files, chunks, size, final, mode, durable=False, label=label)


def _upload(files: RemoteFiles, chunks: Iterable[bytes | memoryview], size: int, final: str,
            mode: int, *, durable: bool, label: str) -> None:
    tmp = temp_name(final)
    try:
        with progress.meter(label, final.rsplit("/", 1)[-1], size, "upload") as meter:
            with files.create(tmp, mode, pipelined=not durable) as fh:
                for chunk in chunks:
                    fh.write(chunk)
                    meter.advance(len(chunk))
                if durable:
                    fh.fsync()
        files.rename(tmp, final)
    except BaseException:
        try:
            files.remove(tmp)
        except Exception:
            pass
        raise


def upload_resumable(files: RemoteFiles, local: Path, final: str, mode: int = 0o644, *,
                     label: str = "", remote_sha256: Callable[[str, int], str | None],
                     remote_probe: Callable[[str, int], str | None] | None = None,
                     notes: list[str] | None = None) -> int:
    """Upload `local` to `final` as fetch downloads: into a stable part name beside it
    (`.NAME.tmp-part`) renamed into place when whole, so a cut upload (Ctrl-C, a dropped
    link) resumes from the part's end, moving only the rest. Older random temp names of
    the same file are removed. Returns the bytes resumed.

    The part's N bytes are checked twice, as fetch checks a prefix: before anything moves,
    by their probe (`remote_probe(path, n)` on the host: the sha256 of their first and last
    MiB, fetch_list.probe_sha256), and in full while the rest moves (`remote_sha256(path,
    n)`: the sha256 of the first n bytes, computed on the host beside the upload, against
    the local file's, hashed meanwhile). Without `remote_probe`, the whole prefix is checked
    before anything moves instead. The part is renamed into place
    only if both match; a probe that does not starts the upload over at once, a whole hash
    that does not starts it over after the rest moved. Either is said in `notes`."""
    folder, name = final.rsplit("/", 1)
    part = f"{folder}/.{name}{PART_SUFFIX}"
    for leftover in files.listdir(folder):
        if leftover.startswith(temp_prefix(name)) and f"{folder}/{leftover}" != part:
            try:
                files.remove(f"{folder}/{leftover}")
            except OSError:
                pass
    size = local.stat().st_size
    try:
        have = files.stat(part).size
        if have == 0:
            files.remove(part)  # an empty part: nothing to resume, and create is exclusive
    except FileNotFoundError:
        have = 0
    if have and (have > size or (remote_probe is not None
                                 and remote_probe(part, have) != fetch_list.probe_sha256(str(local), have))):
        if notes is not None:
            notes.append(f"the {have} bytes already on the host are not this file's first "
                         f"{have} (probe sha256): uploaded whole")
        files.remove(part)
        have = 0
    if have and remote_probe is None and remote_sha256(part, have) != fetch_list.prefix_sha256(str(local), have):
        # No probe to ask the host for: the whole prefix is checked before anything moves.
        if notes is not None:
            notes.append(f"the {have} bytes already on the host are not this file's first "
                         f"{have} (whole sha256): uploaded whole")
        files.remove(part)
        have = 0
    proof = None
    if have and remote_probe is not None:
        n = have
        proof = (threads.soon(lambda: remote_sha256(part, n), "hash-host"),
                 threads.soon(lambda: fetch_list.prefix_sha256(str(local), n), "hash-local"))
    _send(files, local, part, have, size, mode, label, name)
    if proof is not None:
        theirs, ours = proof[0].result(), proof[1].result()
        if theirs is None or theirs != ours:
            if notes is not None:
                notes.append(f"the {have} bytes already on the host are not this file's first "
                             f"{have} (whole sha256, checked after the rest moved): uploaded whole")
            files.remove(part)
            have = 0
            _send(files, local, part, 0, size, mode, label, name)
    # The part is kept on failure (that is what resumes); only a whole file is renamed.
    files.chmod(part, mode)
    files.rename(part, final)
    return have


def _send(files: RemoteFiles, local: Path, part: str, have: int, size: int, mode: int,
          label: str, name: str) -> None:
    """`local` from byte `have` on, appended to `part` (created when `have` is 0)."""
    with local.open("rb") as src:
        src.seek(have)
        with progress.meter(label, name, size, "upload") as meter:
            meter.advance(have)
            with (files.append(part, pipelined=True) if have
                  else files.create(part, mode, pipelined=True)) as fh:
                for chunk in iter(lambda: src.read(UPLOAD_CHUNK), b""):
                    fh.write(chunk)
                    meter.advance(len(chunk))


def remove_leftovers(files: RemoteFiles, folder: str, prefix: str) -> bool:
    """Remove temp names left by an earlier run whose connection dropped mid-step; True if
    any was found."""
    found = False
    for name in files.listdir(folder):
        if name.startswith(prefix):
            found = True
            try:
                files.remove(f"{folder}/{name}")
            except OSError:
                pass
    return found


PART_SUFFIX = f"{atomic.TMP_MARK}part"


def partial(local: Path) -> Path:
    """Where `download` writes `local` until it is complete: a stable name (so a cut
    download resumes from it) that every reader skips as a temp file (`atomic.TMP_MARK`)."""
    return local.with_name(f".{local.name}{PART_SUFFIX}")


def completes(part: Path) -> Path | None:
    """The file that `part` is the partial download of (None: not a `partial` name)."""
    name = part.name
    if name.startswith(".") and name.endswith(PART_SUFFIX) and len(name) > 1 + len(PART_SUFFIX):
        return part.with_name(name[1 : -len(PART_SUFFIX)])
    return None


class PrefixMismatch(Exception):
    """The bytes a download or upload resumed after are not the other side's (found by
    the whole-prefix hash once the rest had moved): start the file over."""


def download(files: RemoteFiles, remote: str, local: Path, offset: int, size: int,
             mtime: float, *, in_place: bool = False, label: str = "",
             name: str | None = None, verify: Callable[[], bool] | None = None,
             on_written: Callable[[Path], None] | None = None, whole_lines: bool = False) -> None:
    """Bring `remote` (`size` bytes) to `local`, the bytes before `offset` being already
    there and their probe matching the host's (handoff.ops.fetch).

    `verify` (a resumed download) is asked once the rest is written whether the whole
    prefix matches too (its hashes were computed meanwhile); no: PrefixMismatch, and the
    partial file is not renamed into place (an in-place append has been written, and the
    caller fetches the file whole over it).

    `on_written(target)` is called every WATCH_EVERY bytes written, once they are all
    written, and after what a cut download wrote (flushed first): fetch indexes a merged
    file's lines as they land (handoff.ops.merge_index), so a resume indexes only the rest.

    `in_place`: they are `local`'s own first bytes (an append-only file that grew): the
    rest is appended to it. Otherwise they are in `partial(local)`, which is written to
    the end and then renamed to `local`: a reader never sees half a file under the final
    name, and a cut download leaves a partial file the next one resumes. The local file
    gets the remote mtime (so a later fetch can tell it is complete). `label` and `name`
    (default: the file name) are what the progress display shows.

    `whole_lines` (a JSONL file the merge reads): the bytes after the file's last newline,
    a line the job is still writing, are not written (`WholeLines`): the copy ends with a
    whole line, which the next fetch continues, so a copy the merge links as the merged
    dataset (handoff.ops.merge) only ever grows by whole lines."""
    local.parent.mkdir(parents=True, exist_ok=True)
    target = local if in_place else partial(local)
    with progress.meter(label, name or remote.rsplit("/", 1)[-1], size - offset, "fetch") as meter:
        # O_NOFOLLOW: a symlink planted at the name is never written through.
        fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "r+b") as out:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise OSError(f"{target} is being written by another fetch") from None
            if os.fstat(fd).st_size < offset:
                raise OSError(f"{target} holds fewer than the {offset} bytes proven (changed "
                              f"meanwhile?); fetch again")
            # Not fsync'ed: a fetch that dies resumes from what reached the disk, proven by
            # hash again before a byte is appended.
            out.truncate(offset)  # what was proven, nothing after it
            out.seek(offset)
            mark = offset + WATCH_EVERY
            write = WholeLines(out).write if whole_lines else out.write
            try:
                for chunk in files.read_chunks(remote, offset, size):
                    write(chunk)
                    meter.advance(len(chunk))
                    if on_written is not None and out.tell() >= mark:
                        out.flush()
                        on_written(target)
                        mark = out.tell() + WATCH_EVERY
            except BaseException:
                if on_written is not None:  # what was written is resumed from: index it too
                    with contextlib.suppress(Exception):
                        out.flush()
                        on_written(target)
                raise
            out.flush()
            if on_written is not None:
                on_written(target)
            if verify is not None and not verify():
                raise PrefixMismatch(f"{target}: its first {offset} bytes are not the host's")
            os.utime(fd, (mtime, mtime))
            if target != local:
                os.replace(target, local)  # still locked: no other fetch touches it midway


class WholeLines:
    """Writes only whole lines: what follows the last newline seen is held back, written
    with the next chunk that ends a line, and never when none does (a line still being
    written on the host). A held-back line longer than HOLD_MAX is written anyway: a host
    that never ends its line costs no unbounded memory (the merge then copies instead of
    linking: handoff.ops.merge)."""

    HOLD_MAX = 64 << 20

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.held = bytearray()

    def write(self, chunk: bytes | memoryview) -> None:
        end = _line_end(chunk)
        if end == 0 and len(self.held) + len(chunk) <= self.HOLD_MAX:
            self.held += chunk
            return
        if not end:
            end = len(chunk)
        if self.held:
            self.out.write(self.held)
            self.held.clear()
        self.out.write(chunk[:end] if end < len(chunk) else chunk)
        self.held += chunk[end:]


def _line_end(chunk: bytes | memoryview) -> int:
    """Where the last line of `chunk` ends (after its last newline), 0 if none does; a
    memoryview is searched in its last 64 KiB first (a line is rarely longer), not copied
    whole."""
    if isinstance(chunk, bytes):
        return chunk.rfind(b"\n") + 1
    tail = max(0, len(chunk) - (64 << 10))
    found = bytes(chunk[tail:]).rfind(b"\n")
    if found < 0 and tail:
        found, tail = bytes(chunk[:tail]).rfind(b"\n"), 0
    return tail + found + 1 if found >= 0 else 0


def copy_range(src: IO[bytes], out: IO[bytes], start: int, end: int) -> None:
    """Bytes [start, end) of `src` appended to `out`: by the kernel (copy_file_range, 4x
    faster than through Python) where it can, else read and written in 8 MB pieces."""
    out.flush()
    if hasattr(os, "copy_file_range"):
        try:
            while start < end:
                done = os.copy_file_range(src.fileno(), out.fileno(), end - start, start)
                if done == 0:
                    break
                start += done
        except OSError:  # a filesystem or kernel without it
            pass
    src.seek(start)
    while start < end:
        chunk = src.read(min(end - start, 8 << 20))
        if not chunk:
            raise OSError(f"{src.name} ended at byte {start} of the {end} expected")
        out.write(chunk)
        start += len(chunk)


def is_partial(name: str) -> bool:
    """A local file that `download` is still writing (or a killed download left)."""
    return atomic.TMP_MARK in name
