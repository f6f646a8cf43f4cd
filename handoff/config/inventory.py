"""The inventory: which hosts exist, how to reach them, and their vars.

`$HANDOFF_INVENTORY`, default `inventory/hosts.yml` in the project directory
(handoff.config.paths). Validated on load: every
error names the file and line, an unknown host or role lists the known ones.
Var precedence (lowest first): built-in defaults < inventory `defaults` < role
vars < group vars < host vars < task flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handoff.config import flags
from handoff.config.layout import RemoteLayout
from handoff.config.paths import inventory_path
from handoff.config.roles import Role, get_role, known_roles, var_names
from handoff.config.yamlfile import YamlError, line_of, load
from handoff.defaults import BUILTIN_VARS
from handoff.errors import InventoryError, RoleError, UsageError, did_you_mean

__all__ = ["BUILTIN_VARS", "Group", "Host", "Inventory", "check_role_name", "inventory_path",
           "load_inventory", "management_api"]

_TOP_KEYS = {"defaults", "hosts", "groups"}
_HOST_KEYS = {"address", "port", "user", "identity", "roles", "vars"}
_GROUP_KEYS = {"hosts", "vars"}


@dataclass(frozen=True)
class Host:
    name: str
    address: str  # IP, DNS name or ssh_config alias
    port: int | None = None
    user: str | None = None
    identity: str | None = None
    roles: tuple[str, ...] = ()
    vars: dict[str, Any] = field(default_factory=dict)
    line: int | None = None


@dataclass(frozen=True)
class Group:
    name: str
    hosts: tuple[str, ...]
    vars: dict[str, Any]


@dataclass
class Inventory:
    path: Path
    defaults: dict[str, Any] = field(default_factory=dict)
    hosts: dict[str, Host] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)

    @property
    def management_api(self) -> str:
        """Where the management key goes: see `management_api`."""
        return management_api(self.defaults)

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            known = ", ".join(self.hosts) or "none"
            raise InventoryError(
                f"unknown host {name!r} in {self.path}; known hosts: {known}"
            ) from None

    def find_address(self, address: str, port: int | None, user: str | None) -> Host | None:
        """The inventory host reached at address[:port] (so `--host IP` gets its vars)."""
        for host in self.hosts.values():
            if host.address != address:
                continue
            if port is not None and host.port not in (None, port):
                continue
            if user is not None and host.user not in (None, user):
                continue
            return host
        return None

    def hosts_for_role(self, role: str | None) -> list[Host]:
        if role is None:
            return list(self.hosts.values())
        return [h for h in self.hosts.values() if role in h.roles]

    def vars_for(
        self, host: Host | None, role: Role | None, flags: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Merged vars, in the documented precedence order (docs/configuration.md; later wins)."""
        merged: dict[str, Any] = dict(BUILTIN_VARS)
        merged.update(self.defaults)
        if role is not None:
            merged.update(role.vars)
        if host is not None:
            for group in self.groups.values():
                if host.name in group.hosts:
                    merged.update(group.vars)
            merged.update(host.vars)
        for key, value in (flags or {}).items():
            if value is not None:
                merged[key] = value
        if not merged.get("key_path"):
            merged["key_path"] = RemoteLayout.of(merged).key_path
        return merged


def management_api(defaults: dict[str, Any]) -> str:
    """The only URL the management key is ever sent to: `management_api` in the inventory's
    defaults, else the `base_url` of its defaults, else OpenRouter's `/api/v1`. One URL for
    the whole inventory, chosen by the inventory alone: never a host's or a group's vars,
    never a task flag (`--base-url`), never a URL a host names (a key record, a ledger
    field copied from a host). A host whose `base_url` is another gets no minted key."""
    for name in ("management_api", "base_url"):
        value = defaults.get(name)
        if value:
            return str(value).rstrip("/")
    return str(BUILTIN_VARS["base_url"]).rstrip("/")


def _err(path: Path, node: Any, key: Any, message: str) -> InventoryError:
    line = line_of(node, key)
    return InventoryError(f"{path}:{line}: {message}" if line else f"{path}: {message}")


# Standard vars with a type: checked when the inventory loads, so `concurrency: lots` stops
# the command with file:line before any host is contacted (not as a usage error from the
# payload on the host, after the launch). Other vars are free-form. The numbers' rules are
# handoff.config.flags.VARS.
_NUMBERS = ("concurrency", "max_tokens", "gpus", "max_cost", "io_timeout", "start_watch_s")
_STRINGS = ("python", "remote_dir", "key_path", "secret_service", "secret_username", "base_url",
            "model", "job", "input", "management_api")
# Vars only the inventory's `defaults` may set: one for the whole inventory.
_DEFAULTS_ONLY = ("management_api",)
_CHOICES: dict[str, tuple[str, ...]] = {}
# key_mode, key_limit and key_ttl_hours are checked together by
# handoff.ops.secrets.settings.key_settings (they depend on each other; the numbers by the
# rules of handoff.config.flags.VARS), also before any host is contacted.


def check_var(name: str, value: Any, where: str) -> Any:
    """A standard var's value, checked (numbers converted); raises InventoryError naming
    `where` (file:line) and what the var expects."""
    if value is None:
        return None
    if name in _NUMBERS:
        try:
            return flags.var(name, value, where=where)
        except UsageError as exc:
            raise InventoryError(str(exc)) from None
    if name in _STRINGS and (not isinstance(value, (str, int, float)) or isinstance(value, bool)
                             or str(value).strip() == ""):
        raise InventoryError(f"{where}: var {name}: expected a non-empty string, got {value!r}")
    if name in _CHOICES and value not in _CHOICES[name]:
        raise InventoryError(f"{where}: var {name}: expected one of "
                             f"{', '.join(_CHOICES[name])}, got {value!r}")
    return value


def known_vars(roles: list[str]) -> set[str]:
    """The var names an inventory may set: the built-in and standard ones, and every var
    the given roles define or read. Anything else is a typo (`concurency: 8` would
    otherwise be ignored in silence while the launch runs with the default)."""
    names = set(BUILTIN_VARS) | set(_NUMBERS) | set(_STRINGS)
    for name in roles:
        try:
            names |= var_names(get_role(name))
        except RoleError:
            continue  # a broken role file is reported where it is used, with its own line
    return names


def _vars(path: Path, node: Any, key: str, known: set[str] | None = None) -> dict[str, Any]:
    value = node.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _err(path, node, key, f"{key} must be a mapping of var: value")
    checked = {}
    for name, item in value.items():
        line = line_of(value, name)
        where = f"{path}:{line}" if line else str(path)
        if known is not None and str(name) not in known:
            raise InventoryError(f"{where}: unknown var {name!r}{did_you_mean(str(name), known)} "
                                 f"(known: {', '.join(sorted(known))}; a role's vars are the "
                                 f"`{{var}}`s its file uses)")
        if key != "defaults" and str(name) in _DEFAULTS_ONLY:
            raise InventoryError(f"{where}: var {name} belongs under the inventory's `defaults:` "
                                 f"(one management API for the whole inventory: the management "
                                 f"key never goes to a URL one host's vars name)")
        checked[name] = check_var(str(name), item, where)
    return checked


def load_inventory(path: Path | None = None, roles: list[str] | None = None) -> Inventory:
    """Load and validate; `roles` are the valid role names (default: the roles/ dir)."""
    path = path or inventory_path()
    if not path.exists():
        raise InventoryError(
            f"inventory {path} does not exist; create it (see inventory/hosts.yml for the "
            f"format) or point HANDOFF_INVENTORY at one"
        )
    try:
        data = load(path)
    except YamlError as exc:
        raise InventoryError(str(exc)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InventoryError(f"{path}:1: the inventory must be a mapping with `hosts:`")
    for key in data:
        if key not in _TOP_KEYS:
            raise _err(path, data, key, f"unknown section {key!r}{did_you_mean(str(key), _TOP_KEYS)} (known: defaults, hosts, groups)")
    valid_roles = roles if roles is not None else known_roles()
    known = known_vars(valid_roles)
    inv = Inventory(path=path, defaults=_vars(path, data, "defaults", known))

    hosts = data.get("hosts") or {}
    if not isinstance(hosts, dict):
        raise _err(path, data, "hosts", "hosts must be a mapping of name: {address, ...}")
    for name, spec in hosts.items():
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            raise _err(path, hosts, name, f"host {name!r} must be a mapping (address, port, user, ...)")
        for key in spec:
            if key not in _HOST_KEYS:
                raise _err(path, spec, key, f"host {name!r}: unknown key {key!r}{did_you_mean(str(key), _HOST_KEYS)} (known: {', '.join(sorted(_HOST_KEYS))}; other settings go under vars:)")
        port = spec.get("port")
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
            raise _err(path, spec, "port", f"host {name!r}: port must be a number 1-65535, got {port!r}")
        host_roles = spec.get("roles") or []
        if isinstance(host_roles, str):
            host_roles = [host_roles]
        if not isinstance(host_roles, list):
            raise _err(path, spec, "roles", f"host {name!r}: roles must be a list")
        for role in host_roles:
            if role not in valid_roles:
                raise _err(path, spec, "roles", f"host {name!r}: unknown role {role!r}; known roles: {', '.join(valid_roles) or 'none'}{did_you_mean(str(role), valid_roles)}")
        for key in ("address", "user", "identity"):
            if key in spec and not isinstance(spec[key], (str, int)):
                raise _err(path, spec, key, f"host {name!r}: {key} must be a string")
        inv.hosts[str(name)] = Host(
            name=str(name),
            address=str(spec.get("address") or name),
            port=port,
            user=str(spec["user"]) if spec.get("user") is not None else None,
            identity=str(spec["identity"]) if spec.get("identity") else None,
            roles=tuple(str(r) for r in host_roles),
            vars=_vars(path, spec, "vars", known),
            line=line_of(hosts, name),
        )

    groups = data.get("groups") or {}
    if not isinstance(groups, dict):
        raise _err(path, data, "groups", "groups must be a mapping of name: {hosts, vars}")
    for name, spec in groups.items():
        if not isinstance(spec, dict):
            raise _err(path, groups, name, f"group {name!r} must be a mapping with hosts: and vars:")
        for key in spec:
            if key not in _GROUP_KEYS:
                raise _err(path, spec, key, f"group {name!r}: unknown key {key!r}{did_you_mean(str(key), _GROUP_KEYS)} (known: hosts, vars)")
        members = spec.get("hosts") or []
        if not isinstance(members, list):
            raise _err(path, spec, "hosts", f"group {name!r}: hosts must be a list")
        for member in members:
            if member not in inv.hosts:
                raise _err(path, spec, "hosts", f"group {name!r}: unknown host {member!r}; known hosts: {', '.join(inv.hosts) or 'none'}")
        inv.groups[str(name)] = Group(str(name), tuple(str(m) for m in members), _vars(path, spec, "vars", known))
    return inv


def check_role_name(name: str) -> None:
    known = known_roles()
    if name not in known:
        raise RoleError(f"unknown role {name!r}; known roles: {', '.join(known) or 'none'}")
