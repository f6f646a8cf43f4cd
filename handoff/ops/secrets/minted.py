"""A child key minted for one host (and, later, one job): at most one live at any time.

The host's live key is reused while it lives (the record beside it names its hash; the
API says whether it is live). Otherwise every earlier key of that (host, job) is revoked
FIRST (the ledger's live ones, the one the host's record names if it is that host's, and
the ones the API lists named for it by any workstation: `handoff:<ws>:<host>[:<job>]`),
and only then is one minted: a host that copied its key away and deleted the record gets a
new key while the copy dies. A minted key whose placement failed is revoked again; a
create whose answer was lost is found by its name and deleted.
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
from handoff.ops.secrets.settings import (
    Credentials,
    KeySettings,
    api_mismatch,
    management_api,
    names_host,
    vouch,
)
from handoff.run.plan import Skipped


def _child_fields(minted: keyapi.ChildKey, api: str, service: str, job: str | None) -> dict[str, str]:
    return {"key_hash": minted.hash, "api": api, "service": service, "name": minted.name,
            "job": job or ""}


def place_minted(session: Session, facts: Facts, creds: Credentials, settings: KeySettings,
                 job: str | None = None) -> str:
    """The host's child key (`job` None: the host's own, placed by deploy/push-key): reuse
    the live one its record names, else revoke every earlier one, mint one, place it and its
    record. Nothing half-done: a key minted here whose placement fails is revoked before the
    error is raised. A host whose base_url is not the management API gets none."""
    target = session.target
    mismatch = api_mismatch(target, str(session.vars.get("base_url") or ""))
    if mismatch:
        raise RemoteError(mismatch)
    api = management_api(target)
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
                _remember(session, path, record, info, api, creds.service, job)
                others = _revoke_earlier(session, client, api, creds.service, job,
                                         keep=record.hash, ask_api=False)
                return Skipped(f"child key {record.hash[:12]} at {path} is live "
                               f"({info.describe()}): reused, nothing minted{others}")
            why = ("the key file does not match its record" if not intact
                   else f"its child key {record.hash[:12]} was revoked" if info is None
                   else f"its child key {record.hash[:12]} is disabled" if info.disabled
                   else f"its child key {record.hash[:12]} expires {keyapi.until(info.expires_at)}")
    # At most one live key per (host, job): every earlier one goes before a new one exists.
    earlier = _revoke_earlier(session, client, api, creds.service, job,
                              also=replaced.hash if replaced is not None else None)
    name = keyapi.child_name(state.workstation_id(), target.label, job)
    minted = _mint(client, name, settings)
    child = _child_fields(minted.info, api, creds.service, job)
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
    return (f"minted child key {minted.info.hash[:12]} ({minted.info.describe()}; {why}) and "
            f"{placed.replace('placed key', 'placed it as key', 1)}{earlier}{note}")


def _revoke_earlier(session: Session, client: keyapi.Client, api: str, service: str,
                    job: str | None, *, keep: str | None = None, also: str | None = None,
                    ask_api: bool = True) -> str:
    """Revoke every live child key of this (host, job) but `keep`: the ledger's (at the API
    each was minted at), `also` (the one the host's record names, vouched for), and with
    `ask_api` the ones the management API lists named for them, by any workstation (a wiped
    state dir has a new id; the API is the truth).
    Each is deleted and its 404 confirmed; one that cannot be is an error (RemoteError): no
    new key is minted while an old one may live. What was revoked, for the step's line."""
    target = session.target
    ep = target.endpoint
    todo: dict[str, str] = {}  # hash -> the API it lives at
    for e in state.live_minted():
        if (e.hostname, e.port, e.user) == (ep.hostname, ep.port, ep.user) and e.job == (job or ""):
            todo[e.key_hash] = e.api or api
    if also:
        todo.setdefault(also, api)
    if ask_api:
        def this_hosts(name: str) -> bool:  # for this (host, job), by any workstation
            parsed = keyapi.ChildName.parse(name)
            return (parsed is not None and parsed.host == target.label
                    and parsed.job == (job or None) and names_host(name, target))

        try:
            for key in client.listed(this_hosts):
                todo.setdefault(key.hash, api)
        except KeyAPIError as exc:
            raise RemoteError(f"{session.label}: listing the management API's keys to revoke "
                              f"this host's earlier ones failed ({exc}); nothing was minted") from None
    todo.pop(keep or "", None)
    done = []
    key_path = session.abs(str(session.vars["key_path"]))
    for key_hash, where in todo.items():
        try:
            client.at(where).revoke(key_hash)
        except KeyAPIError as exc:
            raise RemoteError(f"{session.label}: could not revoke its earlier child key "
                              f"{key_hash[:12]} ({exc}); nothing was minted, so the host never "
                              f"holds two live keys. Rerun once the management API answers, or "
                              f"`fab cleanup-secrets --host {session.label}`") from None
        state.record(ledger_entry(session, key_path, "", "revoked", key_hash=key_hash,
                                  api=where, service=service, job=job or ""))
        done.append(key_hash[:12])
    if not done:
        return ""
    return (f"; revoked its earlier child key{'s' if len(done) > 1 else ''} "
            f"{', '.join(done)} first (at most one live key per host)")


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


def _remember(session: Session, path: str, record: keyrecord.KeyRecord, info: keyapi.ChildKey,
              api: str, service: str, job: str | None) -> None:
    """A reused key the ledger does not know (another clone, a wiped state dir): record it,
    so this workstation's cleanup revokes it too. The API and service recorded are the
    workstation's own (the record's are the host's word), the name the API's."""
    child = {"key_hash": record.hash, "api": api, "service": service, "name": info.name,
             "job": job or ""}
    if not any(e.key_hash == record.hash for e in state.live_minted()):
        state.record(ledger_entry(session, path, record.fingerprint, "minted", **child))
    entry = ledger_entry(session, path, record.fingerprint, "placed", **child)
    if not in_ledger(entry):
        state.record(entry)


__all__ = ["place_minted"]
