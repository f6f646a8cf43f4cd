"""The local state dir: current targets, the secrets ledger, pinned host keys, and what
the last smoke test measured per API and model (`fab launch`'s estimate reads it).

`$HANDOFF_STATE_DIR`, default `.handoff/` in the project directory (handoff.config.paths;
git-ignored). The dir is 0700 and every file in it 0600: it holds no secret, but the
ledger maps hosts to where keys lie, which is nobody else's business. The ledger stores
host, path, time and an 8-hex fingerprint of the key, never the key; for a minted child
key also its public `hash` and the API that minted it, so cleanup can revoke it even when
its host is unreachable. Files are replaced
through payload.atomic (temp name, fsync, rename); the ledger is append-only.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from handoff.config.paths import state_dir
from payload import atomic

__all__ = ["LedgerEntry", "ensure_state_dir", "ledger_events", "ledger_path", "live_minted",
           "load_smoke", "load_targets", "pinned_keys_path", "placed", "record", "remembered",
           "save_smoke", "save_targets", "state_dir", "write_pinned"]

_lock = threading.Lock()  # tasks write the ledger from several host threads


def ensure_state_dir() -> Path:
    path = state_dir()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, text: str) -> None:
    """Atomically replace `path` with `text`, 0600 from creation."""
    atomic.write_text(path, text, mode=0o600)


# --- current targets --------------------------------------------------------------------


def save_targets(by_role: dict[str, list[str]]) -> None:
    """Remember a successful deploy's hosts per role (`{"generator": [...], ...}`): each role
    named here gets these hosts, replacing the ones it had; the other roles keep theirs, so a
    deploy of the extractor's host does not hide the generator fleet from a later bare
    command."""
    with _lock:
        roles = _remembered_roles()
        now = time.time()
        for role, specs in by_role.items():
            roles[role] = {"hosts": list(specs), "time": now}
        path = ensure_state_dir() / "targets.json"
        _write_private(path, json.dumps({"roles": roles}, indent=2) + "\n")


def _remembered_roles() -> dict[str, dict[str, Any]]:
    """targets.json as {role: {"hosts", "time"}}; the older one-list form ({"hosts", "role",
    "time"}) is read as one entry, under its role or "" (each host's own)."""
    try:
        data = json.loads((state_dir() / "targets.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    if "roles" not in data:
        role = data.get("role")
        data = {"roles": {role if isinstance(role, str) else "": data}}
    roles = data.get("roles")
    out: dict[str, dict[str, Any]] = {}
    for role, entry in (roles.items() if isinstance(roles, dict) else []):
        if isinstance(role, str) and isinstance(entry, dict) and isinstance(entry.get("hosts"), list):
            saved = entry.get("time")
            out[role] = {"hosts": [str(h) for h in entry["hosts"]],
                         "time": float(saved) if isinstance(saved, (int, float)) else None}
    return out


def remembered() -> dict[str, tuple[list[str], float | None]]:
    """The remembered targets: per role ("" for an entry of an older handoff that named none),
    its hosts and when they were saved; roles in name order."""
    return {role: (entry["hosts"], entry["time"])
            for role, entry in sorted(_remembered_roles().items())}


def load_targets() -> list[str]:
    """Every remembered host, whatever its role (cleanup-secrets checks them all)."""
    return list(dict.fromkeys(h for hosts, _ in remembered().values() for h in hosts))


# --- the ledger -------------------------------------------------------------------------


# Events about a key FILE on a host (its slot) and about a minted child KEY at the API.
SLOT_EVENTS = ("placed", "removed")
CHILD_EVENTS = ("minted", "revoked")
_CHILD_FIELDS = ("key_hash", "api", "service", "name")


@dataclass(frozen=True)
class LedgerEntry:
    """One placement (or removal) of a key file, or one child key minted (or revoked):
    enough to find the file again and to revoke the child key, never the key."""

    host: str  # the label the user knows it by (inventory name or spec)
    hostname: str  # resolved address, so cleanup works after the host left the inventory
    port: int
    user: str
    identity: list[str]
    path: str  # absolute remote path of the key file
    fingerprint: str  # first 8 hex of sha256(key)
    time: float
    event: str = "placed"  # placed | removed (the file), minted | revoked (the child key)
    key_hash: str = ""  # the child key's public hash at the API (minted keys only)
    api: str = ""  # the management API that minted it (the host's base_url)
    service: str = ""  # the keyring service whose management key minted it
    name: str = ""  # the child key's name at the API

    @property
    def slot(self) -> tuple[str, int, str, str]:
        return (self.hostname, self.port, self.user, self.path)


def ledger_path() -> Path:
    return state_dir() / "ledger.jsonl"


def record(entry: LedgerEntry) -> None:
    """Append an event; the file is created 0600 and only ever appended to."""
    with _lock:
        path = ensure_state_dir() / "ledger.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        # A plain key's events keep their old shape: the child-key fields only when set.
        data = {k: v for k, v in asdict(entry).items() if k not in _CHILD_FIELDS or v}
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(data, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())


# The ledger as last parsed, with the file's identity and size then: every host of a deploy
# asks (secrets.place.in_ledger), and parsing the whole file once per host grew as hosts ×
# events. The file is only ever appended to, so a new size (or another file) means re-read.
_parsed: tuple[tuple[str, int, int, int], tuple[LedgerEntry, ...]] | None = None


def ledger_events() -> list[LedgerEntry]:
    global _parsed
    path = ledger_path()
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            stamp = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
            cached = _parsed
            if cached is not None and cached[0] == stamp:
                return list(cached[1])
            # Exactly the bytes the stamp describes: an append racing this read is seen
            # by the next call (its size differs), never half-counted under this stamp.
            lines = fh.read(st.st_size).decode("utf-8").splitlines()
    except FileNotFoundError:
        return []
    events = []
    for line in lines:
        try:
            data: dict[str, Any] = json.loads(line)
            events.append(LedgerEntry(**data))
        except (ValueError, TypeError):
            continue  # a torn last line from a crash: the earlier events still count
    _parsed = (stamp, tuple(events))
    return events


def placed() -> list[LedgerEntry]:
    """Keys the ledger says are still on a host: the last event per slot is `placed`."""
    last: dict[tuple[str, int, str, str], LedgerEntry] = {}
    for event in ledger_events():
        if event.event in SLOT_EVENTS:
            last[event.slot] = event
    return [e for e in last.values() if e.event == "placed"]


def live_minted() -> list[LedgerEntry]:
    """Child keys minted and not (yet) known to be revoked: the last event per hash is
    `minted`. A key whose placement was cut off by a crash is among them, so cleanup still
    revokes it."""
    last: dict[str, LedgerEntry] = {}
    for event in ledger_events():
        if event.event in CHILD_EVENTS and event.key_hash:
            last[event.key_hash] = event
    return [e for e in last.values() if e.event == "minted"]


# --- pinned host keys -------------------------------------------------------------------


def pinned_keys_path() -> Path:
    return state_dir() / "known_hosts"


def write_pinned(text: str) -> None:
    with _lock:
        _write_private(ensure_state_dir() / "known_hosts", text)


# --- what the smoke test measured ---------------------------------------------------------


def _smoke_key(base_url: str, model: str) -> str:
    return f"{base_url.rstrip('/')} {model}"


def save_smoke(base_url: str, model: str, measured: dict[str, Any]) -> None:
    """Remember one smoke test's figures (latency, tokens, cost, the endpoint prices) for
    this API and model: the next launch estimates cost and time from them."""
    with _lock:
        path = ensure_state_dir() / "smoke.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        data[_smoke_key(base_url, model)] = {**measured, "time": time.time()}
        _write_private(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_smoke(base_url: str, model: str) -> dict[str, Any] | None:
    """The last smoke test's figures for this API and model, if one was recorded."""
    try:
        data = json.loads((state_dir() / "smoke.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    found = data.get(_smoke_key(base_url, model)) if isinstance(data, dict) else None
    return found if isinstance(found, dict) else None
