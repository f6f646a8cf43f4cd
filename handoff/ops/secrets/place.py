"""Placing a key file on a host, 0600 from birth, and the ledger entries that record it.

Over SFTP, never through a command line or `env=`: the key's folder is created 0700 when
missing (an existing one is never chmod'ed, and refused when it is a symlink, another
user's or group/world-writable: `key_location`); a temp name in it is created exclusively with mode 0600 given IN the create request,
so the file is 0600 from the instant it exists; the key is written and fsync'ed; the temp
name is renamed over the final path; `stat` checks mode 0600 and owner = the login user
(anything else is removed and reported). Idempotence is checked on the host: the probe
returns the sha256 of the remote file, compared with the local key's; the key itself never
travels for that.
"""

from __future__ import annotations

import stat
import time

from handoff.config import state
from handoff.config.layout import key_record
from handoff.config.os_keyring import fingerprint, sha256
from handoff.errors import (
    RemoteError,
)
from handoff.host.facts import KEY_FILE, KEY_RECORD, Facts
from handoff.host.session import Session
from handoff.host.transfer import mkdirs, upload_atomic
from handoff.run.plan import Skipped


def ledger_entry(session: Session, path: str, fp: str, event: str, **child: str) -> state.LedgerEntry:
    ep = session.target.endpoint
    return state.LedgerEntry(
        host=session.label, hostname=ep.hostname, port=ep.port, user=ep.user,
        identity=list(ep.identity), path=path, fingerprint=fp, time=time.time(), event=event,
        **child,
    )


def in_ledger(entry: state.LedgerEntry) -> bool:
    return any(e.slot == entry.slot and e.fingerprint == entry.fingerprint for e in state.placed())


def key_location(session: Session, facts: Facts, path: str | None = None) -> str:
    """Where the host's key file (or `path`: a job's own key) really is (the key's folder
    with its symlinks resolved, as the probe saw it): what the ledger records, so cleanup
    removes that very file even if a link on the way is re-pointed. Refuses (RemoteError) a
    key folder another user could change: a symlink, another owner, group/world-writable."""
    path = session.abs(path or str(session.vars["key_path"]))
    folder, name = path.rsplit("/", 1)
    owner = facts.owners.get(folder)
    if owner is None:
        return path  # not there yet: handoff creates it, 0700
    why = owner.unsafe(facts.uid, follow=False)
    if why:
        raise RemoteError(
            f"{session.label}: the key's folder {folder} {why}: another user could swap or "
            f"re-point it, and a later cleanup would miss the key. Nothing was placed. Set the "
            f"`key_path` var to a folder of the login user's own that only it can write "
            f"(handoff creates a missing one 0700), or fix that folder")
    return f"{owner.real or folder}/{name}"


def place(session: Session, facts: Facts, key: str, *, child: dict[str, str] | None = None,
          path: str | None = None, fact: str = KEY_FILE, record_fact: str = KEY_RECORD) -> str:
    """Place `key` at the host's key_path (or `path`, which the probe described as `fact`
    and its record as `record_fact`: a job's own key) unless the same key is already there.
    `child` (a minted key's hash, api, service, name, job) goes into the ledger's entry.
    Placing the API key over a minted one also removes the record that named the minted
    key."""
    path = key_location(session, facts, path)
    fp = fingerprint(key)
    remote = facts.file(fact)
    entry = ledger_entry(session, path, fp, "placed", **(child or {}))
    stale = child is None and facts.file(record_fact).exists
    if remote.exists and remote.sha256 == sha256(key) and remote.mode == 0o600 and remote.uid == facts.uid:
        if stale:
            remove_quietly(session, key_record(path))
        if not in_ledger(entry):
            state.record(entry)
        return Skipped(f"key {fp} already at {path} (0600), nothing written")
    folder = path.rsplit("/", 1)[0]
    files = session.files
    try:
        # Only a folder handoff creates is made private: an existing one (the user's own,
        # say ~/projects, or /tmp) is never chmod'ed; key_location refused an unsafe one.
        if mkdirs(files, folder, 0o700, known=facts.dirs):
            files.chmod(folder, 0o700)
        upload_atomic(files, key.encode("utf-8"), path, 0o600, durable=True)
        st = files.stat(path)
    except OSError as exc:
        raise RemoteError(f"{session.label}: placing the key at {path} failed: {exc}") from None
    mode = stat.S_IMODE(st.mode)
    if mode != 0o600 or st.uid != facts.uid:
        remove_quietly(session, path)
        raise RemoteError(
            f"{session.label}: {path} came out with mode {mode:o} owner uid {st.uid} "
            f"(want 600, uid {facts.uid}); removed it. Check the folder's ACLs / filesystem."
        )
    state.record(entry)
    if stale:
        # The file no longer holds the minted key its record named: the ledger still lists
        # that child key as minted, so `cleanup-secrets` revokes it.
        remove_quietly(session, key_record(path))
    return f"placed key {fp} at {path} (0600, uid {st.uid})"


def remove_quietly(session: Session, path: str) -> None:
    try:
        session.files.remove(path)
    except OSError:
        pass


__all__ = ["in_ledger", "key_location", "ledger_entry", "place", "remove_quietly"]
