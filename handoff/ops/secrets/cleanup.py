"""cleanup-secrets, the files: every key the ledger lists as placed, and the `key_path` of
every inventory and remembered host (or of the hosts named with --host), temp leftovers
included, removed and then proven gone by a stat.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from handoff import console
from handoff.config import state
from handoff.config.layout import job_keys_folder, key_record, sftp_path
from handoff.defaults import (
    BUILTIN_VARS,
)
from handoff.errors import (
    HandoffError,
    RemoteError,
)
from handoff.host import keyrecord, remote_code, untrusted
from handoff.host.session import Session
from handoff.host.targets import Target
from handoff.host.transfer import remove_leftovers, temp_prefix
from handoff.ops.secrets.place import ledger_entry
from handoff.run.plan import HostContext, HostPlan, Plan, Skipped, Step
from handoff.ssh.endpoint import endpoint, is_alias


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
    # No base_url: a credential call for this host goes to the API the ledger recorded when
    # its key was minted (settings.management_api), never to the built-in default.
    variables = dict(BUILTIN_VARS, key_path=entry.path, base_url="")
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


@dataclass
class KeysRemoved:
    """A host's cleanup: the child key records found beside its key files (each with the
    key file's path: what to revoke), how many files were removed or already absent, and
    the jobs found running there (`running`, once checked; `refused`: the host was left as
    it was for them, nothing removed or revoked)."""

    records: list[tuple[keyrecord.KeyRecord, str]] = field(default_factory=list)
    removed: int = 0
    absent: int = 0
    checked: bool = False
    running: list[str] = field(default_factory=list)
    refused: bool = False


@dataclass(frozen=True)
class RemoveKey:
    """A key file to remove and the fingerprint the ledger knows it by ("" when unknown);
    `force`: even under a running job."""

    path: str
    fingerprint: str
    force: bool = False


def cleanup_plan(entries: list[state.LedgerEntry] | CleanupScope, force: bool = False) -> Plan:
    """One host per (address, port, user), one remove-key step per key file placed there. A
    host where a job runs is refused (its keys neither removed nor revoked) unless `force`."""
    scope = entries if isinstance(entries, CleanupScope) else CleanupScope(entries)
    by_host: dict[tuple[str, int, str], list[state.LedgerEntry]] = {}
    for e in scope.entries:
        by_host.setdefault((e.hostname, e.port, e.user), []).append(e)
    plan = Plan("cleanup-secrets", [])
    for host, group in by_host.items():
        steps = [Step("remove-key",
                      f"remove the key file {e.path}" + (f" (key {e.fingerprint})" if e.fingerprint else "")
                      + " and the child key record beside it",
                      f"{'warn' if force else 'refuse the host'} if a job runs there (python "
                      f"-c <remote_code/jobs.py> running); sftp "
                      f"read {key_record(e.path)} (the child key to revoke); sftp remove {e.path}, "
                      f"{temp_prefix(e.path.rsplit('/', 1)[-1])}* beside it and the record; stat to "
                      f"prove it gone; ledger: removed",
                      "if present" + ("" if force else ", and no job runs on the host"),
                      RemoveKey(e.path, e.fingerprint, force), run=_remove_key)
                 for e in group]
        # The jobs' own keys beside each host key (a job with a budget has one), also those
        # no ledger here lists (a wiped state dir, another clone's launch).
        folders = sorted({job_keys_folder(e.path) if not e.job else e.path.rsplit("/", 1)[0]
                          for e in group})
        steps.append(Step("remove-job-keys", f"remove every job's own key in {', '.join(folders)} "
                                             f"and the child key records beside them",
                          f"sftp listdir {', '.join(folders)}; read each <job>.key.minted.json "
                          f"(the child key to revoke); remove <job>.key, its temp leftovers and "
                          f"its record; stat to prove them gone", "if there are any",
                          RemoveJobKeys(tuple(folders), force), run=_remove_job_keys))
        target = scope.targets.get(host) or _ledger_target(group[0])
        plan.hosts.append(HostPlan(target, steps))
    return plan


@dataclass(frozen=True)
class RemoveJobKeys:
    """The folders of the jobs' own keys on a host (`<key folder>/jobs`)."""

    folders: tuple[str, ...]
    force: bool = False


def _remove_job_keys(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    p = step.args(RemoveJobKeys)
    _check_running(ctx, p.force)
    done = ctx.report.data_as(KeysRemoved)
    removed: list[str] = []
    for folder in p.folders:
        try:
            names = s.files.listdir(folder)
        except OSError:
            continue  # no folder: no job ever had a key of its own here
        for name in sorted(names):
            if untrusted.name_problem(name) is not None or name.startswith("."):
                continue  # temp leftovers go with their key (remove), nothing else is ours
            path = f"{folder}/{name}"
            if name.endswith(".key"):
                record = keyrecord.read_record(s, key_record(path))
                if record is not None:
                    done.records.append((record, path))
                if not isinstance(remove(s, path, ""), Skipped):
                    removed.append(path)
            elif name.endswith(".key.minted.json"):
                record = keyrecord.read_record(s, path)
                if record is not None:
                    done.records.append((record, path.removesuffix(".minted.json")))
                try:
                    s.files.remove(path)
                except OSError:
                    pass
    done.removed += len(removed)
    if not removed:
        return Skipped("no job key file")
    return f"removed {len(removed)} job key file(s): {', '.join(removed)}, verified gone"


def _running_jobs(session: Session) -> list[str] | None:
    """`job (pid N)` for every job still running on the host; None if it cannot be told."""
    try:
        answer = session.run_code(remote_code.JOBS, {"op": "running",
                                                     "jobs_dir": session.target.layout.jobs},
                                  "looking for running jobs", timeout=60)
    except HandoffError:
        return None
    listed = answer.get("running") if isinstance(answer, dict) else None
    return [f"{untrusted.visible(j.get('job'), 100)} (pid {untrusted.count(j.get('pid'))})"
            for j in (listed if isinstance(listed, list) else []) if isinstance(j, dict)]


class JobsRunning(RemoteError):
    """cleanup-secrets left a host as it was: a job runs there (`--force` goes on)."""


def _check_running(ctx: HostContext, force: bool) -> None:
    """Once per host, before anything is removed: the jobs running there. Without `force`
    the host is refused (JobsRunning), its key files and child keys left as they are: a
    revoked key stops its job with 401."""
    s = ctx.session
    done = ctx.report.data_as(KeysRemoved)
    if done.checked:
        return
    done.checked = True
    running = _running_jobs(s)
    label = console.r(s.label)
    if running is None:
        ctx.report.log("  [yellow]warning:[/] could not check for running jobs (no python "
                       "for handoff's remote code on the host?)")
        return
    done.running = running
    if not running:
        return
    jobs = ", ".join(running)
    if not force:
        done.refused = True
        raise JobsRunning(
            f"{s.label}: {'jobs' if len(running) > 1 else 'job'} {jobs} still "
            f"run{'' if len(running) > 1 else 's'} there: nothing was removed or revoked on "
            f"this host (a revoked key stops its job with 401). Stop "
            f"{'them' if len(running) > 1 else 'it'} first (`fab stop --host {s.label}`: "
            f"resumable), or rerun with --force to remove the keys and revoke them anyway")
    ctx.report.log(
        f"  [yellow]warning (--force):[/] {console.r(jobs)} still running on {label}: it read "
        f"its key at start, so removing the file does not stop it; a minted child key is "
        f"revoked below, so its next requests fail (401) and it stops, resumable (exit 3); "
        f"your plain API key is not revoked: such a job goes on until it ends. A relaunch (or "
        f"resume) needs a key again: `fab push-key --host {label}` first.")


def _remove_key(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    p = step.args(RemoveKey)
    path, fp = p.path, p.fingerprint
    _check_running(ctx, p.force)
    record = keyrecord.read_record(s, key_record(path))
    if record is not None:
        ctx.report.data_as(KeysRemoved).records.append((record, path))
    outcome = remove(s, path, fp)
    try:
        s.files.remove(key_record(path))
    except OSError:
        pass
    done = ctx.report.data_as(KeysRemoved)
    if isinstance(outcome, Skipped):
        done.absent += 1
    else:
        done.removed += 1
    return outcome


__all__ = ["CleanupScope", "JobsRunning", "cleanup_entries", "cleanup_plan", "remove"]
