"""One host to act on: the seam between handoff's per-host logic and SSH.

`Session` is the small surface every operation uses: run a shell command, run one of the
remote modules (handoff.host.remote_code) in one round trip, stream a command's output, and
SFTP-like file operations (`Session.files`). `handoff.host.ssh_session.SSHSession` is the
real thing (paramiko, host keys checked); `handoff.testing.local.LocalSession` acts on a
temp dir standing for the host's home, so per-host logic is unit-tested without sshd. The
integration tests run the same operations over real sshd. This module imports no paramiko.

Remote code runs with the host's effective python: `<remote_dir>/venv/bin/python` when
`verify --install` made one, else the `python` var. It gets its arguments in argv as a
Python literal of plain data (`remote_code.encode_args`; never a secret) and prints one
JSON object.

Remote paths: a session knows the host's home once the probe has run (`home`); from then
on `abs()` and `layout` give absolute paths, which shell commands and SFTP (which starts in
the home dir) read the same way.
"""

from __future__ import annotations

import shlex
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from handoff.config.layout import RemoteLayout, expand_home
from handoff.errors import RemoteError
from handoff.host import remote_code, untrusted
from handoff.host.targets import Target


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass(frozen=True)
class FileStat:
    size: int
    mode: int  # st_mode, type bits included
    uid: int
    mtime: float


def sh_path(path: str) -> str:
    """Quote a remote path for sh, keeping a leading `~/` expandable."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


class RemoteWriter(ABC):
    """A file being written on the host (see RemoteFiles.create)."""

    @abstractmethod
    def write(self, data: bytes | memoryview) -> None: ...

    @abstractmethod
    def fsync(self) -> None:
        """Flush to the host's disk where the server can (best effort)."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> RemoteWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteFiles(ABC):
    """SFTP-like file operations on the host. Relative paths start in the login user's home,
    as SFTP's do; a missing file raises FileNotFoundError, other failures OSError."""

    @abstractmethod
    def stat(self, path: str) -> FileStat: ...

    @abstractmethod
    def mkdir(self, path: str, mode: int = 0o755) -> None: ...

    @abstractmethod
    def chmod(self, path: str, mode: int) -> None: ...

    @abstractmethod
    def listdir(self, path: str) -> list[str]: ...

    @abstractmethod
    def remove(self, path: str) -> None: ...

    @abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """POSIX rename: replaces `dst` in one step."""

    @abstractmethod
    def symlink(self, target: str, link: str) -> None:
        """Create `link` pointing at `target` (as `ln -s target link`)."""

    @abstractmethod
    def create(self, path: str, mode: int, *, pipelined: bool = False) -> RemoteWriter:
        """Create `path` exclusively (it must not exist) with `mode` from its first instant:
        the mode travels in the create request itself, not in a chmod afterwards.
        `pipelined` writes without waiting for each acknowledgement (bulk uploads)."""

    @abstractmethod
    def read_chunks(self, path: str, offset: int, end: int) -> Iterator[bytes | memoryview]:
        """The bytes of `path` from `offset` up to `end`, in order, in chunks (valid until
        the next one is asked for); OSError if the file ends before `end`."""

    @abstractmethod
    def append(self, path: str, *, pipelined: bool = False) -> RemoteWriter:
        """Open the existing `path` to write at its end (a resumed upload's part file)."""


class Session(ABC):
    """A target and the means to act on it. Use as a context manager (connects, closes)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.home: str | None = None  # the remote home, once the probe reported it

    def __enter__(self) -> Session:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def label(self) -> str:
        return self.target.label

    @property
    def vars(self) -> dict[str, Any]:
        return self.target.vars

    # --- what an implementation provides ---------------------------------------------

    @abstractmethod
    def connect(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @property
    @abstractmethod
    def connected(self) -> bool: ...

    @abstractmethod
    def exec(self, command: str, timeout: float | None = 120.0,
             limit: int = untrusted.MAX_ANSWER_BYTES) -> Result:
        """Run `command` with sh on the host, no pty, stdin closed; collect both streams:
        stdout up to `limit` bytes (more raises untrusted.TooLarge and stops the command),
        the last untrusted.MAX_STDERR_BYTES of stderr."""

    @abstractmethod
    def stream(self, command: str, stop: threading.Event) -> Iterator[str]:
        """The output lines of a long-running `command` as they come, until it ends or
        `stop` is set (`fab logs --follow`)."""

    @property
    @abstractmethod
    def files(self) -> RemoteFiles: ...

    # --- built on those -----------------------------------------------------------------

    def check(self, command: str, what: str, timeout: float | None = 120.0) -> str:
        res = self.exec(command, timeout)
        if not res.ok:
            detail = (res.err or res.out).strip().splitlines()[-3:]
            raise RemoteError(f"{self.label}: {what} failed (exit {res.rc}): {' / '.join(detail)}")
        return res.out

    def python_command(self, argv: list[str]) -> str:
        """`<python> ARGV…`, preferring the venv `verify --install` made under remote_dir.

        The venv is used only when it looks like the one handoff made (its marker file is
        there) and nobody but the login user can have changed it: remote_dir, the venv and
        its bin/ are owned by the login user and not group/world-writable. Otherwise (a
        remote_dir another user prepared on a shared box) the `python` var runs instead,
        and the probe refuses the folder (handoff.host.facts)."""
        layout = self.target.layout
        root, venv = sh_path(layout.root), sh_path(layout.venv)
        python, marker = sh_path(layout.venv_python), sh_path(layout.venv_marker)
        bin_dir = sh_path(layout.venv + "/bin")
        args = " ".join(shlex.quote(a) for a in argv)
        py = str(self.vars["python"])
        # `find -perm /022` prints a folder that group or others may write: then not ours.
        ours = (f"[ -x {python} ] && [ -f {marker} ] && [ -O {root} ] && [ -O {venv} ] && "
                f"[ -O {bin_dir} ] && [ ! -L {bin_dir} ] && "
                f"[ -z \"$(find {root} {venv} {bin_dir} -maxdepth 0 -perm /022 2>/dev/null)\" ]")
        return f"if {ours}; then exec {python} {args}; else exec {py} {args}; fi"

    def run_code(self, module: str, args: dict[str, Any], what: str,
                 timeout: float = 120.0) -> Any:
        """Run remote module `module` (handoff.host.remote_code) with `args`; its JSON answer."""
        source = remote_code.source(module)
        try:
            res = self.exec(self.python_command(["-c", source, remote_code.encode_args(args)]),
                            timeout)
        except untrusted.TooLarge as exc:
            raise RemoteError(f"{self.label}: {what}: {exc}") from None
        if res.rc == 127:
            raise RemoteError(
                f"{self.label}: python {self.vars['python']!r} not found on the host; install "
                f"python3 >= 3.10 there or set the `python` var in the inventory"
            )
        if not res.ok:
            tail = " / ".join(res.err.strip().splitlines()[-3:])
            raise RemoteError(f"{self.label}: {what} failed (exit {res.rc}): "
                              f"{untrusted.visible(tail, 2000)}")
        try:
            # Read as the host's word, never evaluated, within the reader's limits: no NaN or
            # infinity, no bomb gets through.
            return untrusted.loads(res.out.strip().splitlines()[-1], f"{what}: the answer")
        except untrusted.Untrusted as exc:
            raise untrusted.Untrusted(f"{self.label}: {exc}") from None
        except (ValueError, IndexError):
            raise RemoteError(f"{self.label}: {what}: unexpected output "
                              f"{untrusted.visible(res.out[-200:])!r}") from None

    def abs(self, path: str) -> str:
        """Absolute remote path (`~` from the home the probe reported)."""
        if self.home is None:
            raise RuntimeError(f"{self.label}: remote home unknown before the probe")
        return expand_home(path, self.home)

    @property
    def layout(self) -> RemoteLayout:
        """The host's folders with absolute paths (after the probe)."""
        if self.home is None:
            raise RuntimeError(f"{self.label}: remote home unknown before the probe")
        return self.target.layout.under(self.home)

Connector = Callable[[Target], Session]


__all__ = ["Connector", "FileStat", "RemoteFiles", "RemoteWriter", "Result", "Session", "sh_path"]
