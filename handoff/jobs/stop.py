"""`fab stop` as a plan: SIGTERM the job's process and wait for its graceful drain.

One step per host, one round trip (handoff.remote_code.jobs `stop`): when the job runs,
SIGTERM its pid, then wait up to `--timeout` seconds for it to exit. The payload drains
its in-flight requests and writes its state; a relaunch resumes where it stopped. A job
that is not running is left alone (the step is skipped).
"""

from __future__ import annotations

from typing import Any

from handoff import remote_code
from handoff.errors import RemoteError
from handoff.jobs.state import JobState, job_name
from handoff.plan import HostContext, HostPlan, Plan, Skipped, Step
from handoff.targets import Target


def plan(targets: list[Target], *, job_flag: str | None, timeout: float) -> Plan:
    wait_s = max(0.0, float(timeout))
    result = Plan("stop", [])
    for target in targets:
        job = job_name(target, job_flag)
        jd = target.layout.job(job)
        wait = f"wait up to {wait_s:.0f} s for the drain" if wait_s else "do not wait"
        result.hosts.append(HostPlan(target, [Step(
            "stop-job", f"stop job {job}: SIGTERM its process, {wait} (stays resumable)",
            f"python -c <remote_code/jobs.py> stop: kill -TERM <pid in {jd}/pid>, poll until it exits",
            "if the job is running", {"job": job, "timeout": wait_s}, run=_stop)]))
    return result


def _stop(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    job, wait_s = str(step.params["job"]), float(step.params["timeout"])
    answer: dict[str, Any] = s.run_code(
        remote_code.JOBS, {"op": "stop", "job_dir": s.target.layout.job(job), "timeout": wait_s},
        "stopping the job", timeout=wait_s + 30)
    after = JobState.from_json(answer.get("state") or {})
    if not answer.get("was_alive"):
        ctx.report.summary = f"not running ({after.state})"
        return Skipped(f"job {job} is not running (state {after.state})")
    pid = answer.get("pid")
    if not answer.get("drained") and wait_s > 0:
        raise RemoteError(
            f"{s.label}: job {job!r} (pid {pid}) still draining after {wait_s:.0f} s; "
            f"check `fab status {s.target.flags(job)}`, or wait and rerun "
            f"`fab stop {s.target.flags(job)}`"
        )
    st = after.status or {}
    ctx.report.summary = f"stopped ({after.state})"
    return (f"sent SIGTERM to pid {pid}; state now {after.state}, done {st.get('done', '?')}, "
            f"failed {st.get('failed', '?')} (resumable: relaunch continues)")
