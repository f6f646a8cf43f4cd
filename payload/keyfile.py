"""Reading the API key on the container: from a private file, or `$OPENROUTER_API_KEY`.

The key is registered with the redactor the moment it is read, before anything could
print it. A key file readable by group or others is refused rather than silently used:
it means the key already leaked to other users of the machine, and the fix is one
`chmod` away.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from payload.errors import KeyFileError
from payload.redact import REDACTOR

__all__ = ["ENV_VAR", "KeyFileError", "load_key"]

ENV_VAR = "OPENROUTER_API_KEY"


def load_key(path: str | None, *, consume: bool = False) -> str:
    """The key from `path` (0600 or stricter) or, without a path, from `$OPENROUTER_API_KEY`."""
    if path:
        key = _read_private(Path(path).expanduser())
        if consume:
            try:
                os.unlink(Path(path).expanduser())
            except OSError as exc:
                raise KeyFileError(f"--consume-key: could not remove {path}: {exc.strerror}") from None
    else:
        key = os.environ.get(ENV_VAR, "").strip()
        if not key:
            raise KeyFileError(f"no API key: pass --api-key-file FILE (mode 0600) or set ${ENV_VAR}")
    REDACTOR.add(key)
    return key


def _read_private(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise KeyFileError(f"API key file {path} does not exist") from None
    except OSError as exc:
        raise KeyFileError(f"cannot open API key file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"API key file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise KeyFileError(
                f"API key file {path} is readable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); refusing to use it. Fix: chmod 600 {path}")
        with os.fdopen(fd, "r", encoding="utf-8") as fh:
            fd = -1
            # Register before any later check can put the text into an error message.
            key = fh.read().strip()
    finally:
        if fd >= 0:
            os.close(fd)
    if not key:
        raise KeyFileError(f"API key file {path} is empty")
    REDACTOR.add(key)
    return key
