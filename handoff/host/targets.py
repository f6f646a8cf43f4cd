"""Which hosts a task acts on.

`--host` (and Fabric's own `-H/--hosts`, which handoff.cli.program turns into it) takes
comma-separated inventory names, ssh_config aliases or `[user@]address[:port]`: exactly those
hosts, never others. Without it: the targets of the last successful `deploy` (state dir),
else the inventory's hosts for `--role` (all inventory hosts without one). The result says
which of the three it is (`Targets.why`), and every command prints it.
An address that matches an inventory host (`--host 10.1.230.174`) gets that
host's roles and vars.

ssh_config is asked once per name (handoff.ssh.ssh_config runs `ssh -G`), for all names at once.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from handoff import threads
from handoff.config import state
from handoff.config.inventory import Host, Inventory
from handoff.config.layout import RemoteLayout
from handoff.config.roles import Role, get_role, known_roles
from handoff.defaults import DEFAULT_ROLE
from handoff.errors import TargetError, did_you_mean
from handoff.ssh.endpoint import Endpoint, endpoint, is_alias, parse_spec


@dataclass
class Target:
    label: str  # what the user sees and what `--host` accepts back
    spec: str  # saved as the current target, re-resolved next time
    endpoint: Endpoint
    host: Host | None
    role: Role | None
    vars: dict[str, Any] = field(default_factory=dict)
    # The only URL the management key goes to for this host (the inventory's, from its
    # defaults: handoff.config.inventory.management_api); "" when unknown (a host known
    # only from the ledger, with no inventory to read).
    management_api: str = ""

    @property
    def layout(self) -> RemoteLayout:
        """The host's folders as configured (`~` not yet resolved: see Session.layout)."""
        return RemoteLayout.of(self.vars)

    def flags(self, job: str | None = None) -> str:
        """The flags that make another command act on this same thing (for hints): the
        host, the role when it is not the host's own first role, and the job if given."""
        parts = [f"--host {shlex.quote(self.label)}"]
        own = self.host.roles[0] if self.host is not None and self.host.roles else None
        if self.role is not None and self.role.name != (own or DEFAULT_ROLE):
            parts.append(f"--role {shlex.quote(self.role.name)}")
        if job:
            parts.append(f"--job {shlex.quote(job)}")
        return " ".join(parts)

    @property
    def safe_label(self) -> str:
        """The label as a directory name (fetch writes DIR/<host>/…)."""
        return folder_name(self.label)


def folder_name(label: str) -> str:
    """A host's label as the directory name fetch writes its copies under (DIR/<host>/…)."""
    return re.sub(r"[^A-Za-z0-9._@-]+", "_", label)


class Targets(list[Target]):
    """The hosts a command acts on, in order, and why these (for the line every command
    prints): `source` is "flag", "remembered" or "inventory"."""

    def __init__(self, targets: list[Target], source: str, why: str) -> None:
        super().__init__(targets)
        self.source = source
        self.why = why

    def describe(self) -> str:
        names = ", ".join(t.label for t in self)
        return f"hosts: {names} ({self.why})"


def _role_for(host: Host | None, role_flag: str | None, saved_role: str | None) -> Role | None:
    name = role_flag or (host.roles[0] if host and host.roles else None) or saved_role
    if name is None and DEFAULT_ROLE in known_roles():
        name = DEFAULT_ROLE
    return get_role(name) if name else None


def resolve_one(
    spec: str,
    inv: Inventory,
    role_flag: str | None = None,
    flags: dict[str, Any] | None = None,
    saved_role: str | None = None,
) -> Target:
    spec = spec.strip()
    if any(c.isspace() for c in spec):
        names = ",".join(spec.split())
        raise TargetError(f"--host {spec!r}: a host name has no spaces; separate several hosts "
                          f"with commas: --host {names}")
    host: Host | None = inv.hosts.get(spec)
    if host is not None:
        ep = endpoint(host.address, host.port, host.user, host.identity)
        label = host.name
    else:
        try:
            user, address, port = parse_spec(spec)
        except ValueError:
            raise TargetError(f"--host {spec!r}: expected NAME, ALIAS or [user@]address[:port]") from None
        host = inv.find_address(address, port, user)
        bare_name = "@" not in spec and ":" not in spec and "." not in spec
        if host is None and bare_name and not is_alias(spec):
            known = ", ".join(inv.hosts) or "none"
            # A name one or two letters off an inventory host (gen1): the fix is that name.
            close = did_you_mean(spec, inv.hosts)
            raise TargetError(
                f"unknown host {spec!r}: not in {inv.path} (known hosts: {known}) and not a "
                f"Host in ~/.ssh/config" + (close or "; use an address like user@10.0.0.5:22")
            )
        if host is not None:
            # The inventory knows this address: same host, same name, same vars.
            ep = endpoint(address, port or host.port, user or host.user, host.identity)
            label = spec = host.name
        else:
            ep = endpoint(address, port, user)
            label = spec
    role = _role_for(host, role_flag, saved_role)
    return Target(label, spec, ep, host, role, inv.vars_for(host, role, flags), inv.management_api)


def resolve(
    host_flag: str | None,
    inv: Inventory,
    role_flag: str | None = None,
    flags: dict[str, Any] | None = None,
) -> Targets:
    """The task's targets, in order, without duplicates, and why these."""
    # (name, the role it was remembered with: None for a name given now)
    specs: list[tuple[str, str | None]]
    if host_flag:
        specs = [(s, None) for s in host_flag.split(",") if s.strip()]
        if not specs:
            raise TargetError("--host/-H is empty: name at least one host")
        source, why = "flag", "named with --host/-H"
    else:
        saved = state.remembered()
        if role_flag:  # that role's last deploy (or an older handoff's, which named none)
            saved = {r: e for r, e in saved.items() if r in (role_flag, "")}
        specs = []
        for role, (hosts, _) in saved.items():
            specs += [(name, role or None) for name in hosts if name not in {n for n, _ in specs}]
        source, why = "remembered", _remembered_why(saved)
        if not specs:
            specs = [(h.name, None) for h in inv.hosts_for_role(role_flag)]
            role_note = f" with role {role_flag}" if role_flag else ""
            source, why = "inventory", f"the hosts{role_note} in {inv.path}; pass --host to choose"
    if not specs:
        what = f"with role {role_flag!r} " if role_flag else ""
        raise TargetError(
            f"no targets: pass --host HOST, or add hosts {what}to {inv.path}"
        )

    def one(spec: tuple[str, str | None]) -> Target:
        # A remembered host acts as the role it was deployed as (as --role would).
        return resolve_one(spec[0], inv, role_flag or spec[1], flags, spec[1])

    # Each name may cost a fork of `ssh -G`: resolve them side by side.
    if len(specs) > 1:
        resolved = threads.each(specs, one, workers=8, name="resolve")
    else:
        resolved = [one(specs[0])]
    targets: list[Target] = []
    seen: set[tuple[str, int, str]] = set()
    for t in resolved:
        key = (t.endpoint.hostname, t.endpoint.port, t.endpoint.user)
        if key not in seen:
            seen.add(key)
            targets.append(t)
    return Targets(targets, source, why)


def _remembered_why(saved: dict[str, tuple[list[str], float | None]]) -> str:
    """`remembered from the last successful deploy on DATE` (one role), or per role: `...
    deploys (extractor on DATE, generator on DATE)`."""
    def when(at: float | None) -> str:
        return time.strftime(" on %Y-%m-%d %H:%M", time.localtime(at)) if at else ""

    if len(saved) == 1:
        [(_, at)] = saved.values()
        return f"remembered from the last successful deploy{when(at)}; pass --host to choose others"
    each = ", ".join(f"{role or 'each host as its own role'}{when(at)}" for role, (_, at) in saved.items())
    return f"remembered from the last successful deploy of each role ({each}); pass --host to choose others"
