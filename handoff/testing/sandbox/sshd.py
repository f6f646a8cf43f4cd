"""One private sshd per sandbox "container", listening on its own 127.0.0.N address.

The daemon runs in the foreground (`-D -e`) as a child of the sandbox, with its host
keys, pid file, authorized keys and log under the sandbox root, and admits only the
container's throwaway user with the sandbox client key.

Options for the tests of SSH behaviour: several host key types (a stock sshd offers
ed25519, ecdsa and rsa), host certificates signed by a sandbox CA, and an SFTP server that
stalls. The log is at LogLevel VERBOSE: every authentication attempt and login is in it.
"""

from __future__ import annotations

import contextlib
import os
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


def generate_key(path: Path, comment: str, key_type: str = "ed25519") -> None:
    """A fresh key pair (ed25519 unless `key_type`) at `path` / `path.pub`, replacing any."""
    for stale in (path, path.with_name(path.name + ".pub"), path.with_name(path.name + "-cert.pub")):
        stale.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", comment, "-f", str(path)])
    path.chmod(0o600)


def sign_host_key(ca: Path, public_key: Path, principals: list[str]) -> Path:
    """A host certificate for `public_key` signed by `ca` (valid a day), as `*-cert.pub`."""
    run(["ssh-keygen", "-q", "-s", str(ca), "-I", f"handoff-sandbox {public_key.name}", "-h",
         "-n", ",".join(principals), "-V", "-5m:+1d", str(public_key)])
    return public_key.with_name(public_key.name[: -len(".pub")] + "-cert.pub")


def fingerprint(public_key: Path) -> str:
    """'SHA256:…' exactly as `ssh-keygen -lf` prints it."""
    out = run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(public_key)]).stdout
    return out.split()[1]


class SshdServer:
    """sshd for one container. `folder` holds everything; only authorized_keys is world-readable
    (sshd reads it with the user's privileges)."""

    def __init__(self, *, folder: Path, address: str, user: str, client_public_key: str,
                 name: str, key_types: tuple[str, ...] = ("ed25519",),
                 host_ca: Path | None = None) -> None:
        self.folder = folder
        self.address = address
        self.user = user
        self.name = name
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o711)
        self.key_types = key_types
        self.host_ca = host_ca
        self.host_keys = [folder / f"ssh_host_{t}_key" for t in key_types]
        self.host_key = self.host_keys[0]
        self.sftp_stall_s = 0.0
        self.config = folder / "sshd_config"
        self.pid_file = folder / "sshd.pid"
        self.log = folder / "sshd.log"
        self.authorized_keys = folder / "authorized_keys"
        self.authorized_keys.write_text(client_public_key.strip() + "\n")
        self.authorized_keys.chmod(0o644)
        self._generate_host_keys(f"handoff-sandbox {name}")

    def _generate_host_keys(self, comment: str) -> None:
        for key, key_type in zip(self.host_keys, self.key_types, strict=True):
            generate_key(key, comment, key_type)
            # The sandbox runs sshd as root, but a host key's folder is one the tests list:
            # certificates (public) sit next to their keys.
            if self.host_ca is not None:
                sign_host_key(self.host_ca, key.with_name(key.name + ".pub"), [self.address])

    @property
    def host_public_key(self) -> str:
        """'ssh-ed25519 AAAA…' (type and base64, no comment), as known_hosts wants it."""
        return self.public_key_of(self.key_types[0])

    def public_key_of(self, key_type: str) -> str:
        """The host key of `key_type` ('ed25519', 'ecdsa', 'rsa') as 'TYPE BASE64'."""
        key = self.host_keys[self.key_types.index(key_type)]
        return " ".join(key.with_name(key.name + ".pub").read_text().split()[:2])

    @property
    def host_key_fingerprint(self) -> str:
        return fingerprint(self.host_key.with_name(self.host_key.name + ".pub"))

    def _sftp_command(self) -> str:
        sftp = next((p for p in _SFTP_SERVERS if os.access(p, os.X_OK)), "internal-sftp")
        if not self.sftp_stall_s:
            return sftp
        # A server that logs in fine and then never answers SFTP (a hung disk, a wedged
        # sftp-server): the wrapper holds the channel open, silent, then lets sftp-server run.
        wrapper = self.folder / "stalling-sftp-server"
        wrapper.write_text(f"#!/bin/sh\nsleep {self.sftp_stall_s:g}\nexec {sftp}\n")
        wrapper.chmod(0o755)
        return str(wrapper)

    def _write_config(self) -> None:
        sftp = self._sftp_command()
        host_keys = [f"HostKey {key}" for key in self.host_keys]
        if self.host_ca is not None:
            host_keys += [f"HostCertificate {key.with_name(key.name + '-cert.pub')}"
                          for key in self.host_keys]
        self.config.write_text("\n".join([
            f"{OWNER_MARK}{os.getpid()}",
            f"# container {self.name}",
            f"ListenAddress {self.address}",
            f"Port {self.port}",
            *host_keys,
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
            "LogLevel VERBOSE",  # every auth attempt and login is logged: tests read it
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
        """New host keys and a restarted daemon on the same address and port."""
        was_running = self.running
        self.stop()
        self._generate_host_keys(f"handoff-sandbox {self.name} rotated")
        if was_running:
            self.start()

    def stall_sftp(self, seconds: float) -> None:
        """From now on, each SFTP session says nothing for `seconds` (0: back to normal);
        the daemon restarts on the same address and port."""
        self.sftp_stall_s = seconds
        was_running = self.running
        self.stop()
        if was_running:
            self.start()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
