"""A job's budget across its hosts, and the child keys' limits that enforce it.

`--max-cost X` (or the `max_cost` var) is the budget of the whole job: host i of n gets
`host_share(X, n)`. `host_share` is the one function that splits it: launch shows it and
passes it on, and `limit_step` makes OpenRouter itself enforce it, so even a payload that
misbehaves cannot spend more: the host's minted child key gets

    limit = what the key has spent so far + (the host's share - what the job spent there)

(PATCH /keys/{hash}). A new job gets its whole share from now on; a resumed one only what
is left of it (the payload's `cost` counts across resumes). A 402 at the key's limit stops
the job resumable (exit 3), like any other budget stop. A host holding the plain API key
has no limit to set: the payload's own `--max-cost` still applies there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from handoff.config import flags
from handoff.config.layout import key_record
from handoff.errors import RemoteError, UsageError
from handoff.host import keyrecord, untrusted
from handoff.host.targets import Target
from handoff.ops import keyapi
from handoff.ops.jobs.state import read
from handoff.run.plan import HostContext, Skipped, Step


def host_share(max_cost: float, hosts: int) -> float:
    """Each host's part of a job's budget: host i of n gets max_cost / n."""
    if hosts < 1:
        raise UsageError("a budget needs at least one host")
    return float(flags.var("max_cost", max_cost, flag="--max-cost") or 0.0) / hosts


def new_limit(usage: float, share: float, spent: float) -> float:
    """The key limit that lets the host spend exactly the rest of its share from now on:
    never more than `share` above what the key has used, whatever `spent` says."""
    return round(usage + min(share, max(0.0, share - spent)), 6)


class ManagementClients(Protocol):
    """Where a step gets a management client (secrets.ManagementKeys, passed by the command
    as the plan's private "management": the management key never enters a plan)."""

    def child_key(self, target: Target, key_hash: str,
                  why: str) -> tuple[keyapi.Client, keyapi.ChildKey | None]:
        """(client at the host's own management API, what it says about `key_hash`): a
        RemoteError when the hash is not a key handoff minted for this host."""
        ...


def limit_step(target: Target, share: float, jobs: list[str]) -> Step:
    """PATCH the host's child key limit to its share of the budget of `jobs` (launched now)."""
    api = target.management_api or "<the inventory's management API>"
    record = key_record(str(target.vars["key_path"]))
    return Step(
        "set-key-limit",
        f"limit the host's child key to its share of the budget: {keyapi.money(share * len(jobs))} "
        f"more from now (job{'s' if len(jobs) > 1 else ''} {', '.join(jobs)}"
        f"{f', {keyapi.money(share)} each' if len(jobs) > 1 else ''})",
        f"sftp read {record} (the key's hash); GET {api}/keys/<hash>; PATCH {api}/keys/<hash> "
        f"limit = usage + share - what the job already spent",
        "if the host holds a minted child key (a plain key has no limit: the payload's "
        "--max-cost still applies)",
        LimitKeys(share, list(jobs)), run=_set_limit)


@dataclass(frozen=True)
class LimitKeys:
    """The host's share of each job's budget, and the jobs launched now."""

    share: float
    jobs: list[str]


@dataclass
class ManagementCarrier:
    """What the limit step reads of the launch plan's private values: where to get a
    management client (set by the command; the management key never enters a plan)."""

    management: ManagementClients | None = None


def _set_limit(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    p = step.args(LimitKeys)
    share, jobs = p.share, p.jobs
    record = keyrecord.read_record(s, s.abs(key_record(str(s.vars["key_path"]))))
    if record is None:
        return Skipped("the host holds the plain API key: no key limit to set (the payload's "
                       "--max-cost still caps the job)")
    clients = ctx.private_as(ManagementCarrier).management
    if clients is None:
        raise RuntimeError("the launch plan carries no management keys")
    # The record only names the hash; the URL and the key's identity are the workstation's.
    client, info = clients.child_key(s.target, record.hash,
                                     "limit the child key to the job's budget (launch --max-cost)")
    if info is None:
        raise RemoteError(f"{s.label}: the host's child key {record.hash[:12]} is revoked; "
                          f"`fab push-key --host {s.label}` mints a new one, then launch again")
    # The usage is the management API's word (on the workstation); the host only says how
    # the job's part of it splits (status.json), and that can only lower the new limit.
    spent = {job: _spent(read(s, job).status) for job in jobs}
    limit = new_limit(info.usage, share * len(jobs), sum(spent.values()))
    after = client.patch(record.hash, limit=limit)
    less = ", ".join(f"{job} already spent {keyapi.money(cost)}" for job, cost in spent.items() if cost)
    return (f"child key {record.hash[:12]} limit {keyapi.money(info.limit)} -> "
            f"{keyapi.money(after.limit)} (used {keyapi.money(info.usage)} + share "
            f"{keyapi.money(share * len(jobs))}{'; ' + less if less else ''})")


def _spent(status: dict[str, Any] | None) -> float:
    """What the job says it spent (status.json), believed only where it lowers the limit:
    a host can make its key stop sooner, never later. A cost that is not a finite number
    >= 0 (`-1000`, `NaN`, a string) counts as 0."""
    cost = untrusted.number((status or {}).get("cost"), minimum=0)
    return cost if cost is not None else 0.0
