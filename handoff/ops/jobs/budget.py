"""A job's budget across its hosts, and the limits of the child keys that enforce it.

`--max-cost X` (or the `max_cost` var) is the budget of the whole job: host i of n gets
`host_share(X, n)`. `host_share` is the one function that splits it: launch shows it and
passes it on. On a host whose key is a minted child key, a job with a budget runs on a
child key of its own (handoff.ops.jobs.keys: one per (host, job), at `<key folder>/jobs/
<job>.key`), so OpenRouter itself enforces the job's share and nothing else's:

    limit = what the job's key has spent so far + (the share - what the job spent there)

(`new_limit`; 0 spent on a key minted now). A new job gets its whole share from now on; a
resumed one only what is left of it (the payload's `cost` counts across resumes). A 402 at
the key's limit stops that job, resumable (exit 3), and no other: the host's own key (what
jobs without a budget run on, capped by `key_limit`) is never changed by a budget. A host
holding the plain API key has no limit to set: the payload's own `--max-cost` applies there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from handoff.config import flags
from handoff.errors import UsageError
from handoff.host import untrusted
from handoff.host.facts import Facts
from handoff.host.session import Session
from handoff.host.targets import Target
from handoff.ops import keyapi


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
    """Where a step gets a management client and a job its own key (secrets.minted.JobKeys,
    passed by the command as the plan's private "management": the management key never
    enters a plan, and handoff.ops.jobs never imports handoff.ops.secrets)."""

    def child_key(self, target: Target, key_hash: str,
                  why: str) -> tuple[keyapi.Client, keyapi.ChildKey | None]:
        """(client at the host's own management API, what it says about `key_hash`): a
        RemoteError when the hash is not a key handoff minted for this host."""
        ...

    def job_key(self, session: Session, facts: Facts, job: str,
                limit_for: Callable[[float], float]) -> str:
        """Place job `job`'s own child key on the host (reused while it lives, its limit set
        to `limit_for(usage)`; else minted with `limit_for(0)`); what was done."""
        ...


@dataclass
class ManagementCarrier:
    """What a launch's key steps read of the plan's private values: where to get a
    management client and place a job's own key (set by the command; the management key
    never enters a plan)."""

    management: ManagementClients | None = None


def spent_of(status: dict[str, Any] | None) -> float:
    """What the job says it spent (status.json), believed only where it lowers the limit:
    a host can make its key stop sooner, never later. A cost that is not a finite number
    >= 0 (`-1000`, `NaN`, a string) counts as 0."""
    cost = untrusted.number((status or {}).get("cost"), minimum=0)
    return cost if cost is not None else 0.0
