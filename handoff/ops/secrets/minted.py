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
from collections.abc import Callable

from handoff.config import state
from handoff.config.layout import job_key_path, key_record
from handoff.config.os_keyring import fingerprint, sha256
from handoff.defaults import (
    KEY_RENEW_BEFORE_S,
    MANAGEMENT_KEY_USERNAME,
    SECRET_SERVICE,
)
from handoff.errors import (
    HandoffError,
    KeyAPIError,
    KeyAPIFailed,
    KeyAPIUnreachable,
    ManagementKeyMissing,
    RemoteError,
)
from handoff.host import keyrecord
from handoff.host.facts import KEY_FILE, KEY_RECORD, Facts, gather, job_key_fact, job_record_fact
from handoff.host.session import Session
from handoff.host.targets import Target
from handoff.ops import keyapi
from handoff.ops.secrets.place import in_ledger, key_location, ledger_entry, place
from handoff.ops.secrets.settings import (
    Credentials,
    KeySettings,
    ManagementKeys,
    api_mismatch,
    key_settings,
    management_api,
    names_host,
    vouch,
)
from handoff.run.plan import Skipped


def _child_fields(minted: keyapi.ChildKey, api: str, service: str, job: str | None) -> dict[str, str]:
    return {"key_hash": minted.hash, "api": api, "service": service, "name": minted.name,
            "job": job or ""}


def place_minted(session: Session, facts: Facts, creds: Credentials, settings: KeySettings,
                 job: str | None = None, limit_for: Callable[[float], float] | None = None) -> str:
    """The host's child key (`job` None: the host's own, placed by deploy/push-key), or a
    job's own (at `<key folder>/jobs/<job>.key`, its limit `limit_for(usage)`: set on the
    key reused, `limit_for(0)` on one minted): reuse the live one its record names, else
    revoke every earlier one of that (host, job), mint one, place it and its record.
    Nothing half-done: a key minted here whose placement fails is revoked before the error
    is raised. A host whose base_url is not the management API gets none."""
    target = session.target
    mismatch = api_mismatch(target, str(session.vars.get("base_url") or ""))
    if mismatch:
        raise RemoteError(mismatch)
    api = management_api(target)
    client = creds.client(api)
    own = job_key_path(str(session.vars["key_path"]), job) if job else None
    path = key_location(session, facts, own)  # before anything is minted: an unsafe folder refuses
    record_path = key_record(path)
    fact, record_fact = (job_key_fact(job), job_record_fact(job)) if job else (KEY_FILE, KEY_RECORD)
    remote, on_host = facts.file(fact), facts.file(record_fact)
    record = keyrecord.read_record(session, record_path, on_host.size) if on_host.exists else None
    replaced: keyrecord.KeyRecord | None = record
    why = f"job {job} had no key of its own here" if job else "the host holds no minted key"
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
                if limit_for is not None:
                    after = client.patch(record.hash, limit=limit_for(info.usage))
                    return (f"job {job}'s child key {record.hash[:12]} at {path} is live: reused, "
                            f"limit {keyapi.money(info.limit)} -> {keyapi.money(after.limit)} "
                            f"(used {keyapi.money(info.usage)}){others}")
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
    if limit_for is not None:
        settings = KeySettings(settings.mode, limit_for(0.0), settings.ttl_hours)
    minted = _mint(client, name, settings)
    child = _child_fields(minted.info, api, creds.service, job)
    state.record(ledger_entry(session, path, fingerprint(minted.key), "minted", **child))
    try:
        placed = place(session, facts, minted.key, child=child, path=path, fact=fact,
                       record_fact=record_fact)
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
    note = ("; NOTE: no key_limit is set, so this key is uncapped: a job with a budget "
            "(`fab launch --max-cost`) runs on a capped key of its own" if settings.limit is None
            else "")
    whose = f"job {job}'s child key" if job else "child key"
    return (f"minted {whose} {minted.info.hash[:12]} ({minted.info.describe()}; {why}) and "
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
    if job:
        key_path = job_key_path(key_path, job)
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
            f"{', '.join(done)} first (at most one live key per {'(host, job)' if job else 'host'})")


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


class JobKeys(ManagementKeys):
    """The management key (read lazily, once per command) for what launch and forget do
    with a job's own child key: launch places it (`job_key`), forget revokes it and removes
    its file (`forget_job_key`). Handed to those operations by the command
    (handoff.ops.jobs may not import this package)."""

    def job_key(self, session: Session, facts: Facts, job: str,
                limit_for: Callable[[float], float]) -> str:
        """Place job `job`'s own child key on the host (reused while it lives, its limit
        then set to `limit_for(usage)`; else minted with `limit_for(0)`)."""
        target = session.target
        creds = self.credentials(str(target.vars.get("secret_service") or SECRET_SERVICE))
        return place_minted(session, facts, creds, key_settings(target), job=job,
                            limit_for=limit_for)

    def revoke_job_keys(self, target: Target, job: str) -> list[str]:
        """Revoke every child key of (`target`, `job`) without reaching the host (it may be
        dead: a take-over moves its shard): the ledger's and the ones the management API
        lists named for them. The hashes revoked (none without a management key)."""
        service = str(target.vars.get("secret_service") or SECRET_SERVICE)
        creds = self.credentials(service)
        ep = target.endpoint
        todo = {e.key_hash: e.api for e in state.live_minted()
                if (e.hostname, e.port, e.user) == (ep.hostname, ep.port, ep.user) and e.job == job}
        if not creds.management_key:
            if todo:
                raise ManagementKeyMissing(service, MANAGEMENT_KEY_USERNAME,
                                           f"revoke {target.label}'s child key for job {job}")
            return []
        api = management_api(target)
        client = creds.client(api, f"revoke {target.label}'s child key for job {job}")

        def this_jobs(name: str) -> bool:
            parsed = keyapi.ChildName.parse(name)
            return parsed is not None and parsed.job == job and names_host(name, target)

        for key in client.listed(this_jobs):
            todo.setdefault(key.hash, api)
        for key_hash, where in todo.items():
            client.at(where or api).revoke(key_hash)
            state.record(state.LedgerEntry(
                host=target.label, hostname=ep.hostname, port=ep.port, user=ep.user,
                identity=list(ep.identity), path=job_key_path(str(target.vars["key_path"]), job),
                fingerprint="", time=time.time(), event="revoked", key_hash=key_hash,
                api=where or api, service=service, job=job))
        return list(todo)

    def forget_job_key(self, session: Session, job: str) -> str:
        """Revoke every child key of (this host, `job`) (the ledger's, the one its record
        names, the ones the API lists named for them) and remove its file and record."""
        target = session.target
        path = job_key_path(str(session.vars["key_path"]), job)
        facts = gather(session, None, files={job_key_fact(job): path,
                                             job_record_fact(job): key_record(path)},
                       hash_files=False)
        path = session.abs(path)
        ep = target.endpoint
        ledger = [e for e in state.live_minted()
                  if (e.hostname, e.port, e.user) == (ep.hostname, ep.port, ep.user) and e.job == job]
        on_host = facts.file(job_key_fact(job)).exists or facts.file(job_record_fact(job)).exists
        service = str(target.vars.get("secret_service") or SECRET_SERVICE)
        creds = self.credentials(service)
        if not creds.management_key:
            if ledger or facts.file(job_record_fact(job)).exists:
                raise ManagementKeyMissing(service, MANAGEMENT_KEY_USERNAME,
                                           f"revoke job {job}'s child key")
            if not on_host:
                return Skipped(f"job {job} has no key of its own here")
            said = ""
        else:
            api = management_api(target)
            client = creds.client(api, f"revoke job {job}'s child key")
            record = keyrecord.read_record(session, key_record(path))
            also = None
            if record is not None:
                try:
                    also = record.hash if vouch(client, target, record.hash) is not None else None
                except RemoteError:
                    also = None  # not this host's key: neither used nor revoked
            said = _revoke_earlier(session, client, api, service, job, also=also)
            if not said and not on_host:
                return Skipped(f"job {job} has no key of its own here")
        removed = []
        for name in (path, key_record(path)):
            try:
                session.files.remove(name)
                removed.append(name)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise RemoteError(f"{session.label}: cannot remove {name}: {exc}") from None
        if path in removed:
            state.record(ledger_entry(session, path, "", "removed", job=job))
        what = f"removed {path}" if path in removed else "no key file left"
        return f"job {job}'s own key: {what}{said or '; no live child key of it'}"


__all__ = ["JobKeys", "place_minted"]
