"""SSH connections: ssh_config honoured, host keys checked, failures explained.

Settings come from `$HOME/.ssh/config` as OpenSSH reads it (HostName, Port, User,
IdentityFile, UserKnownHostsFile, ProxyJump); a value the inventory sets overrides
it, as a command-line option would. Fabric's own ssh_config loading is switched off
(we pass it an empty SSHConfig) so there is exactly one place that decides.

Fabric's `Connection` hard-codes paramiko's AutoAddPolicy; `SafeConnection`
replaces it right after construction with a refusing policy and the trusted keys
(see hostkeys.py), for the target and for every ProxyJump hop.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import paramiko
from fabric import Config, Connection

from handoff import hostkeys
from handoff.errors import ChangedHostKey, ConnectError

CONNECT_TIMEOUT = 10.0
# Ciphers tried first: AES-GCM is an AEAD, so paramiko makes one C call per packet where
# aes-ctr + hmac-sha2-256 (its default) makes two; a 1 GB fetch took ~25% less CPU
# (BENCHMARKS.md, "Transfers"). paramiko has no chacha20-poly1305. Every other preference
# (key exchange, host key types, MACs) and the host key check are paramiko's as before.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to log in, after ssh_config and inventory are merged."""

    hostname: str
    port: int
    user: str
    identity: tuple[str, ...] = ()
    known_hosts: tuple[str, ...] = ()  # ssh_config UserKnownHostsFile entries
    proxyjump: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def ssh_config_path() -> str:
    return os.path.expanduser("~/.ssh/config")


@lru_cache(maxsize=4)
def _parse_ssh_config(path: str, mtime: float) -> paramiko.SSHConfig:
    return paramiko.SSHConfig.from_path(path)


def ssh_config() -> paramiko.SSHConfig:
    path = ssh_config_path()
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return paramiko.SSHConfig()
    return _parse_ssh_config(path, mtime)


def is_alias(name: str) -> bool:
    """True when ssh_config has a Host block that rewrites `name` (so it is an alias)."""
    looked = ssh_config().lookup(name)
    return looked.get("hostname", name) != name or any(
        k in looked for k in ("port", "user", "identityfile", "proxyjump")
    )


def endpoint(
    address: str,
    port: int | None = None,
    user: str | None = None,
    identity: str | None = None,
) -> Endpoint:
    """Merge ssh_config for `address` with explicit values (explicit wins)."""
    looked = ssh_config().lookup(address)
    files: list[str] = []
    for item in looked.get("userknownhostsfile", "").split():
        if item.lower() != "none":
            files.append(item)
    identities = [identity] if identity else list(looked.get("identityfile", []))
    return Endpoint(
        hostname=looked.get("hostname", address),
        port=port or int(looked.get("port", 22)),
        user=user or looked.get("user") or getpass.getuser(),
        identity=tuple(os.path.expanduser(i) for i in identities),
        known_hosts=tuple(files),
        proxyjump=looked.get("proxyjump"),
    )


def parse_spec(spec: str) -> tuple[str | None, str, int | None]:
    """`[user@]address[:port]` (IPv6 as `[addr]:port`) -> (user, address, port)."""
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    if spec.startswith("["):
        address, _, rest = spec[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif spec.count(":") == 1:
        address, port_s = spec.split(":")
        port = int(port_s)
    else:
        address = spec
    return user or None, address, port


class SafeConnection(Connection):
    """A Fabric Connection whose host key check refuses unknown and changed keys."""

    # Declared so it is a real attribute: Fabric's Connection stores any *unknown* attribute
    # set on it in its config (a DataProxy), i.e. shared with every other connection.
    label: str = ""

    def __init__(self, *args: Any, label: str, known_hosts: tuple[str, ...] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.label = label
        hostkeys.install(self.client, label, known_hosts)

    def open(self) -> Any:
        try:
            return super().open()
        except paramiko.BadHostKeyException as exc:
            raise ChangedHostKey(
                self.label, exc.hostname, hostkeys.fingerprint(exc.expected_key),
                hostkeys.fingerprint(exc.key),
            ) from None


def _fabric_config() -> Config:
    """A fresh Config per connection: Connection.__init__ writes into its config (e.g.
    `inline_ssh_env`), which re-merges it; one Config shared by the host threads made a
    concurrent reader see it half-merged ("No attribute or config key found for 'gateway'")."""
    # An explicit (empty) SSHConfig stops Fabric from loading ssh_config files on its
    # own; endpoint() already applied ~/.ssh/config with the inventory on top.
    return Config(ssh_config=paramiko.SSHConfig(), overrides={"run": {"in_stream": False}})


def transport(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """paramiko's Transport (SSHClient's transport_factory) with PREFERRED_CIPHERS first (a
    server without them negotiates the next cipher in paramiko's own order), on a socket
    with TCP_NODELAY: every round trip (a channel open, an SFTP stat) is a small write
    after another, which Nagle's algorithm holds until the server's delayed ACK, 40 ms on
    Linux; OpenSSH's own client sets it too. A ProxyJump hop's channel is not a socket."""
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    made = paramiko.Transport(sock, **kwargs)
    options = made.get_security_options()
    options.ciphers = PREFERRED_CIPHERS + tuple(c for c in options.ciphers if c not in PREFERRED_CIPHERS)
    return made


def connection(ep: Endpoint, label: str) -> SafeConnection:
    """A lazy connection (opened on first use); ProxyJump hops are checked the same way."""
    gateway = None
    if ep.proxyjump and ep.proxyjump.lower() != "none":
        hop = ep.proxyjump.split(",")[-1].strip()
        hop_user, hop_addr, hop_port = parse_spec(hop)
        gateway = connection(endpoint(hop_addr, hop_port, hop_user), f"{label} (via {hop})")
    connect_kwargs: dict[str, Any] = {
        "banner_timeout": CONNECT_TIMEOUT,
        "auth_timeout": CONNECT_TIMEOUT,
        "transport_factory": transport,
    }
    if ep.identity:
        connect_kwargs["key_filename"] = list(ep.identity)
    return SafeConnection(
        ep.hostname,
        user=ep.user,
        port=ep.port,
        config=_fabric_config(),
        gateway=gateway,
        connect_timeout=CONNECT_TIMEOUT,
        connect_kwargs=connect_kwargs,
        label=label,
        known_hosts=ep.known_hosts,
    )


def open_connection(ep: Endpoint, label: str) -> SafeConnection:
    """Connect now, turning every low-level failure into a ConnectError that says why."""
    conn = connection(ep, label)
    where = f"{label} ({ep})"
    try:
        conn.open()
    except ConnectError:
        raise
    except paramiko.AuthenticationException as exc:
        if "timeout" in str(exc).lower():
            # paramiko reports a slow server (overloaded host) with the same exception class
            # as a refused key; saying "refused" would send the user after the wrong fix.
            raise ConnectError(
                f"{where}: the login did not finish within {CONNECT_TIMEOUT:.0f} s (host "
                f"overloaded?); try again"
            ) from None
        keys = ", ".join(ep.identity) or "the default ~/.ssh/id_* keys and the agent"
        raise ConnectError(
            f"{where}: login refused for user {ep.user!r} with {keys}; check `user`/`identity` "
            f"in the inventory or User/IdentityFile in ~/.ssh/config"
        ) from None
    except paramiko.SSHException as exc:
        if "No authentication methods available" not in str(exc):
            raise ConnectError(f"{where}: SSH failed: {exc}") from None
        raise ConnectError(
            f"{where}: no key to log in with (no identity file found and no ssh-agent); set "
            f"`identity` in the inventory or IdentityFile in ~/.ssh/config"
        ) from None
    except paramiko.ssh_exception.NoValidConnectionsError:
        raise ConnectError(f"{where}: connection refused; is sshd running and is the port right?") from None
    except TimeoutError:
        raise ConnectError(f"{where}: no answer within {CONNECT_TIMEOUT:.0f} s (host down or firewalled?)") from None
    except socket.gaierror as exc:
        raise ConnectError(f"{where}: cannot resolve {ep.hostname!r} ({exc.strerror}); check the address or ssh_config HostName") from None
    except (OSError, EOFError) as exc:
        raise ConnectError(f"{where}: SSH failed: {exc or type(exc).__name__}") from None
    return conn
