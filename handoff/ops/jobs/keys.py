"""Which key each job of a launch runs on, and the job's own key placed: a budget belongs to
its job (issue 32).

On a host whose key is a minted child key (deploy minted it: the record beside the key
says so), a job launched with a budget (`--max-cost`) runs on a child key of its own,
minted for (host, job) at `<key folder>/jobs/<job>.key` with the job's share of the
budget as its limit (`budget.new_limit`), reused by a later launch of the job while it
lives; one live key per (host, job), named `handoff:<workstation>:<host>:<job>` so the
management API lists it. Jobs without a budget run on the host's key, capped by
`key_limit`; no budget ever changes that key, so one job's `--max-cost` never stops
another job. On a host holding the plain API key nothing can be capped at the API: the
payload's own `--max-cost` caps the job.

Two steps per host, around the launch's all-or-nothing gate:
- `check-keys` (reads only, after the probe): each job's key and what it has left; a job
  whose key would have nothing left (its share spent, a host key used up to its limit)
  fails the launch before anything is pushed or started anywhere, naming host, job, used
  and limit;
- `job-key` (per job with a budget, changing): its own key placed or reused, its limit set
  (through the plan's private `management`: handoff.ops.secrets.minted.JobKeys).

`fab forget` revokes a job's own keys and removes the file; `fab cleanup-secrets` does too
(the ledger, the hosts' `jobs/` key folders, the API's list).
"""

from __future__ import annotations

from dataclasses import dataclass

from handoff.config.layout import job_key_path, key_record
from handoff.defaults import KEY_RENEW_BEFORE_S
from handoff.errors import HandoffError, KeyAPIError, ManagementKeyMissing, RemoteError, SecretError
from handoff.host import keyrecord
from handoff.host.facts import KEY_RECORD, job_record_fact
from handoff.host.targets import Target
from handoff.ops import keyapi
from handoff.ops.jobs.budget import ManagementCarrier, ManagementClients, new_limit
from handoff.ops.jobs.probe import Resumed
from handoff.run.plan import HostContext, Skipped, Step

# Less than this left (USD) is nothing: the budget's own unit (launch.budget_text floors to
# a micro-dollar).
NOTHING = 1e-6


@dataclass(frozen=True)
class CheckKeys:
    """The host's share of each job's budget (None: no budget) and the jobs launched."""

    shares: dict[str, float | None]
    jobs: list[str]


@dataclass(frozen=True)
class JobKey:
    """One job's own key to place, with the host's share of its budget."""

    job: str
    share: float


def check_step(target: Target, shares: dict[str, float | None], jobs: list[str]) -> Step:
    api = target.management_api or "<the inventory's management API>"
    names = ", ".join(jobs)
    budgeted = any(share is not None for share in shares.values())
    what = (f"check each job's key has something left: with a minted host key, job"
            f"{'s' if len(jobs) > 1 else ''} {names} run{'' if len(jobs) > 1 else 's'} on "
            + ("a child key of its own, limited to its share of the budget" if budgeted
               else "the host's key, capped by key_limit"))
    return Step("check-keys", what,
                f"sftp read the key records; GET {api}/keys/<hash> (usage, limit); refuse a "
                f"job whose key would have nothing left (reads only)",
                "if the host holds a minted child key (else the payload's --max-cost applies)",
                CheckKeys(dict(shares), list(jobs)), run=_check, changes=False)


def job_key_step(target: Target, job: str, share: float) -> Step:
    api = target.management_api or "<the inventory's management API>"
    path = job_key_path(str(target.vars["key_path"]), job)
    return Step("job-key", f"job {job}'s own child key at {path} (0600), limited to its share of "
                           f"the budget: {keyapi.money(share)} (less what it already spent)",
                f"GET {api}/keys/<hash> (the live key named in {key_record(path)}): reused, "
                f"PATCH its limit = usage + share - spent; else DELETE every earlier key of "
                f"({target.label}, {job}) (the ledger's, the record's, GET {api}/keys named "
                f"{keyapi.NAME_PREFIX}<ws>:{target.label}:{job}), then POST {api}/keys with "
                f"limit = share - spent and place it (O_EXCL 0600, rename)",
                "if the host's key is a minted child key and the job is started",
                JobKey(job, share), run=_job_key,
                check=f"the launch run again reuses the job's key (or mints it); `fab status "
                      f"{target.flags(job)}` shows it once the job runs")


def _clients(ctx: HostContext) -> ManagementClients:
    clients = ctx.private_as(ManagementCarrier).management
    if clients is None:
        raise RuntimeError("the launch plan carries no management keys")
    return clients


def _check(ctx: HostContext, step: Step) -> str:
    """Each job's key and what it has left; refuse (nothing started anywhere) a job whose
    key would have nothing left."""
    s, facts = ctx.session, ctx.need_facts()
    p = step.args(CheckKeys)
    found = ctx.report.data_as(Resumed)
    key_path = s.abs(str(s.vars["key_path"]))
    host_record = (keyrecord.read_record(s, key_record(key_path))
                   if facts.file(KEY_RECORD).exists else None)
    jobs = [job for job in p.jobs if job not in found.finished]  # nothing starts for those
    budgeted = {job: share for job, share in p.shares.items() if share is not None and job in jobs}
    on_host_key = [job for job in jobs if job not in budgeted]
    said: list[str] = []
    if on_host_key:
        said.append(_host_key_left(ctx, host_record, on_host_key))
    empty: list[str] = []
    for job, share in budgeted.items():
        spent = found.spent.get(job, 0.0)
        if host_record is None:  # the plain API key: the payload's --max-cost caps the job
            if share - spent < NOTHING:
                empty.append(f"job {job} has nothing left of its budget share here: spent "
                             f"{keyapi.money(spent)} of {keyapi.money(share)}")
            else:
                said.append(f"{job}: the plain API key, its --max-cost {keyapi.money(share)}")
            continue
        usage, live = 0.0, None
        if facts.file(job_record_fact(job)).exists:
            record = keyrecord.read_record(s, key_record(job_key_path(key_path, job)))
            if record is not None:
                try:
                    _, info = _clients(ctx).child_key(s.target, record.hash,
                                                      f"read job {job}'s key usage")
                except RemoteError:
                    info = None  # not a key of this host's: a new one is minted
                if info is not None and info.live(margin_s=KEY_RENEW_BEFORE_S):
                    usage, live = info.usage, info
        limit = new_limit(usage, share, spent)
        if limit - usage < NOTHING:
            used, of = (usage, limit) if live else (spent, share)
            empty.append(f"job {job}'s key has nothing left: used {keyapi.money(used)} of "
                         f"{keyapi.money(of)} (the job's share of the budget here is "
                         f"{keyapi.money(share)}, and it spent {keyapi.money(spent)})")
            continue
        found.own_keys.add(job)
        said.append(f"{job}: {'its own key reused' if live else 'a key of its own'}, "
                    f"{keyapi.money(limit - usage)} to spend")
    if empty:
        raise HandoffError(f"{s.label}: " + "; ".join(empty) + ". Nothing was started on any "
                           "host: raise --max-cost (the job's whole budget, split over its "
                           "hosts), or launch the input as another --job")
    return Skipped("; ".join(x for x in said if x) or "no job to start")


def _host_key_left(ctx: HostContext, record: keyrecord.KeyRecord | None, jobs: list[str]) -> str:
    """What the host's own key (the jobs without a budget run on it) has left; a HandoffError
    when nothing. Best effort where the management key cannot be read here: the key's own
    402 still stops the jobs."""
    s = ctx.session
    names = f"job{'s' if len(jobs) > 1 else ''} {', '.join(jobs)}"
    clients = ctx.private_as(ManagementCarrier).management
    if record is None:
        return f"{names}: the plain API key (uncapped)"
    if clients is None:
        return f"{names}: the host's key"
    try:
        _, info = clients.child_key(s.target, record.hash, "read the host key's usage")
    except (ManagementKeyMissing, KeyAPIError, SecretError) as exc:
        return f"{names}: the host's key (its usage could not be read: {exc})"
    if info is None:
        raise RemoteError(f"{s.label}: the host's child key {record.hash[:12]} is revoked; `fab "
                          f"push-key --host {s.label}` mints a new one (nothing was started on "
                          f"any host)")
    if info.limit is not None and info.limit - info.usage < NOTHING:
        raise HandoffError(
            f"{s.label}: the host's key has nothing left for {names}: used "
            f"{keyapi.money(info.usage)} of {keyapi.money(info.limit)} (key_limit); nothing was "
            f"started on any host. Give the job a budget (--max-cost: it runs on a key of its "
            f"own), or replace the host's key (`fab cleanup-secrets --host {s.label}`, then `fab "
            f"push-key --host {s.label}`)")
    return f"{names}: the host's key ({info.describe()})"


def _job_key(ctx: HostContext, step: Step) -> str:
    s, facts = ctx.session, ctx.need_facts()
    p = step.args(JobKey)
    found = ctx.report.data_as(Resumed)
    if p.job in found.finished:
        return Skipped(f"job {p.job} {found.finished[p.job]}: not started, no key")
    if p.job not in found.own_keys:
        return Skipped(f"the host holds the plain API key: the payload's --max-cost caps job {p.job}")
    spent = found.spent.get(p.job, 0.0)
    return _clients(ctx).job_key(s, facts, p.job, lambda usage: new_limit(usage, p.share, spent))


__all__ = ["CheckKeys", "JobKey", "check_step", "job_key_step"]
