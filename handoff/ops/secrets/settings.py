"""Which key a host gets: its `key_mode`, `key_limit` and `key_ttl_hours` checked
(`key_settings`), and the keyring entries the hosts' modes need (`read_credentials`).

`plain` places the API key itself, `minted` a child key minted for that host through the
management API (handoff.ops.keyapi) with `limit` = `key_limit` and `expires_at` = now +
`key_ttl_hours`, `auto` (the default) minted when a management key is stored, else plain.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from handoff.config import flags, state
from handoff.config.os_keyring import read_key, read_optional
from handoff.defaults import (
    BUILTIN_VARS,
    KEY_MODES,
    MANAGEMENT_KEY_USERNAME,
    SECRET_SERVICE,
)
from handoff.errors import (
    KeyAPIUnreachable,
    ManagementKeyMissing,
    RemoteError,
    UsageError,
)
from handoff.host import keyrecord, untrusted
from handoff.host.targets import Target
from handoff.ops import keyapi
from handoff.threads import soon


def keyring_entry(targets: list[Target], required: bool) -> tuple[str, str] | None:
    """The keyring (service, username) for the targets whose role takes the key; None when
    none does (extractor-only)."""
    services = {(str(t.vars["secret_service"]), str(t.vars["secret_username"])) for t in targets
                if takes_key(t)}
    if not services:
        if required:
            raise UsageError("none of these hosts' roles takes the API key (role `secret:` is none)")
        return None
    if len(services) > 1:
        raise UsageError(f"these hosts use different keyring entries {sorted(services)}; deploy them separately")
    return services.pop()


def takes_key(target: Target) -> bool:
    return target.role is None or target.role.secret


@dataclass(frozen=True)
class KeySettings:
    """A host's `key_mode`, `key_limit` and `key_ttl_hours`, checked."""

    mode: str  # plain | minted | auto
    limit: float | None  # USD
    ttl_hours: float


def key_settings(target: Target) -> KeySettings:
    """The host's key vars, or a UsageError (exit 2) naming the var and the fix, before any
    host is touched."""
    v, label = target.vars, target.label
    mode = str(v.get("key_mode") or BUILTIN_VARS["key_mode"]).strip().lower()
    if mode not in KEY_MODES:
        raise UsageError(f"{label}: key_mode {v.get('key_mode')!r} is not one of "
                         f"{', '.join(KEY_MODES)} (an inventory var)")

    def number(name: str) -> float | None:  # by the var's one rule (handoff.config.flags)
        value = flags.var(name, v.get(name, BUILTIN_VARS[name]), where=label)
        return None if value is None else float(value)

    limit = number("key_limit")
    ttl = number("key_ttl_hours")
    if ttl is None:
        raise UsageError(f"{label}: var key_ttl_hours: expected a number > 0, got None")
    if mode == "minted" and limit is None:
        raise UsageError(f"{label}: key_mode minted needs key_limit, the USD its child key may "
                         f"spend: e.g. `key_limit: 5` under the inventory's defaults or the "
                         f"host's vars")
    return KeySettings(mode, limit, ttl)


def for_hosts(targets: list[Target]) -> dict[str, KeySettings]:
    """Each key-taking target's settings by label, checked once for the whole command (a
    UsageError first, before any host is touched); the plan's place-key steps reuse them."""
    return {t.label: key_settings(t) for t in targets if takes_key(t)}


def key_modes(targets: list[Target] | dict[str, KeySettings]) -> set[str]:
    """The `key_mode`s of the targets that take a key (or of settings already checked)."""
    chosen = targets if isinstance(targets, dict) else for_hosts(targets)
    return {s.mode for s in chosen.values()}


@dataclass(frozen=True)
class Credentials:
    """What the keyring gave for a deploy: the API key (plain hosts) and the management key
    (minted hosts); either may be None when no host needs it."""

    api_key: str | None = field(default=None, repr=False)
    management_key: str | None = field(default=None, repr=False)
    service: str = SECRET_SERVICE

    def mode_for(self, settings: KeySettings) -> str:
        """`plain` or `minted` for a host: auto means minted when a management key is stored."""
        if settings.mode == "auto":
            return "minted" if self.management_key else "plain"
        return settings.mode

    def client(self, api: str, why: str = "mint child keys (key_mode minted)") -> keyapi.Client:
        if not self.management_key:
            raise ManagementKeyMissing(self.service, MANAGEMENT_KEY_USERNAME, why)
        return keyapi.Client(api, self.management_key, f"{self.service}/{MANAGEMENT_KEY_USERNAME}")


# The key material a plan carries for its hosts: Credentials (or a bare API key: plain
# everywhere), or the Credentials still on their way from the keyring (a Future, see
# read_credentials_soon); None: no key.
KeyHandle = Credentials | str | Future[Credentials] | None


def read_credentials(service: str, username: str, modes: Iterable[str]) -> Credentials:
    """The keyring entries the hosts' `key_mode`s need: the management key for minted/auto
    (required for minted), the API key for plain (and auto without a management key)."""
    wanted = set(modes)
    management = None
    if wanted & {"minted", "auto"}:
        management = read_optional(service, MANAGEMENT_KEY_USERNAME)
        if management is None and "minted" in wanted:
            raise ManagementKeyMissing(service, MANAGEMENT_KEY_USERNAME)
    api_key = None
    if "plain" in wanted or ("auto" in wanted and management is None):
        api_key = read_key(service, username)
    return Credentials(api_key, management, service)


def read_credentials_soon(service: str, username: str, modes: Iterable[str]) -> Future[Credentials]:
    """`read_credentials` on a thread (handoff.threads.soon; see read_key_soon)."""
    wanted = set(modes)
    return soon(lambda: read_credentials(service, username, wanted), "keyring-read")


def as_credentials(value: Any) -> Credentials:
    """A plan's private "key": Credentials, or a bare API key string (plain everywhere)."""
    if isinstance(value, Credentials):
        return value
    if isinstance(value, str) and value:
        return Credentials(api_key=value)
    raise RuntimeError("the plan carries no key")


class ManagementKeys:
    """The management key per keyring service, read at most once per command and only when
    a child key is to be looked at: status, launch and cleanup call this lazily."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: dict[str, Credentials] = {}

    def credentials(self, service: str) -> Credentials:
        with self._lock:
            if service not in self._read:
                self._read[service] = Credentials(
                    None, read_optional(service, MANAGEMENT_KEY_USERNAME), service)
            return self._read[service]

    def client(self, api: str, service: str = SECRET_SERVICE,
               why: str = "manage child keys") -> keyapi.Client:
        """A management client for `api`; ManagementKeyMissing (saying `why`) when none is
        stored."""
        return self.credentials(service or SECRET_SERVICE).client(api, why)

    def for_host(self, target: Target, why: str) -> keyapi.Client:
        """The management client for `target`: the API and keyring service the workstation
        configured for it (management_api), never what the host's record says."""
        return self.client(management_api(target),
                           str(target.vars.get("secret_service") or SECRET_SERVICE), why)

    def child_key(self, target: Target, key_hash: str,
                  why: str) -> tuple[keyapi.Client, keyapi.ChildKey | None]:
        """(client, what the API says about `key_hash`) for a hash a host's record names:
        None when revoked; a RemoteError when the key is not one handoff minted for this
        host (see vouch)."""
        client = self.for_host(target, why)
        return client, vouch(client, target, key_hash)

    def lookup(self, target: Target, record: keyrecord.KeyRecord) -> keyapi.ChildKey | None:
        """What the API says about the child key a host's record names (None: revoked)."""
        return self.child_key(target, record.hash, "read the child keys' usage")[1]


# --- where the management key may go, and which child keys are a host's ---------------------


def management_api(target: Target) -> str:
    """The only URL the management key goes to for `target`: the inventory's management API
    (handoff.config.inventory.management_api: `management_api` in its defaults, else its
    defaults' `base_url`, else OpenRouter's), computed once when the target was resolved.
    Never the host's own vars, never a flag, never a URL a host names. For a host known
    only from the ledger (no inventory read): the API the ledger recorded when this
    workstation minted its key; never the built-in default."""
    if target.management_api:
        return target.management_api.rstrip("/")
    ep = target.endpoint
    recorded = [e.api for e in state.ledger_events() if e.api and e.event == "minted"
                and (e.hostname, e.port, e.user) == (ep.hostname, ep.port, ep.user)]
    if recorded:
        return recorded[-1].rstrip("/")
    raise KeyAPIUnreachable(
        f"{target.label}: no management API is known for this host: the inventory does not "
        f"name it and the ledger recorded none when its key was minted, so the management key "
        f"is not sent anywhere (never to the built-in default). Add the host to the inventory, "
        f"then rerun")


def api_mismatch(target: Target, base_url: str | None = None) -> str | None:
    """Why `target` may not get a minted key: its `base_url` (the API its jobs call) is not
    the management API, so a key minted there would be sent elsewhere and the management
    key would have to follow it. None when they match."""
    api = management_api(target)
    used = str(base_url if base_url is not None else target.vars.get("base_url") or "").rstrip("/")
    if used == api:
        return None
    return (f"{target.label}: its base_url {used or '(none)'} is not the management API {api}, "
            f"so no child key is minted for it (the management key goes only to {api}). Either "
            f"give it a plain key (`key_mode: plain` in its vars: your API key is placed), or "
            f"make its base_url {api} (or name its API as `management_api` in the inventory's "
            f"defaults, if that API mints its keys)")


def names_host(name: str, target: Target) -> bool:
    """Whether a child key's name at the API is one handoff gave a key of this host, by any
    workstation and for any job (`handoff:<ws>:<host>[:<job>]`, keyapi.child_name; or the
    older `handoff <host> ...` form)."""
    parsed = keyapi.ChildName.parse(name)
    if parsed is None or parsed.host != target.label:
        return False
    ep = target.endpoint
    return parsed.endpoint in (None, f"{ep.user}@{ep.hostname}:{ep.port}")


def minted_for(target: Target, key_hash: str) -> bool:
    """Whether this workstation's ledger minted `key_hash` for this host."""
    ep = target.endpoint
    return any(e.key_hash == key_hash and e.event == "minted"
               and (e.hostname, e.port, e.user) == (ep.hostname, ep.port, ep.user)
               for e in state.ledger_events())


def vouch(client: keyapi.Client, target: Target, key_hash: str) -> keyapi.ChildKey | None:
    """What the API (the workstation's own URL) says about a hash a host's record names,
    if that key is this host's: the ledger minted it for the host, or the API lists it
    under the name handoff gives this host's keys. None: revoked or gone. A record is the
    host's word: naming another key (another host's, the account's) is refused."""
    info = client.get(key_hash)
    if info is None or minted_for(target, key_hash) or names_host(info.name, target):
        return info
    raise RemoteError(
        f"{target.label}: the key record on the host names child key {key_hash[:12]}, which "
        f"handoff did not mint for this host (not in the ledger; its name at the API is "
        f"{untrusted.visible(info.name, 120)!r}); it is not used, changed or revoked. `fab "
        f"push-key --host {target.label}` mints the host its own key")


__all__ = ["Credentials", "KeySettings", "ManagementKeys", "api_mismatch", "as_credentials", "key_modes",
           "key_settings", "keyring_entry", "management_api", "minted_for", "names_host", "read_credentials",
           "read_credentials_soon", "takes_key", "vouch"]
