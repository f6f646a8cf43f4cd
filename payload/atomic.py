"""One way to replace a local file atomically: temp name, write, (fsync), rename.

Readers (a status watcher, a resumed run, `fab fetch`) see either the old file or the
new one, never a torn one. The temp file sits in the same folder (rename is atomic only
within one filesystem), is named `.NAME.tmp-PID-THREAD` (so concurrent writers never
collide and a leftover is recognisable by `TMP_MARK`), is created with O_EXCL and its
final mode from the first byte (a private file is never readable by others, not even
empty), and is removed if anything fails. `durable=True` fsyncs the data before the
rename and the folder after it, so a power cut cannot leave an empty file under the
final name; files rewritten every few seconds (a status file) may skip that.

Stdlib only: the payload runs it on the containers, and handoff uses the same helper on
the workstation.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TMP_MARK = ".tmp-"


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{threading.get_ident()}")


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse to open a folder: best effort
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_file(path: Path, *, mode: int | None = None,
                durable: bool = True) -> Iterator[IO[bytes]]:
    """`with atomic_file(p) as fh: fh.write(...)`: `p` is replaced only if the block ends
    without an exception; otherwise the temp file is removed and `p` is untouched.

    `mode`: exactly that mode; None (the default): 0666 narrowed by the umask, as any file
    the process creates (a job started by handoff runs under umask 077: its status and
    outputs are the login user's alone)."""
    path = Path(path)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)  # the umask may have narrowed the create mode
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        _fsync_dir(path.parent)


def write_bytes(path: Path, data: bytes, *, mode: int | None = None, durable: bool = True) -> None:
    with atomic_file(path, mode=mode, durable=durable) as fh:
        fh.write(data)


def write_text(path: Path, text: str, *, mode: int | None = None, durable: bool = True) -> None:
    write_bytes(path, text.encode("utf-8"), mode=mode, durable=durable)


def write_json(path: Path, data: Any, *, mode: int | None = None, durable: bool = True,
               indent: int | None = 1) -> None:
    text = json.dumps(data, indent=indent, sort_keys=True, ensure_ascii=False) + "\n"
    write_text(path, text, mode=mode, durable=durable)
