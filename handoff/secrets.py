"""The API key, from the keyring to the host and back out: read, placed, removed.

This is the one home of the secret's life cycle:
- read from the OS keyring (`read_key`, `read_key_soon`), registered for redaction at once;
- placed on a host by deploy/push-key (`place_step`, `place`), over SFTP, never through a
  command line or `env=`:
  1. the key's folder is created / forced to 0700;
  2. a temp name in that folder is created exclusively with mode 0600 given IN the create
     request itself, so the file is 0600 from the instant it exists;
  3. the key is written and fsync'ed;
  4. the temp name is renamed over the final path (POSIX rename);
  5. `stat` checks mode 0600 and owner = the login user; anything else is removed and
     reported.
  Idempotence is checked on the host: the probe returns the sha256 of the remote file,
  compared with the local key's sha256; the key itself never travels for that.
- removed by cleanup-secrets (`cleanup_plan`, `remove`): every key the ledger lists as
  placed (also on hosts that left the inventory) and every `key_path` named with --host,
  temp leftovers included, then proven gone by a stat.

The ledger (handoff.state) records host, path, time and the first 8 hex of sha256(key).
"""

from __future__ import annotations

import hashlib
import stat
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from types import ModuleType

from handoff import state
from handoff.defaults import API_KEY_USERNAME, SECRET_SERVICE
from handoff.errors import (
    KeyringEntryMissing,
    NoKeyringBackend,
    RemoteError,
    UsageError,
)
from handoff.facts import KEY_FILE, Facts
from handoff.layout import parents, sftp_path
from handoff.plan import HostContext, HostPlan, Plan, Skipped, Step
from handoff.session import Session
from handoff.ssh import endpoint, is_alias
from handoff.targets import Target
from handoff.transfer import mkdirs, remove_leftovers, temp_prefix, upload_atomic
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


def read_key(service: str = SECRET_SERVICE, username: str = API_KEY_USERNAME) -> str:
    """The key from the OS keyring, registered for redaction before anything else."""
    keyring = _keyring()
    try:
        value = keyring.get_password(service, username)
    except keyring.errors.NoKeyringError as exc:
        raise NoKeyringBackend(service, username, str(exc).split(".")[0] or "none found") from None
    except keyring.errors.KeyringError as exc:
        raise NoKeyringBackend(service, username, f"{type(exc).__name__}: {exc}") from None
    if not value or not value.strip():
        raise KeyringEntryMissing(service, username)
    key = value.strip()
    REDACTOR.add(key)
    return key


def read_key_soon(service: str = SECRET_SERVICE, username: str = API_KEY_USERNAME) -> Future[str]:
    """`read_key` on a thread: keyring's backend discovery and the Secret Service round trip
    (0.1-0.3 s) then overlap the SSH connections and probes, and only the first step that
    changes a host waits for it.

    A daemon thread rather than an executor: a keyring that hangs (a locked collection
    waiting for an unlock prompt) must not keep the process alive after Ctrl-C.
    """
    future: Future[str] = Future()
    future.set_running_or_notify_cancel()

    def work() -> None:
        try:
            future.set_result(read_key(service, username))
        except BaseException as exc:  # delivered to whoever waits on the future
            future.set_exception(exc)

    threading.Thread(target=work, name="keyring-read", daemon=True).start()
    return future


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


# --- placement -----------------------------------------------------------------------------


def key_folders(target: Target) -> list[str]:
    """The folders placing the key may create (the probe reports which exist)."""
    return parents(str(target.vars["key_path"]).rsplit("/", 1)[0])


def place_step(target: Target, key: str | Future[str] | None, unavailable: str | None = None) -> Step:
    """Place the plan's key (private "key") at the host's key_path, 0600 from birth."""
    path = str(target.vars["key_path"])
    folder, name = path.rsplit("/", 1)
    if isinstance(key, str):
        what = f"place API key {fingerprint(key)} at {path} (0600)"
    elif key is not None:
        what = f"place API key at {path} (0600)"
    else:
        what = f"place API key at {path} (0600); NOTE: {unavailable}"
    return Step("place-key", what,
                f"sftp mkdir {folder} (0700); create {folder}/{temp_prefix(name)}* O_EXCL mode 0600; "
                f"write; fsync; rename; stat",
                "unless the host already holds the same key (sha256 compared on the host)",
                run=_place_key)


def _place_key(ctx: HostContext, step: Step) -> str:
    key = ctx.private("key")
    if not key:
        raise RuntimeError("the plan carries no key")
    return place(ctx.session, ctx.need_facts(), str(key))


def ledger_entry(session: Session, path: str, fp: str, event: str) -> state.LedgerEntry:
    ep = session.target.endpoint
    return state.LedgerEntry(
        host=session.label, hostname=ep.hostname, port=ep.port, user=ep.user,
        identity=list(ep.identity), path=path, fingerprint=fp, time=time.time(), event=event,
    )


def _in_ledger(entry: state.LedgerEntry) -> bool:
    return any(e.slot == entry.slot and e.fingerprint == entry.fingerprint for e in state.placed())


def place(session: Session, facts: Facts, key: str) -> str:
    """Place `key` at the host's key_path unless the same key is already there."""
    path = session.abs(str(session.vars["key_path"]))
    fp = fingerprint(key)
    remote = facts.file(KEY_FILE)
    entry = ledger_entry(session, path, fp, "placed")
    if remote.exists and remote.sha256 == sha256(key) and remote.mode == 0o600 and remote.uid == facts.uid:
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
        try:
            files.remove(path)
        except OSError:
            pass
        raise RemoteError(
            f"{session.label}: {path} came out with mode {mode:o} owner uid {st.uid} "
            f"(want 600, uid {facts.uid}); removed it. Check the folder's ACLs / filesystem."
        )
    state.record(entry)
    return f"placed key {fp} at {path} (0600, uid {st.uid})"


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
    """Reach a host from its ledger entry, even if it left the inventory."""
    ep = None
    if is_alias(entry.host):
        ep = endpoint(entry.host)
        if (ep.hostname, ep.port, ep.user) != (entry.hostname, entry.port, entry.user):
            ep = None
    if ep is None:
        ep = endpoint(entry.hostname, entry.port, entry.user, entry.identity[0] if entry.identity else None)
    return Target(entry.host, entry.host, ep, None, None, {})


def cleanup_entries(wanted: set[str] | None,
                    resolve: Callable[[str], list[Target]]) -> list[state.LedgerEntry]:
    """What cleanup removes: the ledger's placed keys (only those of the `wanted` hosts,
    by name or address, when given), plus the key_path of each wanted host the ledger has
    no record of (a wiped state dir), found through `resolve` (the inventory)."""
    entries = state.placed()
    if wanted is None:
        return entries
    entries = [e for e in entries if e.host in wanted or e.hostname in wanted]
    unlisted = sorted(h for h in wanted if not any(h in (e.host, e.hostname) for e in entries))
    for t in resolve(",".join(unlisted)) if unlisted else []:
        ep = t.endpoint
        if any((e.hostname, e.port, e.user) == (ep.hostname, ep.port, ep.user) for e in entries):
            continue
        path = sftp_path(str(t.vars["key_path"]))  # the home is not known: no probe at cleanup
        entries.append(state.LedgerEntry(
            host=t.label, hostname=ep.hostname, port=ep.port, user=ep.user,
            identity=list(ep.identity), path=path, fingerprint="", time=time.time()))
    return entries


def cleanup_plan(entries: list[state.LedgerEntry]) -> Plan:
    """One host per (address, port, user), one remove-key step per key file placed there."""
    by_host: dict[tuple[str, int, str], list[state.LedgerEntry]] = {}
    for e in entries:
        by_host.setdefault((e.hostname, e.port, e.user), []).append(e)
    plan = Plan("cleanup-secrets", [])
    for group in by_host.values():
        steps = [Step("remove-key",
                      f"remove the key file {e.path}" + (f" (key {e.fingerprint})" if e.fingerprint else ""),
                      f"sftp remove {e.path} and {temp_prefix(e.path.rsplit('/', 1)[-1])}* beside it; "
                      f"stat to prove it gone; ledger: removed",
                      "if present", {"path": e.path, "fingerprint": e.fingerprint}, run=_remove_key)
                 for e in group]
        plan.hosts.append(HostPlan(_ledger_target(group[0]), steps))
    return plan


def _remove_key(ctx: HostContext, step: Step) -> str:
    return remove(ctx.session, str(step.params["path"]), str(step.params["fingerprint"]))
