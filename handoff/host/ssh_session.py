"""The real `Session` (handoff.host.session): paramiko over an SSH connection made by
handoff.ssh.connect, host keys checked.

Commands run on a raw exec channel (no pty, stdin closed at once): cheaper than Fabric's
runner threads, and nothing can hang waiting for input. Files go over one SFTP channel per
session; large writes keep many requests in flight (handoff.ssh.sftp), and every SFTP call
is bounded by the host's `io_timeout`.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Iterator

import paramiko
from paramiko.sftp import (
    CMD_EXTENDED,
    CMD_HANDLE,
    CMD_OPEN,
    SFTP_FLAG_CREATE,
    SFTP_FLAG_EXCL,
    SFTP_FLAG_WRITE,
)

from handoff.defaults import IO_TIMEOUT_S
from handoff.errors import ConnectError, RemoteError
from handoff.host import untrusted
from handoff.host.session import FileStat, RemoteFiles, RemoteWriter, Result, Session
from handoff.host.targets import Target
from handoff.ssh import sftp as sftpio
from handoff.ssh.connect import Link, deadline, open_connection


def _stalled(label: str, what: str, seconds: float) -> RemoteError:
    return RemoteError(f"{label}: SFTP {what}: no answer from the host within {seconds:.0f} s "
                       f"(its SFTP server stalled); the connection was closed. Raise the "
                       f"`io_timeout` var if the host is just slow")


class _SFTPWriter(RemoteWriter):
    """Large writes with many in flight (handoff.ssh.sftp); paramiko's file object only opens
    and closes the handle."""

    def __init__(self, files: _SFTPFiles, handle: paramiko.SFTPFile, path: str,
                 pipelined: bool) -> None:
        self._files = files
        self._file = handle
        self._path = path
        self._writer = sftpio.Writer(files.sftp, handle.handle, f"writing {path}",
                                     depth=sftpio.DEPTH if pipelined else 1)

    def write(self, data: bytes | memoryview) -> None:
        with self._files.guard(f"writing {self._path}"):
            self._writer.write(data)

    def fsync(self) -> None:
        with self._files.guard(f"writing {self._path}"):
            self._writer.finish()
            try:
                self._files.sftp._request(CMD_EXTENDED, "fsync@openssh.com", self._file.handle)
            except TimeoutError:
                raise
            except (paramiko.SFTPError, OSError):
                pass  # a server without the extension: rename still gives atomicity, not durability

    def close(self) -> None:
        with self._files.guard(f"closing {self._path}"):
            try:
                self._writer.finish()  # every acknowledgement in: a failed write raises here
            finally:
                self._file.close()


class _SFTPFiles(RemoteFiles):
    """SFTP over one channel whose every wait is bounded by `timeout`: a request the server
    does not answer in time fails the host with a clear message and closes the connection
    (a late answer must not be read as the answer to the next request)."""

    def __init__(self, sftp: paramiko.SFTPClient, session: SSHSession, timeout: float) -> None:
        self.sftp = sftp
        self.session = session
        self.timeout = timeout

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        try:
            yield
        except TimeoutError:
            self.session.close()
            raise _stalled(self.session.label, what, self.timeout) from None
        except (EOFError, paramiko.SSHException) as exc:
            self.session.close()
            raise ConnectError(f"{self.session.label}: the connection dropped while {what} "
                               f"({exc or type(exc).__name__})") from None

    def stat(self, path: str) -> FileStat:
        with self.guard(f"stat {path}"):
            st = self.sftp.stat(path)
        return FileStat(int(st.st_size or 0), int(st.st_mode or 0), int(st.st_uid or 0),
                        float(st.st_mtime or 0))

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        with self.guard(f"mkdir {path}"):
            self.sftp.mkdir(path, mode)

    def chmod(self, path: str, mode: int) -> None:
        with self.guard(f"chmod {path}"):
            self.sftp.chmod(path, mode)

    def listdir(self, path: str) -> list[str]:
        with self.guard(f"listing {path}"):
            return list(self.sftp.listdir(path))

    def remove(self, path: str) -> None:
        with self.guard(f"removing {path}"):
            self.sftp.remove(path)

    def rename(self, src: str, dst: str) -> None:
        with self.guard(f"renaming {src}"):
            self.sftp.posix_rename(src, dst)

    def symlink(self, target: str, link: str) -> None:
        # OpenSSH's sftp-server takes SYMLINK args as (target, link), which is the order
        # paramiko sends.
        with self.guard(f"symlink {link}"):
            self.sftp.symlink(target, link)

    def create(self, path: str, mode: int, *, pipelined: bool = False) -> RemoteWriter:
        # paramiko's open() sends empty attrs, so the server would create the file with
        # 0666 & ~umask first; this sends the permissions with the exclusive create.
        attrs = paramiko.SFTPAttributes()
        attrs.st_mode = mode
        with self.guard(f"creating {path}"):
            kind, msg = self.sftp._request(
                CMD_OPEN, path, SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_EXCL, attrs)
            if kind != CMD_HANDLE or msg is None:
                raise OSError(f"SFTP server did not return a file handle for {path}")
            handle = paramiko.SFTPFile(self.sftp, msg.get_binary(), "wb")
            try:
                handle.chmod(mode)  # no-op normally; guards against a server that ignored the attrs
            except BaseException:
                handle.close()
                raise
        return _SFTPWriter(self, handle, path, pipelined)

    def append(self, path: str, *, pipelined: bool = False) -> RemoteWriter:
        # Opened without truncating, written from its current end on: the writer sends
        # explicit offsets, so "append" is the size at the start, not the APPEND flag.
        with self.guard(f"opening {path}"):
            end = int(self.sftp.stat(path).st_size or 0)
            handle = self.sftp.open(path, "r+b")
        writer = _SFTPWriter(self, handle, path, pipelined)
        writer._writer.offset = end
        return writer

    def read_chunks(self, path: str, offset: int, end: int) -> Iterator[bytes | memoryview]:
        with self.guard(f"reading {path}"), self.sftp.open(path, "rb") as fh:
            yield from sftpio.read(self.sftp, fh.handle, offset, end, f"reading {path}")


class SSHSession(Session):
    """A target over SSH (handoff.ssh.connect): ssh_config honoured, every hop's host key checked,
    every wait bounded (`io_timeout` var for SFTP requests and channel requests)."""

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self.link: Link | None = None
        self._files: _SFTPFiles | None = None

    @property
    def io_timeout(self) -> float:
        return float(self.vars.get("io_timeout") or IO_TIMEOUT_S)

    def connect(self) -> None:
        if self.link is None:
            self.link = open_connection(self.target.endpoint, self.target.label)

    def close(self) -> None:
        files, self._files = self._files, None
        if files is not None:
            try:
                files.sftp.close()
            except Exception:
                pass
        link, self.link = self.link, None
        if link is not None:
            link.close()

    @property
    def connected(self) -> bool:
        return self.link is not None and self.link.active

    @property
    def transport(self) -> paramiko.Transport:
        self.connect()
        assert self.link is not None
        transport = self.link.transport
        if not transport.is_active():
            self.close()
            raise ConnectError(f"{self.label}: the connection dropped")
        return transport

    def _channel(self, command: str) -> paramiko.Channel:
        transport = self.transport
        assert self.link is not None
        try:
            with deadline(self.link, self.io_timeout, "starting a command"):
                chan = transport.open_session(timeout=self.io_timeout)
                chan.settimeout(None)
                chan.exec_command(command)
                chan.shutdown_write()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(f"{self.label}: cannot start a command: "
                               f"{exc or type(exc).__name__}") from None
        return chan

    def exec(self, command: str, timeout: float | None = 120.0,
             limit: int = untrusted.MAX_ANSWER_BYTES) -> Result:
        chan = self._channel(command)
        transport = self.transport
        out = untrusted.Capped(limit, f"{self.label}: the host's answer")
        err = untrusted.Tail(untrusted.MAX_STDERR_BYTES)
        deadline_at = None if timeout is None else time.monotonic() + timeout
        exited_at: float | None = None
        try:
            while True:
                while chan.recv_ready():
                    out.add(chan.recv(65536))
                while chan.recv_stderr_ready():
                    err.add(chan.recv_stderr(65536))
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    # sshd may send the exit status before the last output (the child exited,
                    # its pipe not drained yet: seen with `head | sha256sum` beside an SFTP
                    # upload): read on until the end of the output, or 2 s after the exit.
                    exited_at = exited_at or time.monotonic()
                    if chan.eof_received or time.monotonic() - exited_at > 2.0:
                        break
                if chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if deadline_at is not None and time.monotonic() > deadline_at:
                    raise RemoteError(f"{self.label}: command timed out after {timeout:.0f} s")
                select.select([chan], [], [], 0.05)
            rc = chan.recv_exit_status()
            if rc == -1 and not transport.is_active():
                self.close()
                raise ConnectError(f"{self.label}: the connection dropped while a command ran")
        finally:
            chan.close()
        return Result(rc, out.data.decode("utf-8", "replace"), err.bytes().decode("utf-8", "replace"))

    def stream(self, command: str, stop: threading.Event) -> Iterator[str]:
        chan = self._channel(command)
        transport = chan.get_transport()
        # Every line bounded (a 50 MB line costs 16 KB and a note, never 50 MB of RSS).
        lines = untrusted.Lines()
        try:
            while not stop.is_set() and not chan.exit_status_ready():
                select.select([chan], [], [], 0.2)
                while chan.recv_ready():
                    yield from lines.feed(chan.recv(65536))
                if not chan.recv_ready() and not transport.is_active() and not stop.is_set():
                    raise ConnectError(f"{self.label}: the connection dropped")
        finally:
            chan.close()

    @property
    def files(self) -> RemoteFiles:
        if self._files is None:
            transport = self.transport
            assert self.link is not None
            timeout = self.io_timeout
            try:
                with deadline(self.link, timeout + 2, "starting SFTP"):
                    # A channel sized for bulk data (handoff.ssh.sftp): 256 KiB packets
                    # in a 32 MiB window, where paramiko asks for 32 KiB in 2 MiB.
                    chan = transport.open_session(window_size=sftpio.WINDOW,
                                                  max_packet_size=sftpio.PACKET, timeout=timeout)
                    chan.in_buffer = sftpio.ChunkPipe()  # before the server can send a byte
                    chan.settimeout(timeout)
                    chan.invoke_subsystem("sftp")
                    sftp = paramiko.SFTPClient(chan)
            except ConnectError:
                self.close()
                raise _stalled(self.label, "start", timeout) from None
            except TimeoutError:
                self.close()
                raise _stalled(self.label, "start", timeout) from None
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise RemoteError(
                    f"{self.label}: SFTP unavailable ({exc or type(exc).__name__}); enable the "
                    f"sftp Subsystem in sshd_config"
                ) from None
            self._files = _SFTPFiles(sftp, self, timeout)
        return self._files


__all__ = ["SSHSession"]
