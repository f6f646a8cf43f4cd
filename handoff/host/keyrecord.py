"""The record beside a minted key on the host: `<key_path>.minted.json`, naming the child
key's hash and the API it belongs to (handoff.ops.keyapi mints and revokes them).

The hash is public: it identifies the key to the management API and cannot be used to call
models. It lets `cleanup-secrets` revoke, and `fab status` report, the key a host holds even
when the local ledger is gone.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from handoff.host import untrusted
from handoff.host.session import Session
from handoff.host.transfer import upload_atomic


@dataclass(frozen=True)
class KeyRecord:
    """`<key_path>.minted.json`: which child key the file beside it holds. Public facts only."""

    hash: str
    name: str
    api: str  # the management API it was minted at: for people only (the host's word)
    service: str  # the keyring service of the management key: for people only
    fingerprint: str  # 8 hex of sha256(key): ties the record to the file beside it
    expires_at: str | None
    limit: float | None
    minted: float  # unix time

    @classmethod
    def from_json(cls, raw: Any) -> KeyRecord | None:
        """The record as read from a host; None when it is not one (absent, torn, foreign)."""
        if not isinstance(raw, dict):
            return None
        key_hash = raw.get("hash")
        # The record is the host's word: a hash is a short plain token (it goes into a URL
        # path, quoted, and only to the workstation's own API); `api` and `service` are
        # kept for people, never used to decide where the management key goes.
        if not isinstance(key_hash, str) or not key_hash or len(key_hash) > 128 \
                or untrusted.name_problem(key_hash) is not None:
            return None
        return cls(key_hash, untrusted.text(raw.get("name"), 200) or "",
                   untrusted.text(raw.get("api"), 500) or "",
                   untrusted.text(raw.get("service"), 200) or "",
                   untrusted.text(raw.get("fingerprint"), 64) or "",
                   untrusted.text(raw.get("expires_at"), 64),
                   untrusted.number(raw.get("limit"), minimum=0),
                   untrusted.number(raw.get("minted"), minimum=0) or 0.0)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"


def read_record(session: Session, path: str, size: int | None = None) -> KeyRecord | None:
    """The record at `path` on the host (absolute, or relative to the home); None if absent
    or unreadable as a record."""
    files = session.files
    try:
        if size is None:
            size = files.stat(path).size
        raw = b"".join(files.read_chunks(path, 0, min(int(size), 64 * 1024)))
    except (FileNotFoundError, OSError):
        return None
    try:  # within the reader's limits: no NaN, no infinity, no bomb
        parsed = untrusted.loads(raw, "the key record", untrusted.SMALL_FILE) if raw else None
    except ValueError:
        return None  # torn or foreign: not a record
    return KeyRecord.from_json(parsed)


def write_record(session: Session, path: str, record: KeyRecord) -> None:
    """Replace the record atomically, 0600 like the key (it says where a key lies)."""
    upload_atomic(session.files, record.to_json().encode("utf-8"), path, 0o600, durable=True)


__all__ = ["KeyRecord", "read_record", "write_record"]
