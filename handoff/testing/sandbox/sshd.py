"""One private sshd per sandbox "container", listening on its own 127.0.0.N address.

The daemon runs in the foreground (`-D -e`) as a child of the sandbox, with its host
key, pid file, authorized keys and log under the sandbox root, and admits only the
container's throwaway user with the sandbox client key.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

from handoff.testing.sandbox._system import (
    OWNER_MARK,
    SandboxError,
    children_of,
    free_port,
    run,
    terminate_tree,
    wait_for_banner,
)

SSHD = "/usr/sbin/sshd"
_SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                 "/usr/libexec/sftp-server")


def require_sshd() -> None:
    if not os.access(SSHD, os.X_OK):
        raise SandboxError(f"{SSHD} is missing: install it with "
                           "`apt-get install -y --no-install-recommends openssh-server`")


def generate_key(path: Path, comment: str) -> None:
    """A fresh ed25519 key pair at `path` / `path.pub` (replacing any existing one)."""
    for stale in (path, path.with_name(path.name + ".pub")):
        stale.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    path.chmod(0o600)


def fingerprint(public_key: Path) -> str:
    """'SHA256:…' exactly as `ssh-keygen -lf` prints it."""
    out = run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(public_key)]).stdout
    return out.split()[1]


class SshdServer:
    """sshd for one container. `folder` holds everything; only authorized_keys is world-readable
    (sshd reads it with the user's privileges)."""

    def __init__(self, *, folder: Path, address: str, user: str, client_public_key: str,
                 name: str, sftp_log: bool = False) -> None:
        self.folder = folder
        self.address = address
        self.user = user
        self.name = name
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o711)
        self.host_key = folder / "ssh_host_ed25519_key"
        self.config = folder / "sshd_config"
        self.pid_file = folder / "sshd.pid"
        self.log = folder / "sshd.log"
        self.authorized_keys = folder / "authorized_keys"
        # With `sftp_log`, the SFTP server logs every file it serves and how many bytes it
        # read or wrote ("close "PATH" bytes read N written M"): what tests of resumed
        # transfers count, independently of the client's own accounting.
        self.sftp_log = folder / "sftp.log" if sftp_log else None
        if self.sftp_log is not None:
            self.sftp_log.touch()
            shutil.chown(self.sftp_log, user)  # the server runs as the container's user
            self.sftp_log.chmod(0o600)
        self.authorized_keys.write_text(client_public_key.strip() + "\n")
        self.authorized_keys.chmod(0o644)
        generate_key(self.host_key, f"handoff-sandbox {name}")

    @property
    def host_public_key(self) -> str:
        """'ssh-ed25519 AAAA…' (type and base64, no comment), as known_hosts wants it."""
        return " ".join(self.host_key.with_name(self.host_key.name + ".pub")
                        .read_text().split()[:2])

    @property
    def host_key_fingerprint(self) -> str:
        return fingerprint(self.host_key.with_name(self.host_key.name + ".pub"))

    def _write_config(self) -> None:
        sftp = next((p for p in _SFTP_SERVERS if os.access(p, os.X_OK)), "internal-sftp")
        if self.sftp_log is not None and sftp != "internal-sftp":
            # The subsystem runs through the user's shell: `-e` logs to stderr, sent to the file.
            sftp = f"{sftp} -e -l INFO 2>>{self.sftp_log}"
        self.config.write_text("\n".join([
            f"{OWNER_MARK}{os.getpid()}",
            f"# container {self.name}",
            f"ListenAddress {self.address}",
            f"Port {self.port}",
            f"HostKey {self.host_key}",
            f"PidFile {self.pid_file}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            f"AllowUsers {self.user}",
            "PermitRootLogin no",
            "UsePAM no",
            "StrictModes no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            # Benchmarks and the peers open many sessions at once; the default 10:30:100
            # would randomly drop some of eight parallel Ansible forks' connections.
            "MaxStartups 200:30:400",
            "MaxSessions 64",
            f"Subsystem sftp {sftp}",
            "",
        ]))
        self.config.chmod(0o600)

    def start(self, *, timeout_s: float = 15.0) -> None:
        """Start on a free port (retrying if another process grabs it first), wait for the banner."""
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege-separation dir
        last_error = ""
        for _attempt in range(5):
            if not self.port:
                self.port = free_port(self.address)
            self._write_config()
            check = run([SSHD, "-t", "-f", str(self.config)], check=False)
            if check.returncode != 0:
                raise SandboxError(f"sshd rejects {self.config}: {check.stderr.strip()}")
            with self.log.open("ab") as log:
                # A session of its own: Ctrl-C in the terminal reaches the sandbox, which then
                # stops sshd in order, instead of reaching sshd directly.
                self.proc = subprocess.Popen([SSHD, "-f", str(self.config), "-D", "-e"],
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                             start_new_session=True)
            if wait_for_banner(self.address, self.port, timeout_s=timeout_s,
                               alive=self._alive):
                return
            self.stop()
            last_error = " ".join(self.log.read_text(errors="replace").strip().splitlines()[-1:])
            if "Address already in use" not in last_error:
                break
            self.port = 0  # lost the race for the port: take another one
        raise SandboxError(f"sshd for {self.name} did not start on {self.address}:{self.port}: "
                           f"{last_error or 'no output'} (log: {self.log})")

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Stop the listener and every connection it forked (a container going away)."""
        if self.proc is None:
            return
        terminate_tree(self.proc.pid)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.proc = None

    def drop_connections(self) -> int:
        """Kill every connection's processes (as a network drop would); the listener stays.
        Returns how many processes were killed."""
        if self.proc is None:
            return 0
        victims = children_of(self.proc.pid)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(victims)

    def rotate_host_key(self) -> None:
        """A new host key and a restarted daemon on the same address and port."""
        was_running = self.running
        self.stop()
        generate_key(self.host_key, f"handoff-sandbox {self.name} rotated")
        if was_running:
            self.start()
