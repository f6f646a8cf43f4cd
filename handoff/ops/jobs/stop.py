"""`fab stop` as a plan: SIGTERM the job's process and wait for its graceful drain.

One step per host, one round trip (handoff.host.remote_code.jobs `stop`, or `stop_all` without
`--job`: every running job on the host): SIGTERM its pid, then wait up to `--timeout`
seconds for it to exit. The payload drains its in-flight requests and writes its state; a
relaunch resumes where it stopped. A job that is not running is left alone (skipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handoff.errors import RemoteError
from handoff.host import remote_code
from handoff.host.session import Session
from handoff.host.targets import Target
from handoff.ops.jobs.state import JobState, job_name, unknown_job
from handoff.run.plan import HostContext, HostPlan, Plan, Skipped, Step


def plan(targets: list[Target], *, job_flag: str | None, timeout: float) -> Plan:
    wait_s = max(0.0, float(timeout))
    result = Plan("stop", [])
    wait = f"wait up to {wait_s:.0f} s for the drain" if wait_s else "do not wait"
    for target in targets:
        if job_flag is None:
            jobs_dir = target.layout.jobs
            step = Step("stop-jobs", f"stop every running job: SIGTERM each, {wait} (stays resumable)",
                        f"python -c <remote_code/jobs.py> stop_all: kill -TERM the pid of each job "
                        f"alive under {jobs_dir}, poll until they exit",
                        "for each job that is running", StopJobs(None, wait_s), run=_stop_all)
        else:
            job = job_name(target, job_flag)
            jd = target.layout.job(job)
            step = Step("stop-job", f"stop job {job}: SIGTERM its process, {wait} (stays resumable)",
                        f"python -c <remote_code/jobs.py> stop: kill -TERM <pid in {jd}/pid>, poll "
                        f"until it exits", "if the job is running", StopJobs(job, wait_s),
                        run=_stop)
        result.hosts.append(HostPlan(target, [step]))
    return result


@dataclass(frozen=True)
class StopJobs:
    """One job to stop (`job`), or every running one (None), waiting `timeout` s for each."""

    job: str | None
    timeout: float


def _stop(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    p = step.args(StopJobs)
    job, wait_s = str(p.job), p.timeout
    answer: dict[str, Any] = s.run_code(
        remote_code.JOBS, {"op": "stop", "job_dir": s.target.layout.job(job), "timeout": wait_s},
        "stopping the job", timeout=wait_s + 30)
    after = JobState.from_json(answer.get("state") or {})
    if after.state == "none" and not answer.get("was_alive"):
        raise unknown_job(s, job)  # never launched here: a typo, not "not running"
    if not answer.get("was_alive"):
        ctx.report.summary = f"not running ({after.state})"
        return Skipped(f"job {job} is not running (state {after.state})")
    _check_drained(s, job, answer.get("pid"), bool(answer.get("drained")), wait_s)
    if after.alive:  # --timeout 0: signalled, not waited for; it still drains
        ctx.report.summary = "SIGTERM sent (draining, not waited for)"
        return (f"sent SIGTERM to {job} (pid {answer.get('pid')}); it drains its in-flight "
                f"requests now (--timeout 0: not waited for; `fab status {s.target.flags(job)}` "
                f"shows when it stopped)")
    ctx.report.summary = f"stopped ({after.state})"
    return _stopped(job, answer.get("pid"), after)


def _stop_all(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    wait_s = step.args(StopJobs).timeout
    answer: dict[str, Any] = s.run_code(
        remote_code.JOBS, {"op": "stop_all", "jobs_dir": s.target.layout.jobs, "timeout": wait_s},
        "stopping the jobs", timeout=wait_s + 30)
    stopped = answer.get("jobs") or {}
    if not stopped:
        idle = answer.get("idle") or []
        ctx.report.summary = "no job running"
        return Skipped(f"no job is running ({len(idle)} job(s) on the host: {', '.join(idle) or 'none'})")
    lines = []
    for job, info in sorted(stopped.items()):
        _check_drained(s, job, info.get("pid"), bool(info.get("drained")), wait_s)
        lines.append(_stopped(job, info.get("pid"), JobState.from_json(info.get("state") or {})))
    ctx.report.summary = f"stopped {', '.join(sorted(stopped))}"
    return "; ".join(lines)


def _check_drained(s: Session, job: str, pid: Any, drained: bool, wait_s: float) -> None:
    if not drained and wait_s > 0:
        raise RemoteError(
            f"{s.label}: job {job!r} (pid {pid}) still draining after {wait_s:.0f} s; "
            f"check `fab status {s.target.flags(job)}`, or wait and rerun "
            f"`fab stop {s.target.flags(job)}`"
        )


def _stopped(job: str, pid: Any, after: JobState) -> str:
    st = after.status or {}
    return (f"sent SIGTERM to {job} (pid {pid}); state now {after.state}, done {st.get('done', '?')}, "
            f"failed {st.get('failed', '?')} (resumable: relaunch continues)")
