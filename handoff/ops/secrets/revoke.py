"""cleanup-secrets, the child keys: every one the ledger lists as minted, every one a
host's record names, and every one the management API itself lists under a name handoff
gives the cleaned hosts' keys (`handoff:<any workstation>:<host>[:<job>]`: the ledger is a
cache, the API is the truth), `DELETE /keys/{hash}` then `GET` answering 404. An
unreachable host's key is revoked all the same: its file may remain, dead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from handoff import console, threads
from handoff.config import state
from handoff.defaults import (
    SECRET_SERVICE,
)
from handoff.errors import (
    HandoffError,
    KeyAPIError,
)
from handoff.host.targets import Target
from handoff.ops import keyapi
from handoff.ops.secrets.cleanup import CleanupScope, KeysRemoved
from handoff.ops.secrets.settings import ManagementKeys, management_api, vouch
from handoff.run.parallel import HostReport


@dataclass(frozen=True)
class Revocation:
    """A child key to revoke: its hash, the API and keyring service of its management key,
    and where it was placed (for people). `target` is set for a key only a host's record
    names: it is revoked only once the API vouches it is that host's (settings.vouch)."""

    key_hash: str
    api: str
    service: str
    host: str
    path: str
    name: str = ""
    target: Target | None = None


def revocations(scope: CleanupScope, reports: list[HostReport] | None = None) -> list[Revocation]:
    """The ledger's live minted keys of the cleaned hosts, plus every child key a host's
    record named (found by the remove steps), each once."""
    found: dict[str, Revocation] = {}
    for e in scope.minted:
        found.setdefault(e.key_hash, Revocation(e.key_hash, e.api, e.service or SECRET_SERVICE,
                                                e.host, e.path, e.name))
    for report in reports or []:
        for record, path in report.data_as(KeysRemoved).records:
            if record.hash in found:
                continue
            target = report.target
            try:  # the workstation's URL for this host, never the record's
                api = management_api(target)
            except KeyAPIError as exc:
                api = f"<unknown: {exc}>"
            found[record.hash] = Revocation(
                record.hash, api, str(target.vars.get("secret_service") or SECRET_SERVICE),
                target.label, path, record.name, target)
    return list(found.values())


def listed_at_api(scope: CleanupScope, keys: ManagementKeys, known: set[str],
                  skip: set[str] | frozenset[str] = frozenset()) -> tuple[list[Revocation], list[str]]:
    """The child keys the management API lists under a name handoff gives a cleaned host's
    keys, by any workstation and for any job (keyapi.ChildName), that are not in `known`
    yet: what the ledger and the hosts' records do not name (a wiped state dir, another
    clone, a key copied away and its record deleted). Asked at the inventory's management
    API and at every API the ledger recorded for these hosts, with the management key of
    each one's keyring service (none stored: nothing to ask). Also what could not be asked.
    The hosts in `skip` (refused: a job runs there) are not asked about."""
    hosts = ({t.label for t in scope.targets.values()} | {e.host for e in scope.entries}
             | {e.host for e in scope.minted}) - set(skip)
    apis: dict[str, str] = {}  # API -> keyring service of its management key
    for t in scope.targets.values():
        if t.management_api:
            apis.setdefault(t.management_api.rstrip("/"),
                            str(t.vars.get("secret_service") or SECRET_SERVICE))
    for e in scope.minted:
        if e.api:
            apis.setdefault(e.api.rstrip("/"), e.service or SECRET_SERVICE)
    found: list[Revocation] = []
    problems: list[str] = []
    if not hosts:
        return found, problems
    for api, service in apis.items():
        try:
            creds = keys.credentials(service)
            if not creds.management_key:
                continue  # no management key stored: handoff minted nothing with it here
            listed = creds.client(api, "list child keys").listed(
                lambda name: (parsed := keyapi.ChildName.parse(name)) is not None
                and parsed.host in hosts)
        except HandoffError as exc:
            problems.append(f"the child keys at {api} could not be listed ({exc}): a key "
                            f"minted for these hosts that neither the ledger nor a host's "
                            f"record names may still live; rerun once it answers")
            continue
        for key in listed:
            if key.hash in known:
                continue
            known.add(key.hash)
            parsed = keyapi.ChildName.parse(key.name)
            host = parsed.host if parsed is not None else "?"
            found.append(Revocation(key.hash, api, service, host,
                                    "(named at the management API)", key.name))
    return found, problems


def minting_in_use(scope: CleanupScope, reports: list[HostReport]) -> bool:
    """Whether anything says child keys were minted for these hosts: the ledger ever minted
    one, a host held a record, a host's key_mode is `minted`. Then a management API that
    cannot be listed is an error; otherwise (plain keys only, say a keyring that cannot be
    reached from this shell) only a warning."""
    return (any(e.event == "minted" for e in state.ledger_events())
            or any(r.data_as(KeysRemoved).records for r in reports)
            or any(str(t.vars.get("key_mode") or "") == "minted" for t in scope.targets.values()))


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
            if r.target is not None:
                # Named only by a host's record: at the host's own API, and only if it is
                # that host's key (a record naming another key revokes nothing).
                client = keys.for_host(r.target, "revoke child keys")
                if vouch(client, r.target, r.key_hash) is None:
                    return  # already gone: 404 at the workstation's API
            else:
                client = keys.client(r.api, r.service, "revoke child keys")
            result.deleted = client.revoke(r.key_hash)
        except HandoffError as exc:
            result.error = str(exc)
            return
        state.record(state.LedgerEntry(host=r.host, hostname="", port=0, user="", identity=[],
                                       path=r.path, fingerprint="", time=time.time(),
                                       event="revoked", key_hash=r.key_hash, api=r.api,
                                       service=r.service, name=r.name))

    threads.each(results, one, workers=len(results), name="revoke")
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
    rows.append(["(each host)", "-", f"and every child key GET <management API>/keys lists named "
                                     f"{keyapi.NAME_PREFIX}<any workstation>:<host>[:<job>], the "
                                     f"same way"])
    return console.table("then revoke the child keys", ["host", "key hash", "runs"], rows)


def cleanup_summary(reports: list[HostReport], revoked: list[Revoked]) -> tuple[bool, list[str]]:
    """(all clean?, what to tell): files removed / already absent, child keys revoked, and
    for each host that could not be cleaned whether what may remain there is dead."""
    removed = sum(r.data_as(KeysRemoved).removed for r in reports)
    absent = sum(r.data_as(KeysRemoved).absent for r in reports)
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
        if r.data_as(KeysRemoved).refused:
            lines.append(why)  # left as it was for its running jobs: the error says so
            continue
        dead = [x.revocation for x in revoked if x.revocation.host == label and not x.error]
        if dead:
            keys = ", ".join(f"{d.key_hash[:12]} ({d.path})" for d in dead)
            lines.append(f"{why} Its key file may remain there, but the child key it holds is "
                         f"revoked, so it is dead: {keys}. Rerun `fab cleanup-secrets` when the "
                         f"host is back to remove the file.")
        else:
            lines.append(f"{why} Its key file may remain there and still work; rerun `fab "
                         f"cleanup-secrets --host {label}` when the host is reachable (the host "
                         f"itself is checked: this works with the state dir gone too).")
    for x in failed:
        lines.append(f"child key {x.revocation.key_hash[:12]} ({x.revocation.host}) is NOT "
                     f"revoked: {x.error}")
    return not down and not failed, lines


__all__ = ["Revocation", "Revoked", "cleanup_summary", "listed_at_api", "minting_in_use", "revocation_plan",
           "revocation_table", "revocations", "revoke_all"]
