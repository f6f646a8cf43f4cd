"""Moving bytes to and from a host, safely: folders, atomic uploads, resumable downloads.

Everything goes through a Session's files (SFTP for real hosts), never through a command
line. An upload goes to a temp name in the destination folder and is renamed into place,
so a reader (a job, a later deploy) sees the old file or the new one, never a torn one,
and a dropped connection leaves at most a temp file that the next upload clears. A
download writes a local temp file renamed into place when complete, or appends to a
local copy already proven (by hash, on the host) to be a prefix of the remote file;
local files are replaced through payload.atomic, the one atomic writer.
"""

from __future__ import annotations

import os
import secrets as pysecrets
from collections.abc import Mapping
from pathlib import Path

from handoff.session import RemoteFiles
from payload import atomic

UPLOAD_CHUNK = 32768  # SFTP write size; with pipelining, the server acks in the background


def temp_name(final: str) -> str:
    """A fresh temp name next to `final` (`.NAME.tmp-<random>`)."""
    folder, name = final.rsplit("/", 1)
    return f"{folder}/{temp_prefix(name)}{pysecrets.token_hex(6)}"


def temp_prefix(name: str) -> str:
    """The start of every temp name `temp_name` makes for a file called `name`."""
    return f".{name}.tmp-"


def mkdirs(files: RemoteFiles, path: str, mode: int = 0o755,
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
                  durable: bool = False) -> None:
    """Write to a temp name in the same folder, created exclusively with `mode` from its
    first instant, then rename: readers never see a partial file, and a failure leaves no
    temp file behind. `durable` fsyncs before the rename (the key: a power cut must not
    leave an empty file under the final name); bulk uploads skip that and are pipelined."""
    tmp = temp_name(final)
    try:
        with files.create(tmp, mode, pipelined=not durable) as fh:
            for i in range(0, len(data), UPLOAD_CHUNK):
                fh.write(data[i : i + UPLOAD_CHUNK])
            if durable:
                fh.fsync()
        files.rename(tmp, final)
    except BaseException:
        try:
            files.remove(tmp)
        except Exception:
            pass
        raise


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


def download(files: RemoteFiles, remote: str, local: Path, offset: int, size: int,
             mtime: float) -> None:
    """Bring `remote` (`size` bytes) to `local`: from `offset` onto the local copy (whose
    first `offset` bytes are known to match), or whole through a temp file renamed into
    place. The local file gets the remote mtime (so a later fetch can tell it is complete)."""
    local.parent.mkdir(parents=True, exist_ok=True)
    if offset:
        with local.open("ab") as out:
            for chunk in files.read_chunks(remote, offset, size):
                out.write(chunk)
    else:
        # Not fsync'ed: a fetch that dies is simply fetched again, and the rename still
        # means a reader never sees half a file under the final name.
        with atomic.atomic_file(local, durable=False) as out:
            for chunk in files.read_chunks(remote, 0, size):
                out.write(chunk)
    os.utime(local, (mtime, mtime))


def is_partial(name: str) -> bool:
    """A local file that `download` is still writing (or a killed download left)."""
    return atomic.TMP_MARK in name
