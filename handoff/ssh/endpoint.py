"""Where to connect and through what: an `Endpoint` (ssh_config merged with the inventory's
values) and its route, every hop of a ProxyJump chain in the order it is connected through.

Plain data and ssh_config lookups, no sockets: targets are resolved with these before any
connection is made (and without importing paramiko).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from handoff.errors import TargetError
from handoff.ssh import ssh_config

CONNECT_TIMEOUT = ssh_config.DEFAULT_CONNECT_TIMEOUT

MAX_HOPS = 10  # a ProxyJump chain longer than this is a loop in ssh_config


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to log in, after ssh_config and the inventory are merged."""

    hostname: str
    port: int
    user: str
    identity: tuple[str, ...] = ()
    known_hosts: tuple[str, ...] = ()  # UserKnownHostsFile (ssh's default when unset)
    global_known_hosts: tuple[str, ...] = ()
    proxy_jump: tuple[str, ...] = ()  # hops, in the order they are connected through
    proxy_command: str | None = None
    identities_only: bool = False
    identity_agent: str | None = None  # None: $SSH_AUTH_SOCK; "none": no agent
    host_key_alias: str | None = None
    connect_timeout: float = CONNECT_TIMEOUT
    name: str = ""  # what ssh_config was looked up for (an alias, an inventory address)

    def __str__(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def via(self) -> str:
        """How it is reached, for people: ` via a, b` / ` via ProxyCommand` / ``."""
        if self.proxy_jump:
            return " via " + ", ".join(self.proxy_jump)
        if self.proxy_command:
            return " via ProxyCommand"
        return ""

    def direct(self) -> Endpoint:
        """The same host with no proxy of its own (a hop after the first of a chain)."""
        return replace(self, proxy_jump=(), proxy_command=None)


def endpoint(address: str, port: int | None = None, user: str | None = None,
             identity: str | None = None) -> Endpoint:
    """ssh's settings for `address`, the inventory's values given as ssh's command-line
    options (`-p`, `-l`, `-i`) so that they override ssh_config as they would for ssh."""
    return from_config(ssh_config.lookup(address, port, user, identity))


def from_config(cfg: ssh_config.HostConfig) -> Endpoint:
    return Endpoint(
        hostname=cfg.hostname, port=cfg.port, user=cfg.user, identity=cfg.identity_files,
        known_hosts=cfg.user_known_hosts, global_known_hosts=cfg.global_known_hosts,
        proxy_jump=cfg.proxy_jump, proxy_command=cfg.proxy_command,
        identities_only=cfg.identities_only, identity_agent=cfg.identity_agent,
        host_key_alias=cfg.host_key_alias, connect_timeout=cfg.connect_timeout, name=cfg.name,
    )


def is_alias(name: str) -> bool:
    return ssh_config.is_alias(name)


def parse_spec(spec: str) -> tuple[str | None, str, int | None]:
    """`[user@]address[:port]` (IPv6 as `[addr]:port`; also ssh's `ssh://` form, as a
    ProxyJump entry may be written) -> (user, address, port)."""
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):].rstrip("/")
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


@dataclass(frozen=True)
class Hop:
    """One host of a route, with what to call it in messages."""

    endpoint: Endpoint
    label: str  # "sbx-3" for the target, "bast (jump host for sbx-3)" for a hop
    spec: str  # the name it was given by (ProxyJump entry, alias, address)


def route(ep: Endpoint, label: str, depth: int = 0) -> list[Hop]:
    """The hosts to connect through, first to last, ending with `ep` itself. The first hop
    keeps its own ProxyJump/ProxyCommand (as `ssh -J a,b` does: `a` is reached as ssh reaches
    it); each later hop is reached through the one before it."""
    if depth > MAX_HOPS:
        raise TargetError(f"{label}: ProxyJump chain longer than {MAX_HOPS} hops (a loop in "
                          f"~/.ssh/config?)")
    if not ep.proxy_jump:
        return [Hop(ep, label, ep.name or ep.hostname)]
    hops: list[Hop] = []
    for i, spec in enumerate(ep.proxy_jump):
        try:
            user, address, port = parse_spec(spec)
        except ValueError:
            raise TargetError(f"{label}: ProxyJump entry {spec!r} is not [user@]host[:port]") from None
        hop_ep = endpoint(address, port, user)
        hop_label = f"{spec} (jump host for {label})"
        if i == 0:
            first = route(hop_ep, hop_label, depth + 1)
            hops.extend(first[:-1])
            hops.append(Hop(first[-1].endpoint, hop_label, spec))
        else:
            hops.append(Hop(hop_ep.direct(), hop_label, spec))
    hops.append(Hop(ep.direct(), label, ep.name or ep.hostname))
    return hops


__all__ = ["CONNECT_TIMEOUT", "MAX_HOPS", "Endpoint", "Hop", "endpoint", "from_config", "is_alias", "parse_spec", "route"]
