"""A local sandbox of SSH "containers" on loopback, for the demo, the tests and the benchmarks.

Each container is a private sshd on its own 127.0.0.N address that admits one throwaway
unprivileged user; next to them run a fake OpenRouter and a throwaway keyring holding a
throwaway API key (and, with `management=True`, a throwaway management key the fake
accepts, so deploys mint a child key per container; `key_limit`/`key_mode`/`key_ttl_hours`
then go into the inventory's defaults). The workstation side gets its own $HOME (ssh config, client key,
known_hosts), inventory and state dir, so `fab` pointed at `Sandbox.env()` acts on the
sandbox and never on the user's real ~/.ssh, keyring or hosts.

    with Sandbox(tmp_path, hosts=3) as sbx:
        subprocess.run([".venv/bin/fab", "deploy"], env={**clean_env, **sbx.env()})

Everything lives under `root` and is torn down on exit - exceptions and Ctrl-C included,
and leftovers of a crashed earlier run (users, sshd) are removed at the next start.
Needs root (useradd) and /usr/sbin/sshd.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import secrets
import shutil
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from handoff import defaults
from handoff.testing.sandbox import _system
from handoff.testing.sandbox._system import SandboxError
from handoff.testing.sandbox.keystore import ThrowawayKeyring
from handoff.testing.sandbox.pyenv import remote_python
from handoff.testing.sandbox.sshd import SshdServer, generate_key, require_sshd

if TYPE_CHECKING:
    from handoff.testing.fakeapi import FakeOpenRouter

__all__ = ["Container", "Sandbox", "SandboxError"]

SECRET_SERVICE_NAME = defaults.SECRET_SERVICE  # where handoff reads the key by default
SECRET_USERNAME = defaults.API_KEY_USERNAME
MANAGEMENT_USERNAME = defaults.MANAGEMENT_KEY_USERNAME
# api=False still needs a base_url that can never leave loopback (the inventory default is
# the real OpenRouter): port 9 is "discard", nothing listens there.
DEAD_API_URL = "http://127.0.0.1:9/api/v1"

_user_counter = itertools.count(1)
_counter_lock = threading.Lock()


@dataclass(frozen=True)
class Container:
    """One sandbox host as the inventory and ssh_config name it."""

    name: str                  # inventory name, e.g. "sbx-1"
    address: str               # 127.0.0.N
    port: int
    user: str                  # throwaway unprivileged unix user
    home: Path                 # that user's home (the remote ~)
    python: str                # interpreter that runs the payload there (has aiohttp)
    host_key_fingerprint: str  # "SHA256:…" as `ssh-keygen -lf` prints it


def new_api_key() -> str:
    """A throwaway key shaped like a real OpenRouter key."""
    return "sk-or-v1-" + secrets.token_hex(32)


class Sandbox:
    """Context manager; everything lives under `root` and is torn down on exit, Ctrl-C included."""

    def __init__(self, root: Path, *, hosts: int = 2, api: bool = True, keyring: str = "auto",
                 name_prefix: str = "sbx", first_address: int = 2,
                 api_latency_s: float = 0.0, management: bool = False,
                 key_limit: float | None = None, key_mode: str | None = None,
                 key_ttl_hours: float | None = None,
                 host_key_types: tuple[str, ...] = ("ed25519",), host_ca: bool = False,
                 sftp_log: bool = False, defaults: dict[str, Any] | None = None) -> None:
        """`host_key_types`: the host keys each sshd offers, the first one written to
        known_hosts (("ed25519", "ecdsa", "rsa") is a stock sshd); `host_ca`: a sandbox CA
        signs every host key into a host certificate (see `host_ca_line`); `sftp_log`: each
        container's SFTP server logs the files it serves and the bytes it moved
        (`sftp_log()`); `defaults`: more vars for the inventory's `defaults` (a test's short
        `start_watch_s`)."""
        if hosts < 1:
            raise ValueError("hosts must be at least 1")
        if not 2 <= first_address <= 254 - hosts + 1:
            raise ValueError("first_address must keep 127.0.0.N within 2..254")
        self.root = Path(root).absolute()
        self.hosts = hosts
        self.use_api = api
        self.keyring_mode = keyring
        self.name_prefix = name_prefix
        self.first_address = first_address
        self.api_latency_s = api_latency_s
        self.extra_defaults = dict(defaults or {})
        self.key_vars = {k: v for k, v in (("key_mode", key_mode), ("key_limit", key_limit),
                                           ("key_ttl_hours", key_ttl_hours)) if v is not None}
        self.host_key_types = host_key_types
        self.use_host_ca = host_ca
        self.log_sftp = sftp_log

        self.home = self.root / "home"
        self.ssh_dir = self.home / ".ssh"
        self.identity = self.ssh_dir / "id_ed25519"
        self.known_hosts = self.ssh_dir / "known_hosts"
        self.ssh_config = self.ssh_dir / "config"
        self.inventory = self.root / "inventory.yml"
        self.state_dir = self.root / "state"
        self.homes_dir = self.root / "containers"
        self.hosts_dir = self.root / "sshd"
        self.host_ca_key = self.hosts_dir / "host_ca"

        self.containers: list[Container] = []
        self.api_key = new_api_key()
        # Stored in the keyring (and accepted by the fake's /keys) only with `management`.
        self.management_key = new_api_key() if management else None
        self.api_url = DEAD_API_URL
        self.api: FakeOpenRouter | None = None
        self.keyring_backend = ""
        self.notes: list[str] = []          # what fell back to what, for humans
        self.python = ""
        self._servers: dict[str, SshdServer] = {}
        self._users: list[str] = []
        self._keyring: ThrowawayKeyring | None = None
        self._forgotten: frozenset[str] = frozenset()  # containers left out of known_hosts
        self._created_root = False
        self._started = False
        self._closed = False
        self._lock = threading.RLock()

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Bring everything up; on any failure (Ctrl-C included) tear down what was started."""
        if self._started:
            return
        _system.require_root()
        require_sshd()
        self._started = True
        atexit.register(self.close)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        for removed in _system.clean_stale():
            self.notes.append(f"removed leftover of a crashed sandbox: {removed}")
        self._created_root = not self.root.exists()
        self.root.mkdir(parents=True, exist_ok=True)
        _system.make_traversable(self.root)
        for folder, mode in ((self.home, 0o700), (self.ssh_dir, 0o700), (self.state_dir, 0o700),
                             (self.homes_dir, 0o711), (self.hosts_dir, 0o711)):
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(mode)
        self.python = remote_python()
        generate_key(self.identity, "handoff-sandbox client")
        if self.use_host_ca:
            generate_key(self.host_ca_key, "handoff-sandbox host CA")
        client_public = self.identity.with_name(self.identity.name + ".pub").read_text()

        self._keyring = ThrowawayKeyring(self.home, mode=self.keyring_mode)
        self._keyring.start()
        self.notes.extend(self._keyring.notes)
        self._keyring.store(SECRET_SERVICE_NAME, SECRET_USERNAME, self.api_key)
        if self.management_key is not None:
            self._keyring.store(SECRET_SERVICE_NAME, MANAGEMENT_USERNAME, self.management_key)
        self.keyring_backend = self._keyring.backend

        if self.use_api:
            from handoff.testing.fakeapi import FakeOpenRouter

            self.api = FakeOpenRouter(api_key=self.api_key, latency_s=self.api_latency_s)
            if self.management_key is not None:
                self.api.keys.enable(self.management_key)
            self.api_url = self.api.start_in_thread()

        for index in range(self.hosts):
            name = f"{self.name_prefix}-{index + 1}"
            with _counter_lock:
                user = _system.sandbox_user_name(next(_user_counter))
            home = self.homes_dir / name
            self._users.append(user)
            _system.create_user(user, home)
            server = SshdServer(folder=self.hosts_dir / name,
                                address=f"127.0.0.{self.first_address + index}",
                                user=user, client_public_key=client_public, name=name,
                                key_types=self.host_key_types,
                                host_ca=self.host_ca_key if self.use_host_ca else None,
                                sftp_log=self.log_sftp)
            server.start()
            self._servers[name] = server
            self.containers.append(Container(
                name=name, address=server.address, port=server.port, user=user, home=home,
                python=self.python, host_key_fingerprint=server.host_key_fingerprint))
        self._write_client_files()

    def close(self) -> None:
        """Idempotent and best-effort: every step runs even if an earlier one fails."""
        with self._lock:
            if self._closed or not self._started:
                return
            self._closed = True
        atexit.unregister(self.close)
        # A second Ctrl-C while tearing down must not leave users and daemons behind.
        shield = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if shield else None
        try:
            self._teardown()
        finally:
            if shield:
                signal.signal(signal.SIGINT,
                              previous if previous is not None else signal.default_int_handler)

    def _teardown(self) -> None:
        for server in self._servers.values():
            with contextlib.suppress(Exception):
                server.stop()
        for user in self._users:
            with contextlib.suppress(Exception):
                _system.delete_user(user)
        if self.api is not None:
            with contextlib.suppress(Exception):
                self.api.stop_thread()
        if self._keyring is not None:
            with contextlib.suppress(Exception):
                self._keyring.stop()
        if self._created_root:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            for path in (self.home, self.state_dir, self.homes_dir, self.hosts_dir,
                         self.inventory):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    # -- workstation side ------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """What a `fab` subprocess needs to act on this sandbox only (never the API key)."""
        keyring_env = self._keyring.env if self._keyring else {}
        return {
            **keyring_env,
            "HOME": str(self.home),
            "HANDOFF_INVENTORY": str(self.inventory),
            "HANDOFF_STATE_DIR": str(self.state_dir),
        }

    def _write_client_files(self) -> None:
        self._write_known_hosts()
        blocks = []
        for c in self.containers:
            blocks.append("\n".join([
                f"Host {c.name}",
                f"    HostName {c.address}",
                f"    Port {c.port}",
                f"    User {c.user}",
                f"    IdentityFile {self.identity}",
                "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {self.known_hosts}",
                "    StrictHostKeyChecking yes",
            ]))
        self.ssh_config.write_text("# handoff sandbox: one entry per container\n\n"
                                   + "\n\n".join(blocks) + "\n")
        self.ssh_config.chmod(0o600)
        self.inventory.write_text(yaml.safe_dump(self.inventory_data(), sort_keys=False))

    def _write_known_hosts(self) -> None:
        lines = [self.known_hosts_line(c.name) for c in self.containers
                 if c.name not in self._forgotten]
        self.known_hosts.write_text("".join(line + "\n" for line in lines))
        self.known_hosts.chmod(0o600)

    def inventory_data(self) -> dict[str, Any]:
        """The sandbox inventory (the format of docs/configuration.md), as written to `self.inventory`."""
        hosts: dict[str, Any] = {}
        for c in self.containers:
            hosts[c.name] = {
                "address": c.address, "port": c.port, "user": c.user,
                "identity": str(self.identity), "roles": ["generator"],
                "vars": {"python": c.python, "base_url": self.api_url, "concurrency": 50},
            }
        # The defaults' base_url is also the management API (handoff.config.inventory.
        # management_api): the fake's, never OpenRouter's.
        return {"defaults": {"base_url": self.api_url, **self.key_vars, **self.extra_defaults},
                "hosts": hosts}

    # -- breaking and repairing hosts ------------------------------------------------------------
    def container(self, name: str) -> Container:
        for c in self.containers:
            if c.name == name:
                return c
        known = ", ".join(c.name for c in self.containers)
        raise KeyError(f"no sandbox container {name!r} (known: {known})")

    def stop_container(self, name: str) -> None:
        """The host goes down: sshd and its connections stop, the user's processes die."""
        container = self.container(name)
        self._servers[name].stop()
        _system.kill_user_processes(container.user)

    def start_container(self, name: str) -> None:
        """Bring a stopped host back on the same address, port and host key."""
        self.container(name)
        server = self._servers[name]
        if not server.running:
            server.start()

    def drop_connections(self, name: str) -> int:
        """Cut every open SSH connection to `name` (its sshd keeps listening)."""
        self.container(name)
        return self._servers[name].drop_connections()

    def rotate_host_key(self, name: str) -> None:
        """A new host key and a restarted sshd: to the workstation, a changed key.
        known_hosts is left alone (it still holds the old key); see `trust_current_key`."""
        container = self.container(name)
        server = self._servers[name]
        server.rotate_host_key()
        self._replace(container, port=server.port,
                      host_key_fingerprint=server.host_key_fingerprint)

    def forget_host_key(self, name: str) -> None:
        """Remove `name` from known_hosts: to the workstation, an unknown key."""
        self.container(name)
        self._forgotten = self._forgotten | {name}
        self._write_known_hosts()

    def trust_current_key(self, name: str) -> None:
        """Write `name`'s current key to known_hosts again (repairs rotate/forget)."""
        self.container(name)
        self._forgotten = self._forgotten - {name}
        self._write_known_hosts()

    def known_hosts_line(self, name: str, *, port: int | None = None,
                         key_type: str | None = None) -> str:
        """`name`'s current host key (the first type, or `key_type`) as a known_hosts line,
        for its port or another one (a test proxy in front of it)."""
        container = self.container(name)
        server = self._servers[name]
        key = server.public_key_of(key_type) if key_type else server.host_public_key
        return f"[{container.address}]:{port or container.port} {key}"

    def host_ca_line(self, pattern: str = "*") -> str:
        """The sandbox CA as an `@cert-authority` known_hosts line for hosts matching
        `pattern` (needs `host_ca=True`)."""
        if not self.use_host_ca:
            raise SandboxError("this sandbox has no host CA: create it with host_ca=True")
        public = self.host_ca_key.with_name(self.host_ca_key.name + ".pub").read_text().split()[:2]
        return f"@cert-authority {pattern} {' '.join(public)}"

    def stall_sftp(self, name: str, seconds: float) -> None:
        """`name` logs in and runs commands as usual, but its SFTP server says nothing for
        `seconds` (0 repairs it); its sshd restarts on the same address and port."""
        self.container(name)
        self._servers[name].stall_sftp(seconds)

    def sshd_log(self, name: str) -> str:
        """`name`'s sshd log so far (LogLevel VERBOSE: logins and auth attempts)."""
        self.container(name)
        return self._servers[name].log_text()

    def sftp_log(self, name: str) -> str:
        """What `name`'s SFTP server logged (Sandbox(sftp_log=True)): one `open` and one
        `close "PATH" bytes read N written M` line per file it served."""
        self.container(name)
        log = self._servers[name].sftp_log
        if log is None:
            raise ValueError("start the Sandbox with sftp_log=True")
        return log.read_text(errors="replace")

    def sshd_pid(self, name: str) -> int | None:
        """PID of `name`'s listening sshd (None while stopped): to trace or watch it."""
        self.container(name)
        proc = self._servers[name].proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _replace(self, container: Container, **changes: Any) -> None:
        updated = dataclasses.replace(container, **changes)
        self.containers = [updated if c.name == container.name else c for c in self.containers]
        if updated.port != container.port:
            self._write_client_files()

    def describe(self) -> str:
        """A short human summary (never the key)."""
        entries = [SECRET_USERNAME] + ([MANAGEMENT_USERNAME] if self.management_key else [])
        lines = [f"sandbox root: {self.root}",
                 f"keyring: {self.keyring_backend} (service {SECRET_SERVICE_NAME!r}, "
                 f"usernames {', '.join(repr(e) for e in entries)})",
                 f"fake OpenRouter: {self.api_url if self.api else 'off'}",
                 f"container python: {self.python}"]
        for c in self.containers:
            lines.append(f"  {c.name}: {c.user}@{c.address}:{c.port}  {c.host_key_fingerprint}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

