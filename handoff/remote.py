"""One connected host: commands, small python snippets and SFTP, with clear failures.

Commands run on a raw paramiko exec channel (no pty, stdin closed at once): cheaper
than Fabric's runner threads, and nothing can hang waiting for input. Remote paths
are made absolute from the home dir the probe reports, so shell commands and SFTP
(which starts in the home dir) agree on every path.

Snippets run with the host's effective python: `<remote_dir>/venv/bin/python` when
`verify --install` made one, else the `python` var. They take JSON in argv (never a
secret) and print one JSON object.
"""

from __future__ import annotations

import json
import select
import shlex
import time
from dataclasses import dataclass
from typing import Any

import paramiko

from handoff import console
from handoff.errors import ConnectError, RemoteError
from handoff.ssh import SafeConnection, open_connection
from handoff.targets import Target


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


def sh_path(path: str) -> str:
    """Quote a remote path for sh, keeping a leading `~/` expandable."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


class Session:
    """A target plus its open connection. Use as a context manager."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.conn: SafeConnection | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self.home: str | None = None

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

    def connect(self) -> None:
        if self.conn is None:
            self.conn = open_connection(self.target.endpoint, self.target.label)

    def close(self) -> None:
        if self._sftp is not None:
            try:
                self._sftp.close()
            except Exception:
                pass
            self._sftp = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    @property
    def transport(self) -> paramiko.Transport:
        self.connect()
        assert self.conn is not None
        transport = self.conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(f"{self.label}: the connection dropped")
        return transport

    # --- commands -----------------------------------------------------------------

    def exec(self, command: str, timeout: float | None = 120.0) -> Result:
        """Run `command` (sh -c on the host), no pty, stdin closed; collect both streams."""
        try:
            chan = self.transport.open_session(timeout=10)
            chan.settimeout(None)
            chan.exec_command(command)
            chan.shutdown_write()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(f"{self.label}: cannot start a command: {exc or type(exc).__name__}") from None
        out, err = bytearray(), bytearray()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                while chan.recv_ready():
                    out += chan.recv(65536)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise RemoteError(f"{self.label}: command timed out after {timeout:.0f} s")
                select.select([chan], [], [], 0.05)
            rc = chan.recv_exit_status()
        finally:
            chan.close()
        return Result(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def check(self, command: str, what: str, timeout: float | None = 120.0) -> str:
        res = self.exec(command, timeout)
        if not res.ok:
            detail = (res.err or res.out).strip().splitlines()[-3:]
            raise RemoteError(f"{self.label}: {what} failed (exit {res.rc}): {' / '.join(detail)}")
        return res.out

    def python_cmd(self, argv: list[str]) -> str:
        """`<python> ARGV…`, preferring the venv `verify --install` made under remote_dir."""
        venv = sh_path(str(self.vars["remote_dir"]).rstrip("/") + "/venv/bin/python")
        args = " ".join(shlex.quote(a) for a in argv)
        py = str(self.vars["python"])
        return f"if [ -x {venv} ]; then exec {venv} {args}; else exec {py} {args}; fi"

    def py(self, snippet: str, args: dict[str, Any], what: str, timeout: float = 120.0) -> Any:
        res = self.exec(self.python_cmd(["-c", snippet, json.dumps(args)]), timeout)
        if res.rc == 127:
            raise RemoteError(
                f"{self.label}: python {self.vars['python']!r} not found on the host; install "
                f"python3 >= 3.10 there or set the `python` var in the inventory"
            )
        if not res.ok:
            tail = " / ".join(res.err.strip().splitlines()[-3:])
            raise RemoteError(f"{self.label}: {what} failed (exit {res.rc}): {tail}")
        try:
            return json.loads(res.out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteError(f"{self.label}: {what}: unexpected output {console.r(res.out[-200:])!r}") from None

    # --- files --------------------------------------------------------------------

    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            try:
                self._sftp = paramiko.SFTPClient.from_transport(self.transport)
            except (paramiko.SSHException, OSError) as exc:
                raise RemoteError(
                    f"{self.label}: SFTP unavailable ({exc}); enable the sftp Subsystem in sshd_config"
                ) from None
            assert self._sftp is not None
        return self._sftp

    def abs(self, path: str) -> str:
        """Absolute remote path (`~` from the home the probe reported)."""
        if self.home is None:
            raise RemoteError(f"{self.label}: internal: home unknown before the probe")
        if path == "~":
            return self.home
        if path.startswith("~/"):
            return self.home.rstrip("/") + "/" + path[2:]
        return path

    @property
    def remote_dir(self) -> str:
        return self.abs(str(self.vars["remote_dir"]).rstrip("/"))
