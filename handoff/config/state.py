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
import math
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from handoff.config.paths import state_dir
from payload import atomic

__all__ = ["LedgerEntry", "SmokeFigures", "ensure_state_dir", "ledger_events", "ledger_path",
           "live_minted", "load_smoke", "load_targets", "pinned_keys_path", "placed", "record",
           "remembered", "save_smoke", "save_targets", "smoke_problem", "state_dir",
           "workstation_id", "write_pinned"]

_lock = threading.Lock()  # tasks write the ledger from several host threads


def ensure_state_dir() -> Path:
    path = state_dir()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, text: str) -> None:
    """Atomically replace `path` with `text`, 0600 from creation."""
    atomic.write_text(path, text, mode=0o600)


# --- this workstation's id -----------------------------------------------------------------


def workstation_id() -> str:
    """A random id for this state dir (12 hex, made on first use): the child keys it mints
    are named `handoff:<id>:<host>[:<job>]`, so its own are told from another clone's. A
    cleanup never relies on it: it revokes a cleaned host's keys whatever id they carry."""
    path = state_dir() / "workstation_id"
    try:
        found = path.read_text(encoding="utf-8").strip()
        if len(found) == 12 and all(c in "0123456789abcdef" for c in found):
            return found
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    with _lock:
        ensure_state_dir()
        made = secrets.token_hex(6)
        try:  # exclusive: two commands at once agree on the first one written
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_text(encoding="utf-8").strip() or made
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(made + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return made


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
_CHILD_FIELDS = ("key_hash", "api", "service", "name", "job")


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
    job: str = ""  # the job a child key is for ("": the host's own key, placed by deploy/push-key)

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


def _in_range(value: Any, low: float, high: float) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and low <= value <= high)


def _ranged(low: float, high: float, *, required: bool = False) -> Any:
    """A figure's field: a finite number in low..high (required, or None when absent)."""
    meta = {"range": (low, high)}
    return field(metadata=meta) if required else field(default=None, metadata=meta)


_TOKENS = 100_000_000
_PRICE_RANGES = {"prompt": (0.0, 1.0), "completion": (0.0, 1.0), "request": (0.0, 100.0)}


@dataclass(frozen=True)
class SmokeFigures:
    """What one smoke test measured, as `fab launch`'s estimate reads it from smoke.json. A
    host measured it (its `payload smoke` printed it), so each figure is declared with its
    sane range and checked when saved (that host's smoke test fails otherwise) and again
    when read (a bad entry is ignored with a warning, never a crash of a later launch)."""

    latency_s: float = _ranged(0.0, 86_400.0, required=True)
    prompt_tokens: int = _ranged(0, _TOKENS, required=True)
    completion_tokens: int = _ranged(0, _TOKENS, required=True)
    reasoning_tokens: int | None = _ranged(0, _TOKENS)
    content_tokens: int | None = _ranged(0, _TOKENS)
    cost: float | None = _ranged(0.0, 10_000.0)
    time: float | None = _ranged(0.0, 1e11)
    prices: dict[str, float] | None = None  # USD per prompt / completion token, per request
    cut: bool | None = None  # the smoke answer was cut at its max_tokens
    host: str | None = None  # which host measured it

    @classmethod
    def read(cls, raw: Any) -> SmokeFigures:
        """The figures, checked; ValueError saying which one is not believable."""
        if not isinstance(raw, dict):
            raise ValueError("not a set of figures")
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = raw.get(f.name)
            if "range" in f.metadata:
                low, high = f.metadata["range"]
                if value is None and f.default is MISSING:
                    raise ValueError(f"no {f.name}")
                if value is not None and not _in_range(value, low, high):
                    raise ValueError(f"{f.name} {str(value)[:40]} is not a number in {low:g}..{high:g}")
            values[f.name] = value
        prices = values["prices"]
        if prices is not None:
            if not isinstance(prices, dict) or not {"prompt", "completion"} <= set(prices):
                raise ValueError("prices are not {prompt, completion, request}")
            for name, (low, high) in _PRICE_RANGES.items():
                if prices.get(name) is not None and not _in_range(prices[name], low, high):
                    raise ValueError(f"price {name} {str(prices[name])[:40]} is not a number in "
                                     f"{low:g}..{high:g}")
        if values["cut"] is not None and not isinstance(values["cut"], bool):
            raise ValueError("cut is not true or false")
        if values["host"] is not None and not isinstance(values["host"], str):
            raise ValueError("host is not a name")
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def smoke_problem(measured: Any) -> str | None:
    """Why a smoke test's figures are not believable (a number not finite or out of its
    range, a required one missing); None when they are (SmokeFigures.read)."""
    try:
        SmokeFigures.read(measured)
    except ValueError as exc:
        return str(exc)
    return None


def save_smoke(base_url: str, model: str, measured: dict[str, Any]) -> None:
    """Remember one smoke test's figures (latency, tokens, cost, the endpoint prices) for
    this API and model: the next launch estimates cost and time from them. Figures that
    are not believable (`smoke_problem`) are a ValueError: never written."""
    figures = SmokeFigures.read({**measured, "time": time.time()}).as_dict()
    with _lock:
        path = ensure_state_dir() / "smoke.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError, RecursionError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        data[_smoke_key(base_url, model)] = figures
        _write_private(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_smoke(base_url: str, model: str,
               warn: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """The last smoke test's figures for this API and model, if one was recorded and its
    figures are believable; a bad entry (written by an older version, or by hand) is
    ignored, said to `warn`."""
    path = state_dir() / "smoke.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=lambda _c: None)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        if warn is not None:
            warn(f"{path} is not readable ({str(exc)[:100]}): ignored; `fab smoke-test` writes it again")
        return None
    found = data.get(_smoke_key(base_url, model)) if isinstance(data, dict) else None
    if found is None:
        return None
    try:
        return SmokeFigures.read(found).as_dict()
    except ValueError as problem:
        if warn is not None:
            warn(f"{path}: the smoke test recorded for {model} at {base_url} is ignored "
                 f"({problem}); rerun `fab smoke-test` for an estimate")
        return None
