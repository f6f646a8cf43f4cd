"""A child key minted for one host: reused while it lives (the record beside it names its
hash; the API says whether it is live), replaced when it expired, was revoked or expires
within the hour, and the key it replaces revoked. A minted key whose placement failed is
revoked again; a create whose answer was lost is found by its unique name and deleted.
"""

from __future__ import annotations

import hashlib
import time

from handoff.config import state
from handoff.config.layout import key_record
from handoff.config.os_keyring import fingerprint, sha256
from handoff.defaults import (
    KEY_RENEW_BEFORE_S,
)
from handoff.errors import (
    HandoffError,
    KeyAPIError,
    KeyAPIFailed,
    KeyAPIUnreachable,
    RemoteError,
)
from handoff.host import keyrecord
from handoff.host.facts import KEY_FILE, KEY_RECORD, Facts
from handoff.host.session import Session
from handoff.ops import keyapi
from handoff.ops.secrets.place import in_ledger, key_location, ledger_entry, place
from handoff.ops.secrets.settings import Credentials, KeySettings, vouch
from handoff.run.plan import Skipped


def _child_fields(minted: keyapi.ChildKey, api: str, service: str) -> dict[str, str]:
    return {"key_hash": minted.hash, "api": api, "service": service, "name": minted.name}


def place_minted(session: Session, facts: Facts, creds: Credentials, settings: KeySettings) -> str:
    """The host's child key: reuse the live one its record names, else mint one, place it
    and its record, and revoke the key it replaces. Nothing half-done: a key minted here
    whose placement fails is revoked before the error is raised."""
    target = session.target
    api = str(session.vars["base_url"]).rstrip("/")
    client = creds.client(api)
    path = key_location(session, facts)  # before anything is minted: an unsafe folder refuses
    record_path = key_record(path)
    remote, on_host = facts.file(KEY_FILE), facts.file(KEY_RECORD)
    record = keyrecord.read_record(session, record_path, on_host.size) if on_host.exists else None
    replaced: keyrecord.KeyRecord | None = record
    why = "the host holds no minted key"
    if record is not None:
        # The file beside the record is the key the record names, still private.
        intact = bool(remote.exists and remote.sha256 and record.fingerprint
                      and remote.sha256.startswith(record.fingerprint)
                      and remote.mode == 0o600 and remote.uid == facts.uid)
        # The record is the host's word: its hash is asked about at this workstation's API
        # only, and reused or revoked only if that key is this host's (vouch).
        try:
            info = vouch(client, target, record.hash)
        except RemoteError as exc:
            info, replaced = None, None  # not this host's key: neither reused nor revoked
            why = str(exc).removeprefix(f"{session.label}: ")
        else:
            if intact and info is not None and info.live(margin_s=KEY_RENEW_BEFORE_S):
                _remember(session, path, record, info, api, creds.service)
                return Skipped(f"child key {record.hash[:12]} at {path} is live "
                               f"({info.describe()}): reused, nothing minted")
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
        keyrecord.write_record(session, record_path, keyrecord.KeyRecord(
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
        note += "; " + _revoke_replaced(session, client, replaced, api, creds.service)
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


def _revoke_replaced(session: Session, client: keyapi.Client, old: keyrecord.KeyRecord,
                     api: str, service: str) -> str:
    """Revoke the child key a new one replaced (no orphan); a failure is a note, not an
    error: the new key is in place, and the ledger keeps the old one for cleanup. `old`
    is this host's key (vouched for); it is revoked at the workstation's own API."""
    try:
        deleted = client.revoke(old.hash)
    except KeyAPIError as exc:
        return (f"could not revoke the child key {old.hash[:12]} it replaces ({exc}); "
                f"`fab cleanup-secrets` will")
    state.record(ledger_entry(session, session.abs(str(session.vars["key_path"])), old.fingerprint,
                              "revoked", key_hash=old.hash, api=api, service=service,
                              name=old.name))
    return (f"revoked the child key {old.hash[:12]} it replaces" if deleted else
            f"the child key {old.hash[:12]} it replaces was already revoked")


def _remember(session: Session, path: str, record: keyrecord.KeyRecord, info: keyapi.ChildKey,
              api: str, service: str) -> None:
    """A reused key the ledger does not know (another clone, a wiped state dir): record it,
    so this workstation's cleanup revokes it too. The API and service recorded are the
    workstation's own (the record's are the host's word), the name the API's."""
    child = {"key_hash": record.hash, "api": api, "service": service, "name": info.name}
    if not any(e.key_hash == record.hash for e in state.live_minted()):
        state.record(ledger_entry(session, path, record.fingerprint, "minted", **child))
    entry = ledger_entry(session, path, record.fingerprint, "placed", **child)
    if not in_ledger(entry):
        state.record(entry)


__all__ = ["place_minted"]
