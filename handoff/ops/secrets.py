"""The key, from the keyring to the host and back out: read, minted, placed, removed, revoked.

This is the one home of the secret's life cycle:
- read from the OS keyring (`read_key`, `read_credentials[_soon]`), registered for
  redaction at once. Two entries matter: the API key (`openrouter/api-key`) and, optionally,
  a management key (`openrouter/management-key`) that never leaves the workstation;
- chosen per host by `key_mode` (`key_settings`): `plain` places the API key itself,
  `minted` a child key minted for that host through the management API (handoff.ops.keyapi)
  with `limit` = `key_limit` and `expires_at` = now + `key_ttl_hours`, `auto` (the default)
  minted when a management key is stored, else plain;
- placed on a host by deploy/push-key (`place_step`, `place`, `place_minted`), over SFTP,
  never through a command line or `env=`:
  1. the key's folder is created / forced to 0700;
  2. a temp name in that folder is created exclusively with mode 0600 given IN the create
     request itself, so the file is 0600 from the instant it exists;
  3. the key is written and fsync'ed;
  4. the temp name is renamed over the final path (POSIX rename);
  5. `stat` checks mode 0600 and owner = the login user; anything else is removed and
     reported.
  Idempotence is checked on the host: the probe returns the sha256 of the remote file,
  compared with the local key's sha256; the key itself never travels for that. A minted
  key is reused while it lives (the record beside it names its hash; the API says whether
  it is live), replaced when it expired, was revoked or expires within the hour, and the
  key it replaces is revoked. A minted key whose placement failed is revoked again;
  a create whose answer was lost is found by its unique name and deleted.
- removed by cleanup-secrets (`cleanup_entries`, `cleanup_plan`, `remove`): every key the
  ledger lists as placed, and the `key_path` of every inventory and remembered host (or of
  the hosts named with --host), temp leftovers included, then proven gone by a stat;
- revoked by cleanup-secrets (`revocations`, `revoke_all`): every child key the ledger
  lists as minted and every one a host's record names, `DELETE /keys/{hash}` then `GET`
  answering 404. An unreachable host's key is revoked all the same: its file may remain,
  dead.

The ledger (handoff.config.state) records host, path, time, the first 8 hex of sha256(key) and,
for a child key, its public hash and the API that minted it; never a key.
"""

from __future__ import annotations

import hashlib
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from handoff import console
from handoff.config import state
from handoff.config.layout import key_record, parents, sftp_path
from handoff.defaults import (
    API_KEY_USERNAME,
    BUILTIN_VARS,
    KEY_MODES,
    KEY_RENEW_BEFORE_S,
    MANAGEMENT_KEY_USERNAME,
    SECRET_SERVICE,
)
from handoff.errors import (
    HandoffError,
    KeyAPIError,
    KeyAPIFailed,
    KeyAPIUnreachable,
    KeyringEntryMissing,
    ManagementKeyMissing,
    NoKeyringBackend,
    RemoteError,
    UsageError,
)
from handoff.host import remote_code
from handoff.host.facts import KEY_FILE, KEY_RECORD, Facts
from handoff.host.session import Session
from handoff.host.targets import Target
from handoff.host.transfer import mkdirs, remove_leftovers, temp_prefix, upload_atomic
from handoff.ops import keyapi
from handoff.run.parallel import HostReport
from handoff.run.plan import HostContext, HostPlan, Plan, Skipped, Step
from handoff.ssh.connect import endpoint, is_alias
from payload.redact import REDACTOR


def _keyring() -> ModuleType:
    """The keyring module, without its macOS backend's import cost off macOS.

    keyring imports every backend to ask which is viable; the macOS one's `api` module
    calls ctypes.util.find_library at import, which spawns ldconfig/gcc on Linux (about
    0.1 s of every deploy) only for the backend to declare itself unusable there. A None
    in sys.modules makes that import fail at once, which the backend already handles
    ("Security API unavailable"); keyring then picks Secret Service / the file backend
    exactly as before.
    """
    if sys.platform != "darwin":
        sys.modules.setdefault("keyring.backends.macOS.api", None)  # type: ignore[arg-type]
    import keyring
    import keyring.errors

    return keyring


def read_optional(service: str, username: str) -> str | None:
    """A keyring entry, registered for redaction before anything else; None when absent."""
    keyring = _keyring()
    try:
        value = keyring.get_password(service, username)
    except keyring.errors.NoKeyringError as exc:
        raise NoKeyringBackend(service, username, str(exc).split(".")[0] or "none found") from None
    except keyring.errors.KeyringError as exc:
        raise NoKeyringBackend(service, username, f"{type(exc).__name__}: {exc}") from None
    if not value or not value.strip():
        return None
    key = value.strip()
    REDACTOR.add(key)
    return key


def read_key(service: str = SECRET_SERVICE, username: str = API_KEY_USERNAME) -> str:
    """The key from the OS keyring, registered for redaction before anything else."""
    key = read_optional(service, username)
    if key is None:
        raise KeyringEntryMissing(service, username)
    return key


def _soon(work: Callable[[], Any], name: str) -> Future[Any]:
    """`work()` on a thread: keyring's backend discovery and the Secret Service round trip
    (0.1-0.3 s) then overlap the SSH connections and probes, and only the first step that
    changes a host waits for it.

    A daemon thread rather than an executor: a keyring that hangs (a locked collection
    waiting for an unlock prompt) must not keep the process alive after Ctrl-C.
    """
    future: Future[Any] = Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # delivered to whoever waits on the future
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def read_key_soon(service: str = SECRET_SERVICE, username: str = API_KEY_USERNAME) -> Future[str]:
    """`read_key` on a thread (see `_soon`)."""
    return _soon(lambda: read_key(service, username), "keyring-read")


def store_key(key: str, service: str = SECRET_SERVICE, username: str = API_KEY_USERNAME) -> None:
    keyring = _keyring()
    REDACTOR.add(key)
    try:
        keyring.set_password(service, username, key)
    except keyring.errors.NoKeyringError as exc:
        raise NoKeyringBackend(service, username, str(exc).split(".")[0]) from None


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def fingerprint(key: str) -> str:
    """What the ledger and the output show: 8 hex of sha256, useless for recovering the key."""
    return sha256(key)[:8]


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


# --- which key a host gets ----------------------------------------------------------------------


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

    def number(name: str, default: Any) -> float | None:
        raw = v.get(name, default)
        if raw is None:
            return None
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise UsageError(f"{label}: {name} {raw!r} is not a number (an inventory var)") from None
        if isinstance(raw, bool) or value != value or value < 0:
            raise UsageError(f"{label}: {name} must be a number >= 0, got {raw!r}")
        return value

    limit = number("key_limit", None)
    ttl = number("key_ttl_hours", BUILTIN_VARS["key_ttl_hours"])
    if not ttl:
        raise UsageError(f"{label}: key_ttl_hours must be more than 0 (hours a minted key lives)")
    if mode == "minted" and limit is None:
        raise UsageError(f"{label}: key_mode minted needs key_limit, the USD its child key may "
                         f"spend: e.g. `key_limit: 5` under the inventory's defaults or the "
                         f"host's vars")
    return KeySettings(mode, limit, ttl)


def key_modes(targets: list[Target]) -> set[str]:
    """The `key_mode`s of the targets that take a key (each checked: a UsageError first)."""
    return {key_settings(t).mode for t in targets if takes_key(t)}


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
    """`read_credentials` on a thread (see `_soon`)."""
    wanted = set(modes)
    return _soon(lambda: read_credentials(service, username, wanted), "keyring-read")


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

    def lookup(self, record: keyapi.KeyRecord) -> keyapi.ChildKey | None:
        """What the API says about the child key a host's record names (None: revoked)."""
        return self.client(record.api, record.service,
                           "read the child keys' usage").get(record.hash)


# --- placement -----------------------------------------------------------------------------


def key_folders(target: Target) -> list[str]:
    """The folders placing the key may create (the probe reports which exist)."""
    return parents(str(target.vars["key_path"]).rsplit("/", 1)[0])


def place_step(target: Target, key: Any, unavailable: str | None = None) -> Step:
    """Place the host's key at its key_path, 0600 from birth: the plan's API key (plain) or
    a child key minted for this host (minted). `key` is the plan's private value (Credentials,
    an API key, or a Future of either) or None for a dry run whose key is `unavailable`."""
    path = str(target.vars["key_path"])
    folder, name = path.rsplit("/", 1)
    settings = key_settings(target)
    known = key if isinstance(key, (str, Credentials)) else None
    mode = as_credentials(known).mode_for(settings) if known is not None else settings.mode
    write = (f"sftp mkdir {folder} (0700); create {folder}/{temp_prefix(name)}* O_EXCL mode "
             f"0600; write; fsync; rename; stat")
    if mode == "minted":
        api = str(target.vars["base_url"]).rstrip("/")
        what = (f"mint a child key for {target.label} (limit {keyapi.money(settings.limit)}, "
                f"expires {settings.ttl_hours:g} h after minting) and place it at {path} (0600)")
        detail = (f"GET {api}/keys/<hash> (the live key named in {key_record(path)}); unless "
                  f"live: POST {api}/keys, then {write}; write {key_record(path)} (0600); "
                  f"DELETE the key it replaces")
        when = ("unless the host holds a live child key (reused; replaced when it expires "
                "within the hour)")
    else:
        fp = f" {fingerprint(as_credentials(known).api_key or '')}" if mode == "plain" and known else ""
        what = f"place API key{fp} at {path} (0600)"
        if mode == "auto":
            what = (f"place a key at {path} (0600): a child key minted for this host when a "
                    f"management key is stored, else the API key")
        detail, when = write, "unless the host already holds the same key (sha256 compared on the host)"
    if key is None:
        what += f"; NOTE: {unavailable}"
    return Step("place-key", what, detail, when, {"settings": settings}, run=_place_key)


def _place_key(ctx: HostContext, step: Step) -> str:
    creds = as_credentials(ctx.private("key"))
    settings: KeySettings = step.params["settings"]
    s, facts = ctx.session, ctx.need_facts()
    if creds.mode_for(settings) == "minted":
        return place_minted(s, facts, creds, settings)
    if not creds.api_key:
        raise RuntimeError("the plan carries no API key for a plain host")
    return place(s, facts, creds.api_key)


def ledger_entry(session: Session, path: str, fp: str, event: str, **child: str) -> state.LedgerEntry:
    ep = session.target.endpoint
    return state.LedgerEntry(
        host=session.label, hostname=ep.hostname, port=ep.port, user=ep.user,
        identity=list(ep.identity), path=path, fingerprint=fp, time=time.time(), event=event,
        **child,
    )


def _in_ledger(entry: state.LedgerEntry) -> bool:
    return any(e.slot == entry.slot and e.fingerprint == entry.fingerprint for e in state.placed())


def place(session: Session, facts: Facts, key: str, *, child: dict[str, str] | None = None) -> str:
    """Place `key` at the host's key_path unless the same key is already there. `child` (a
    minted key's hash, api, service, name) goes into the ledger's entry. Placing the API
    key over a minted one also removes the record that named the minted key."""
    path = session.abs(str(session.vars["key_path"]))
    fp = fingerprint(key)
    remote = facts.file(KEY_FILE)
    entry = ledger_entry(session, path, fp, "placed", **(child or {}))
    stale = child is None and facts.file(KEY_RECORD).exists
    if remote.exists and remote.sha256 == sha256(key) and remote.mode == 0o600 and remote.uid == facts.uid:
        if stale:
            _remove_quietly(session, key_record(path))
        if not _in_ledger(entry):
            state.record(entry)
        return Skipped(f"key {fp} already at {path} (0600), nothing written")
    folder = path.rsplit("/", 1)[0]
    files = session.files
    try:
        mkdirs(files, folder, 0o700, known=facts.dirs)
        files.chmod(folder, 0o700)  # also when it existed: the folder is private either way
        upload_atomic(files, key.encode("utf-8"), path, 0o600, durable=True)
        st = files.stat(path)
    except OSError as exc:
        raise RemoteError(f"{session.label}: placing the key at {path} failed: {exc}") from None
    mode = stat.S_IMODE(st.mode)
    if mode != 0o600 or st.uid != facts.uid:
        _remove_quietly(session, path)
        raise RemoteError(
            f"{session.label}: {path} came out with mode {mode:o} owner uid {st.uid} "
            f"(want 600, uid {facts.uid}); removed it. Check the folder's ACLs / filesystem."
        )
    state.record(entry)
    if stale:
        # The file no longer holds the minted key its record named: the ledger still lists
        # that child key as minted, so `cleanup-secrets` revokes it.
        _remove_quietly(session, key_record(path))
    return f"placed key {fp} at {path} (0600, uid {st.uid})"


def _remove_quietly(session: Session, path: str) -> None:
    try:
        session.files.remove(path)
    except OSError:
        pass


def _child_fields(minted: keyapi.ChildKey, api: str, service: str) -> dict[str, str]:
    return {"key_hash": minted.hash, "api": api, "service": service, "name": minted.name}


def place_minted(session: Session, facts: Facts, creds: Credentials, settings: KeySettings) -> str:
    """The host's child key: reuse the live one its record names, else mint one, place it
    and its record, and revoke the key it replaces. Nothing half-done: a key minted here
    whose placement fails is revoked before the error is raised."""
    target = session.target
    api = str(session.vars["base_url"]).rstrip("/")
    client = creds.client(api)
    path = session.abs(str(session.vars["key_path"]))
    record_path = key_record(path)
    remote, on_host = facts.file(KEY_FILE), facts.file(KEY_RECORD)
    record = keyapi.read_record(session, record_path, on_host.size) if on_host.exists else None
    replaced: keyapi.KeyRecord | None = record
    why = "the host holds no minted key"
    if record is not None:
        # The file beside the record is the key the record names, still private.
        intact = bool(remote.exists and remote.sha256 and record.fingerprint
                      and remote.sha256.startswith(record.fingerprint)
                      and remote.mode == 0o600 and remote.uid == facts.uid)
        info = client.at(record.api).get(record.hash) if intact else None
        if info is not None and info.live(margin_s=KEY_RENEW_BEFORE_S):
            _remember(session, path, record, info)
            return Skipped(f"child key {record.hash[:12]} at {path} is live ({info.describe()}): "
                           f"reused, nothing minted")
        why = ("the key file does not match its record" if not intact
               else f"its child key {record.hash[:12]} was revoked" if info is None
               else f"its child key {record.hash[:12]} is disabled" if info.disabled
               else f"its child key {record.hash[:12]} expires {keyapi.until(info.expires_at)}")
    ep = target.endpoint
    name = keyapi.child_name(target.label, target.role.name if target.role else None,
                             str(session.vars.get("job") or "") or None,
                             f"{ep.user}@{ep.hostname}:{ep.port}")
    minted = _mint(client, name, settings)
    child = _child_fields(minted.info, api, creds.service)
    state.record(ledger_entry(session, path, fingerprint(minted.key), "minted", **child))
    try:
        placed = place(session, facts, minted.key, child=child)
        keyapi.write_record(session, record_path, keyapi.KeyRecord(
            minted.info.hash, minted.info.name, api, creds.service, fingerprint(minted.key),
            keyapi.utc_iso(minted.info.expires_at) if minted.info.expires_at else None,
            minted.info.limit, time.time()))
    except BaseException as exc:
        undone = _undo_mint(session, client, minted, path, child)
        if isinstance(exc, HandoffError | OSError):
            detail = str(exc).removeprefix(f"{session.label}: ")
            raise RemoteError(f"{session.label}: placing the minted key failed ({detail}); "
                              f"{undone}") from None
        raise
    note = ("; NOTE: no key_limit is set, so this key is uncapped until `fab launch "
            "--max-cost` limits it" if settings.limit is None else "")
    if replaced is not None and replaced.hash != minted.info.hash:
        note += "; " + _revoke_replaced(session, client, replaced)
    return (f"minted child key {minted.info.hash[:12]} ({minted.info.describe()}; {why}) and "
            f"{placed.replace('placed key', 'placed it as key', 1)}{note}")


def _mint(client: keyapi.Client, name: str, settings: KeySettings) -> keyapi.Minted:
    """POST /keys; when the answer is lost (no answer, a 5xx), the key may exist all the
    same: look for it by its unique name and delete it, so a failed deploy leaves no live
    orphan, then report the failure."""
    try:
        return client.create(name, settings.limit, keyapi.expiry(settings.ttl_hours))
    except (KeyAPIUnreachable, KeyAPIFailed) as exc:
        try:
            strays = client.find(name)
            for stray in strays:
                client.revoke(stray.hash)
        except KeyAPIError as again:
            raise KeyAPIFailed(f"{exc} Whether a key was created anyway could not be checked "
                               f"({again}): look for a key named {name!r} in OpenRouter's key "
                               f"list and delete it.", status=exc.status) from None
        done = (f"a key created anyway ({len(strays)}) was found by name and revoked"
                if strays else "no key was created (checked by name)")
        raise type(exc)(f"{exc} ({done})", status=exc.status) from None


def _undo_mint(session: Session, client: keyapi.Client, minted: keyapi.Minted, path: str,
               child: dict[str, str]) -> str:
    """After a failed placement: revoke the new key and take its file away if it landed."""
    fp = fingerprint(minted.key)
    try:
        client.revoke(minted.info.hash)
        state.record(ledger_entry(session, path, fp, "revoked", **child))
        done = f"the child key {minted.info.hash[:12]} minted for it was revoked again"
    except KeyAPIError as exc:
        done = (f"revoking the child key {minted.info.hash[:12]} minted for it failed too "
                f"({exc}); `fab cleanup-secrets` revokes it (the ledger lists it)")
    try:
        held = hashlib.sha256(b"".join(session.files.read_chunks(path, 0, 4096))).hexdigest()
        if held == sha256(minted.key):
            session.files.remove(path)
            state.record(ledger_entry(session, path, fp, "removed", **child))
    except OSError:
        pass
    return done + "; nothing is left behind"


def _revoke_replaced(session: Session, client: keyapi.Client, old: keyapi.KeyRecord) -> str:
    """Revoke the child key a new one replaced (no orphan); a failure is a note, not an
    error: the new key is in place, and the ledger keeps the old one for cleanup."""
    try:
        deleted = client.at(old.api).revoke(old.hash)
    except KeyAPIError as exc:
        return (f"could not revoke the child key {old.hash[:12]} it replaces ({exc}); "
                f"`fab cleanup-secrets` will")
    state.record(ledger_entry(session, session.abs(str(session.vars["key_path"])), old.fingerprint,
                              "revoked", key_hash=old.hash, api=old.api, service=old.service,
                              name=old.name))
    return (f"revoked the child key {old.hash[:12]} it replaces" if deleted else
            f"the child key {old.hash[:12]} it replaces was already revoked")


def _remember(session: Session, path: str, record: keyapi.KeyRecord, info: keyapi.ChildKey) -> None:
    """A reused key the ledger does not know (another clone, a wiped state dir): record it,
    so this workstation's cleanup revokes it too."""
    child = {"key_hash": record.hash, "api": record.api, "service": record.service,
             "name": record.name or info.name}
    if not any(e.key_hash == record.hash for e in state.live_minted()):
        state.record(ledger_entry(session, path, record.fingerprint, "minted", **child))
    entry = ledger_entry(session, path, record.fingerprint, "placed", **child)
    if not _in_ledger(entry):
        state.record(entry)


# --- cleanup ---------------------------------------------------------------------------------


def remove(session: Session, path: str, fp: str) -> str:
    """Delete the key file (and any temp leftovers), then prove it is gone."""
    files = session.files
    folder, name = path.rsplit("/", 1)
    removed = False
    try:
        files.remove(path)
        removed = True
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise RemoteError(f"{session.label}: cannot remove {path}: {exc}") from None
    try:
        removed = remove_leftovers(files, folder, temp_prefix(name)) or removed
    except FileNotFoundError:
        pass
    try:
        files.stat(path)
    except FileNotFoundError:
        state.record(ledger_entry(session, path, fp, "removed"))
        return f"removed {path}, verified gone" if removed else Skipped(f"{path} already absent")
    raise RemoteError(f"{session.label}: {path} still exists after removal")


def _ledger_target(entry: state.LedgerEntry) -> Target:
    """Reach a host from its ledger entry, even if it left the inventory (its vars then are
    the defaults: `python3` for the job check, the default remote_dir)."""
    ep = None
    if is_alias(entry.host):
        ep = endpoint(entry.host)
        if (ep.hostname, ep.port, ep.user) != (entry.hostname, entry.port, entry.user):
            ep = None
    if ep is None:
        ep = endpoint(entry.hostname, entry.port, entry.user, entry.identity[0] if entry.identity else None)
    variables = dict(BUILTIN_VARS, key_path=entry.path)
    return Target(entry.host, entry.host, ep, None, None, variables)


def _slot_for(target: Target) -> state.LedgerEntry:
    """A key_path to check on `target` that the ledger has no record of."""
    ep = target.endpoint
    path = sftp_path(str(target.vars["key_path"]))  # the home is not known: no probe at cleanup
    return state.LedgerEntry(host=target.label, hostname=ep.hostname, port=ep.port, user=ep.user,
                             identity=list(ep.identity), path=path, fingerprint="", time=time.time())


@dataclass
class CleanupScope:
    """What cleanup-secrets acts on: key files to remove (per host), the targets they are
    reached through, and the child keys the ledger lists as minted."""

    entries: list[state.LedgerEntry]
    targets: dict[tuple[str, int, str], Target] = field(default_factory=dict)
    minted: list[state.LedgerEntry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # hosts that could not be resolved


def cleanup_entries(wanted: set[str] | None, resolve: Callable[[str], list[Target]],
                    everywhere: Iterable[str] = ()) -> CleanupScope:
    """What cleanup removes: the ledger's placed keys (only those of the `wanted` hosts, by
    name or address, when given), plus the key_path of each host it should check that the
    ledger has no record of (a wiped state dir, another clone's deploy): the `wanted` hosts,
    or without them every host in `everywhere` (the inventory's and the remembered ones),
    found through `resolve`. Child keys: the ledger's live minted ones of those hosts."""
    entries = state.placed()
    minted = state.live_minted()
    if wanted is not None:
        def mine(e: state.LedgerEntry) -> bool:
            return e.host in wanted or e.hostname in wanted

        entries = [e for e in entries if mine(e)]
        minted = [e for e in minted if mine(e)]
        specs = sorted(h for h in wanted if not any(h in (e.host, e.hostname) for e in entries))
    else:
        specs = list(dict.fromkeys(everywhere))
    scope = CleanupScope(entries, minted=minted)
    for spec in specs:
        try:
            found = resolve(spec)
        except HandoffError as exc:
            if wanted is not None:
                raise
            scope.skipped.append(f"{spec} ({exc})")
            continue
        for t in found:
            ep = t.endpoint
            host = (ep.hostname, ep.port, ep.user)
            scope.targets.setdefault(host, t)
            path = sftp_path(str(t.vars["key_path"]))
            if not any((e.hostname, e.port, e.user) == host and (e.path == path or e.path.endswith("/" + path))
                       for e in scope.entries):
                scope.entries.append(_slot_for(t))
    return scope


def cleanup_plan(entries: list[state.LedgerEntry] | CleanupScope) -> Plan:
    """One host per (address, port, user), one remove-key step per key file placed there."""
    scope = entries if isinstance(entries, CleanupScope) else CleanupScope(entries)
    by_host: dict[tuple[str, int, str], list[state.LedgerEntry]] = {}
    for e in scope.entries:
        by_host.setdefault((e.hostname, e.port, e.user), []).append(e)
    plan = Plan("cleanup-secrets", [])
    for host, group in by_host.items():
        steps = [Step("remove-key",
                      f"remove the key file {e.path}" + (f" (key {e.fingerprint})" if e.fingerprint else "")
                      + " and the child key record beside it",
                      f"warn if a job still runs (python -c <remote_code/jobs.py> running); sftp "
                      f"read {key_record(e.path)} (the child key to revoke); sftp remove {e.path}, "
                      f"{temp_prefix(e.path.rsplit('/', 1)[-1])}* beside it and the record; stat to "
                      f"prove it gone; ledger: removed",
                      "if present", {"path": e.path, "fingerprint": e.fingerprint}, run=_remove_key)
                 for e in group]
        target = scope.targets.get(host) or _ledger_target(group[0])
        plan.hosts.append(HostPlan(target, steps))
    return plan


def _running_jobs(session: Session) -> list[str] | None:
    """`job (pid N)` for every job still running on the host; None if it cannot be told."""
    try:
        answer = session.run_code(remote_code.JOBS, {"op": "running",
                                                     "jobs_dir": session.target.layout.jobs},
                                  "looking for running jobs", timeout=60)
    except HandoffError:
        return None
    return [f"{j.get('job')} (pid {j.get('pid')})" for j in answer.get("running") or []]


def _remove_key(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    path, fp = str(step.params["path"]), str(step.params["fingerprint"])
    record = keyapi.read_record(s, key_record(path))
    if record is not None:
        ctx.report.data.setdefault("records", []).append((record, path))
    try:
        s.files.stat(path)
        present = True
    except OSError:
        present = False
    if present:
        running = _running_jobs(s)
        if running:
            fate = ("its child key is revoked below, so its next requests fail (401) and it "
                    "stops, resumable (exit 3)" if record is not None else
                    "the key in it is your API key, not revoked: the job goes on until it ends")
            ctx.report.log(
                f"  [yellow]warning:[/] {console.r(', '.join(running))} still running on "
                f"{console.r(s.label)}: it read the key at start, so removing the file does not "
                f"stop it; {fate}. A relaunch (or resume) needs a key again: `fab push-key "
                f"--host {console.r(s.label)}` first.")
        elif running is None:
            ctx.report.log("  [yellow]warning:[/] could not check for running jobs (no python "
                           "for handoff's remote code on the host?)")
    outcome = remove(s, path, fp)
    try:
        s.files.remove(key_record(path))
    except OSError:
        pass
    counts = ctx.report.data.setdefault("files", {"removed": 0, "absent": 0})
    counts["absent" if isinstance(outcome, Skipped) else "removed"] += 1
    return outcome


@dataclass(frozen=True)
class Revocation:
    """A child key to revoke: its hash, the API and keyring service of its management key,
    and where it was placed (for people)."""

    key_hash: str
    api: str
    service: str
    host: str
    path: str
    name: str = ""


def revocations(scope: CleanupScope, reports: list[HostReport] | None = None) -> list[Revocation]:
    """The ledger's live minted keys of the cleaned hosts, plus every child key a host's
    record named (found by the remove steps), each once."""
    found: dict[str, Revocation] = {}
    for e in scope.minted:
        found.setdefault(e.key_hash, Revocation(e.key_hash, e.api, e.service or SECRET_SERVICE,
                                                e.host, e.path, e.name))
    for report in reports or []:
        for record, path in report.data.get("records", []):
            found.setdefault(record.hash, Revocation(record.hash, record.api,
                                                     record.service or SECRET_SERVICE,
                                                     report.target.label, path, record.name))
    return list(found.values())


@dataclass
class Revoked:
    revocation: Revocation
    deleted: bool = False  # this run deleted it (False: it was already gone)
    error: str | None = None


def revoke_all(todo: list[Revocation], keys: ManagementKeys) -> list[Revoked]:
    """DELETE each child key, then GET it to prove the 404; in parallel, one result each.
    The ledger gets a `revoked` event for each one gone."""
    results = [Revoked(r) for r in todo]

    def one(result: Revoked) -> None:
        r = result.revocation
        try:
            result.deleted = keys.client(r.api, r.service, "revoke child keys").revoke(r.key_hash)
        except HandoffError as exc:
            result.error = str(exc)
            return
        state.record(state.LedgerEntry(host=r.host, hostname="", port=0, user="", identity=[],
                                       path=r.path, fingerprint="", time=time.time(),
                                       event="revoked", key_hash=r.key_hash, api=r.api,
                                       service=r.service, name=r.name))

    threads = [threading.Thread(target=one, args=(res,), name="revoke", daemon=True)
               for res in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def revocation_table(results: list[Revoked]) -> Any:
    rows = []
    for res in results:
        r = res.revocation
        outcome = (f"[red]FAILED:[/] {console.r(res.error)}" if res.error else
                   "[green]revoked[/], GET answers 404" if res.deleted else
                   "already revoked (404)")
        rows.append([console.r(r.host), r.key_hash[:12], outcome])
    return console.table("child keys revoked", ["host", "key hash", "result"], rows)


def revocation_plan(todo: list[Revocation]) -> Any:
    """The dry run's second half: what would be revoked (the ledger's child keys; the ones
    named only in a host's record are found when the host is read)."""
    rows = [[console.r(r.host), r.key_hash[:12], console.r(f"DELETE {r.api}/keys/<hash>, then GET "
                                                             f"answers 404")] for r in todo]
    rows.append(["(each host)", "-", "and any child key named in a host's key record "
                                     "(<key_path>.minted.json), the same way"])
    return console.table("then revoke the child keys", ["host", "key hash", "runs"], rows)


def cleanup_summary(reports: list[HostReport], revoked: list[Revoked]) -> tuple[bool, list[str]]:
    """(all clean?, what to tell): files removed / already absent, child keys revoked, and
    for each host that could not be cleaned whether what may remain there is dead."""
    removed = sum(r.data.get("files", {}).get("removed", 0) for r in reports)
    absent = sum(r.data.get("files", {}).get("absent", 0) for r in reports)
    down = [r for r in reports if not r.ok]
    failed = [x for x in revoked if x.error]
    head = f"cleanup-secrets: removed {removed} key file(s), {absent} already absent"
    if revoked:
        deleted = sum(1 for x in revoked if x.deleted and not x.error)
        gone = sum(1 for x in revoked if not x.deleted and not x.error)
        head += (f"; revoked {deleted} child key(s), each confirmed gone (GET answers 404), "
                 f"{gone} already revoked")
        if failed:
            head += f", {len(failed)} NOT revoked"
    if down:
        head += f"; {len(down)} host(s) not cleaned: {', '.join(r.target.label for r in down)}"
    lines = [head]
    for r in down:
        label = r.target.label
        why = str(r.error or "not reachable")
        why = why if why.startswith(label) else f"{label}: {why}"
        why += "" if why.endswith((".", "?", "!")) else "."
        dead = [x.revocation for x in revoked if x.revocation.host == label and not x.error]
        if dead:
            keys = ", ".join(f"{d.key_hash[:12]} ({d.path})" for d in dead)
            lines.append(f"{why} Its key file may remain there, but the child key it holds is "
                         f"revoked, so it is dead: {keys}. Rerun `fab cleanup-secrets` when the "
                         f"host is back to remove the file.")
        else:
            lines.append(f"{why} Its key file may remain there and still work; rerun `fab "
                         f"cleanup-secrets` when the host is reachable (the ledger keeps it).")
    for x in failed:
        lines.append(f"child key {x.revocation.key_hash[:12]} ({x.revocation.host}) is NOT "
                     f"revoked: {x.error}")
    return not down and not failed, lines
