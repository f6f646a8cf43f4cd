"""A Session on this machine, for unit tests of per-host logic without sshd (test support).

`LocalSession(target, home)` stands for a host whose login user's home is the folder
`home`: commands run with the local `sh` (cwd and $HOME = `home`, stdin closed), remote
modules with the `python` var (tests set it to `sys.executable`), and file operations act
on the local filesystem with relative paths starting in `home`, as SFTP's do. Everything
else (what gets run, in which order, with which paths) is the production code's: only the
transport is local.

It proves the logic, not the transport: the integration tests run the same operations
over real sshd. Nothing in the control plane imports this module.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

from handoff.errors import RemoteError
from handoff.host import untrusted
from handoff.host.session import FileStat, RemoteFiles, RemoteWriter, Result, Session
from handoff.host.targets import Target


class _LocalWriter(RemoteWriter):
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def fsync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class LocalFiles(RemoteFiles):
    def __init__(self, home: Path) -> None:
        self.home = home
        self.calls: list[tuple[str, str]] = []  # (operation, path): what a test may assert on

    def _path(self, op: str, path: str) -> Path:
        self.calls.append((op, path))
        return self.home / path if not path.startswith("/") else Path(path)

    def stat(self, path: str) -> FileStat:
        st = os.stat(self._path("stat", path))
        return FileStat(st.st_size, st.st_mode, st.st_uid, st.st_mtime)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        os.mkdir(self._path("mkdir", path), mode)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._path("chmod", path), mode)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(self._path("listdir", path)))

    def remove(self, path: str) -> None:
        os.unlink(self._path("remove", path))

    def rename(self, src: str, dst: str) -> None:
        os.replace(self._path("rename", src), self._path("rename-to", dst))

    def symlink(self, target: str, link: str) -> None:
        os.symlink(target, self._path("symlink", link))

    def create(self, path: str, mode: int, *, pipelined: bool = False) -> RemoteWriter:
        fd = os.open(self._path("create", path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        os.fchmod(fd, mode)  # as an sftp-server would: the create mode, whatever the umask
        return _LocalWriter(fd)

    def append(self, path: str, *, pipelined: bool = False) -> RemoteWriter:
        return _LocalWriter(os.open(self._path("append", path), os.O_WRONLY | os.O_APPEND))

    def read_chunks(self, path: str, offset: int, end: int) -> Iterator[bytes | memoryview]:
        with open(self._path("read", path), "rb") as fh:
            fh.seek(offset)
            left = end - offset
            while left > 0:
                chunk = fh.read(min(left, 1 << 20))
                if not chunk:
                    raise OSError(f"reading {path}: the file ended early (shortened or replaced meanwhile)")
                left -= len(chunk)
                yield chunk


class LocalSession(Session):
    """A target whose "host" is this machine, with `home` as the login user's home."""

    def __init__(self, target: Target, home: Path) -> None:
        super().__init__(target)
        self.root = Path(home)
        self.root.mkdir(parents=True, exist_ok=True)
        self._files = LocalFiles(self.root)
        self._connected = False
        self.commands: list[str] = []  # every command run, in order

    def connect(self) -> None:
        self._connected = True

    def close(self) -> None:
        self._connected = False

    @property
    def connected(self) -> bool:
        return self._connected

    def _env(self) -> dict[str, str]:
        return {"HOME": str(self.root), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "LANG": "C.UTF-8"}

    def exec(self, command: str, timeout: float | None = 120.0,
             limit: int = untrusted.MAX_ANSWER_BYTES) -> Result:
        self.commands.append(command)
        try:
            proc = subprocess.run(["sh", "-c", command], cwd=self.root, env=self._env(),
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise RemoteError(f"{self.label}: command timed out after {timeout:.0f} s") from None
        if len(proc.stdout) > limit:
            raise untrusted.TooLarge(f"{self.label}: the host's answer", limit, len(proc.stdout))
        return Result(proc.returncode, proc.stdout.decode("utf-8", "replace"),
                      proc.stderr.decode("utf-8", "replace")[-untrusted.MAX_STDERR_BYTES:])

    def stream(self, command: str, stop: threading.Event) -> Iterator[str]:
        self.commands.append(command)
        proc = subprocess.Popen(["sh", "-c", command], cwd=self.root, env=self._env(),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        lines = untrusted.Lines()
        try:
            while not stop.is_set():
                ready, _, _ = select.select([proc.stdout], [], [], 0.2)
                if ready:
                    data = os.read(proc.stdout.fileno(), 65536)
                    if not data:
                        break
                    yield from lines.feed(data)
                elif proc.poll() is not None:
                    break
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()

    @property
    def files(self) -> RemoteFiles:
        return self._files
