"""`fab forget --job JOB`: remove a finished or abandoned job from its hosts, as a plan.

A stopped job stays in `jobs/<job>/` so a relaunch resumes it, and `status` counts it as
not running or finished (exit 1) until then: one abandoned job would make every later
`status` fail. Forgetting removes the job's folder on each host (its outputs too: fetch
first), never while its process runs (checked on the host, in the same round trip:
handoff.host.remote_code.jobs `forget`), then revokes the job's own child key (a job with
a budget has one) and removes its file. The command asks first (or takes `--yes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from handoff.config.layout import job_key_path, key_record
from handoff.errors import RemoteError
from handoff.host import remote_code
from handoff.host.session import Session
from handoff.host.targets import Target
from handoff.ops.jobs.state import JobState, job_name, unknown_job
from handoff.run.plan import HostContext, HostPlan, Plan, Skipped, Step


@dataclass(frozen=True)
class ForgetJob:
    """The job whose folder to remove."""

    job: str


class JobKeyForgetter(Protocol):
    """Revokes a job's own child keys and removes its key file (secrets.minted.JobKeys,
    handed over by the command: handoff.ops.jobs never imports handoff.ops.secrets)."""

    def forget_job_key(self, session: Session, job: str) -> str:
        ...


@dataclass
class ForgetPrivate:
    """What forget's key step reads of its plan's private values."""

    keys: JobKeyForgetter | None = None


def plan(targets: list[Target], *, job_flag: str) -> Plan:
    """Per host: the job's folder removed (never while it runs), then its own key (a job with
    a budget has one: handoff.ops.jobs.keys) revoked and removed."""
    result = Plan("forget", [], private=ForgetPrivate())
    for target in targets:
        job = job_name(target, job_flag)
        jd = target.layout.job(job)
        key = job_key_path(str(target.vars.get("key_path") or target.layout.key_path), job)
        result.hosts.append(HostPlan(target, [Step(
            "forget-job", f"remove job {job}'s folder {jd} (its outputs too), unless it runs",
            f"python -c <remote_code/jobs.py> forget: refuse if <pid in {jd}/pid> is alive, "
            f"else rename {jd} to a hidden name and remove it", "if the job is not running",
            ForgetJob(job), run=_forget), Step(
            "forget-key", f"revoke job {job}'s own child key and remove {key}",
            f"DELETE <management API>/keys/<hash> for every key of ({target.label}, {job}) the "
            f"ledger, {key_record(key)} or GET <management API>/keys names, then GET answers "
            f"404; sftp remove {key} and its record", "if the job has a key of its own",
            ForgetJob(job), run=_forget_key)]))
    return result


def _forget_key(ctx: HostContext, step: Step) -> str:
    keys = ctx.private_as(ForgetPrivate).keys
    job = step.args(ForgetJob).job
    if keys is None:
        return Skipped(f"job {job}'s own key: not looked at (no management keys given)")
    return keys.forget_job_key(ctx.session, job)


def _forget(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    job = step.args(ForgetJob).job
    answer: dict[str, Any] = s.run_code(
        remote_code.JOBS, {"op": "forget", "job_dir": s.target.layout.job(job)},
        "forgetting the job")
    before = JobState.from_json(answer.get("state") or {})
    if answer.get("alive"):
        raise RemoteError(f"{s.label}: job {job!r} is running (pid {before.pid}); stop it first: "
                          f"`fab stop {s.target.flags(job)}`")
    if not answer.get("removed"):
        raise unknown_job(s, job)
    ctx.report.summary = f"forgot {job} ({before.state})"
    return f"removed {before.job_dir} (the job was {before.state})"
