"""Which hosts a task acts on.

`--host` takes comma-separated inventory names, ssh_config aliases or
`[user@]address[:port]`. Without it: the targets of the last `deploy` (state dir),
else the inventory's hosts for `--role` (all inventory hosts without one).
An address that matches an inventory host (`--host 10.1.230.174`) gets that
host's roles and vars.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from handoff import state
from handoff.defaults import DEFAULT_ROLE
from handoff.errors import TargetError
from handoff.inventory import Host, Inventory
from handoff.layout import RemoteLayout
from handoff.roles import Role, get_role, known_roles
from handoff.ssh import Endpoint, endpoint, is_alias, parse_spec


@dataclass
class Target:
    label: str  # what the user sees and what `--host` accepts back
    spec: str  # saved as the current target, re-resolved next time
    endpoint: Endpoint
    host: Host | None
    role: Role | None
    vars: dict[str, Any] = field(default_factory=dict)

    @property
    def layout(self) -> RemoteLayout:
        """The host's folders as configured (`~` not yet resolved: see Session.layout)."""
        return RemoteLayout.of(self.vars)

    @property
    def safe_label(self) -> str:
        """The label as a directory name (fetch writes DIR/<host>/…)."""
        return re.sub(r"[^A-Za-z0-9._@-]+", "_", self.label)


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
            raise TargetError(
                f"unknown host {spec!r}: not in {inv.path} (known hosts: {known}) and "
                f"not a Host in ~/.ssh/config; use an address like user@10.0.0.5:22"
            )
        if host is not None:
            # The inventory knows this address: same host, same name, same vars.
            ep = endpoint(address, port or host.port, user or host.user, host.identity)
            label = spec = host.name
        else:
            ep = endpoint(address, port, user)
            label = spec
    role = _role_for(host, role_flag, saved_role)
    return Target(label, spec, ep, host, role, inv.vars_for(host, role, flags))


def resolve(
    host_flag: str | None,
    inv: Inventory,
    role_flag: str | None = None,
    flags: dict[str, Any] | None = None,
) -> list[Target]:
    """The task's targets, in order, without duplicates."""
    saved_role = None
    if host_flag:
        specs = [s for s in host_flag.split(",") if s.strip()]
    else:
        specs, saved_role = state.load_targets()
        if role_flag and specs and saved_role not in (None, role_flag):
            specs = []  # the last deploy was for another role: use the inventory's hosts
        if not specs:
            specs = [h.name for h in inv.hosts_for_role(role_flag)]
    if not specs:
        what = f"with role {role_flag!r} " if role_flag else ""
        raise TargetError(
            f"no targets: pass --host HOST, or add hosts {what}to {inv.path}"
        )
    targets: list[Target] = []
    seen: set[tuple[str, int, str]] = set()
    for spec in specs:
        t = resolve_one(spec, inv, role_flag, flags, saved_role)
        key = (t.endpoint.hostname, t.endpoint.port, t.endpoint.user)
        if key not in seen:
            seen.add(key)
            targets.append(t)
    return targets
