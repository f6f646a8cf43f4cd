"""`fab forget --job JOB`: remove a finished or abandoned job from its hosts, as a plan.

A stopped job stays in `jobs/<job>/` so a relaunch resumes it, and `status` counts it as
not running or finished (exit 1) until then: one abandoned job would make every later
`status` fail. Forgetting removes the job's folder on each host (its outputs too: fetch
first), never while its process runs (checked on the host, in the same round trip:
handoff.host.remote_code.jobs `forget`). The command asks first (or takes `--yes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handoff.errors import RemoteError
from handoff.host import remote_code
from handoff.host.targets import Target
from handoff.ops.jobs.state import JobState, job_name, unknown_job
from handoff.run.plan import HostContext, HostPlan, Plan, Step


@dataclass(frozen=True)
class ForgetJob:
    """The job whose folder to remove."""

    job: str


def plan(targets: list[Target], *, job_flag: str) -> Plan:
    result = Plan("forget", [])
    for target in targets:
        job = job_name(target, job_flag)
        jd = target.layout.job(job)
        result.hosts.append(HostPlan(target, [Step(
            "forget-job", f"remove job {job}'s folder {jd} (its outputs too), unless it runs",
            f"python -c <remote_code/jobs.py> forget: refuse if <pid in {jd}/pid> is alive, "
            f"else rename {jd} to a hidden name and remove it", "if the job is not running",
            ForgetJob(job), run=_forget)]))
    return result


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
