"""`fab stop` as a plan: SIGTERM the job's process and wait for its graceful drain.

One step per host, one round trip (handoff.host.remote_code.jobs `stop`, or `stop_all` without
`--job`: every running job on the host): SIGTERM its pid, then wait up to `--timeout`
seconds for it to exit. The payload drains its in-flight requests for its `--drain-timeout`,
closes the rest and writes its state; `--now` sends a second SIGTERM half a second later,
on which it closes them at once. A relaunch resumes where it stopped (the closed requests
asked again). A job that is not running is left alone (skipped).

A generator in batch mode cancels its live batches itself on SIGTERM. A job whose process
is gone (killed, crashed, the host rebooted) while its ledger still names live batches
would go on costing at the provider: for it the role's `cancel` command runs on the host
(`payload batches --cancel`, with the placed key), one more round trip for that job only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handoff.config.templates import render_command
from handoff.console import visible
from handoff.errors import RemoteError
from handoff.host import remote_code, untrusted
from handoff.host.facts import KEY_FILE, gather
from handoff.host.session import Session
from handoff.host.targets import Target
from handoff.ops.jobs.state import JobState, job_name, job_vars, require_deployed, unknown_job
from handoff.run.plan import HostContext, HostPlan, Plan, Skipped, Step

CANCEL = ("; then, for a job whose process is gone and whose batches are live at the provider, "
          "the role's cancel command (payload batches --cancel)")


def plan(targets: list[Target], *, job_flag: str | None, timeout: float,
         now: bool = False) -> Plan:
    wait_s = max(0.0, float(timeout))
    result = Plan("stop", [])
    wait = f"wait up to {wait_s:.0f} s for the drain" if wait_s else "do not wait"
    if now:
        wait = ("SIGTERM again 0.5 s later (requests in flight closed at once), "
                + wait.replace(" for the drain", ""))
    term = "kill -TERM" + (" twice, 0.5 s apart," if now else "")
    for target in targets:
        if job_flag is None:
            jobs_dir = target.layout.jobs
            step = Step("stop-jobs", f"stop every running job: SIGTERM each, {wait} (stays resumable)",
                        f"python -c <remote_code/jobs.py> stop_all: {term} the pid of each job "
                        f"alive under {jobs_dir}, poll until they exit{CANCEL}",
                        "for each job that is running", StopJobs(None, wait_s, now), run=_stop_all)
        else:
            job = job_name(target, job_flag)
            jd = target.layout.job(job)
            step = Step("stop-job", f"stop job {job}: SIGTERM its process, {wait} (stays resumable)",
                        f"python -c <remote_code/jobs.py> stop: {term} <pid in {jd}/pid>, poll "
                        f"until it exits{CANCEL}", "if the job is running",
                        StopJobs(job, wait_s, now), run=_stop)
        result.hosts.append(HostPlan(target, [step]))
    return result


@dataclass(frozen=True)
class StopJobs:
    """One job to stop (`job`), or every running one (None), waiting `timeout` s for each;
    `now`: a second SIGTERM, so requests in flight are closed without a drain."""

    job: str | None
    timeout: float
    now: bool = False


def _stop(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    p = step.args(StopJobs)
    job, wait_s = str(p.job), p.timeout
    answer: dict[str, Any] = s.run_code(
        remote_code.JOBS, {"op": "stop", "job_dir": s.target.layout.job(job), "timeout": wait_s,
                           "now": p.now},
        "stopping the job", timeout=wait_s + 30)
    after = JobState.from_json(answer.get("state") or {})
    if after.state == "none" and not answer.get("was_alive"):
        raise unknown_job(s, job)  # never launched here: a typo, not "not running"
    if not answer.get("was_alive"):
        if after.live_batches:
            cancelled = cancel_batches(ctx, job, after)
            ctx.report.summary = f"not running ({after.state}); batches cancelled"
            return f"job {job} is not running (state {after.state}); {cancelled}"
        ctx.report.summary = f"not running ({after.state})"
        return Skipped(f"job {job} is not running (state {after.state})")
    _check_drained(s, job, answer.get("pid"), bool(answer.get("drained")), wait_s)
    if after.alive:  # --timeout 0: signalled, not waited for; it still drains
        ctx.report.summary = "SIGTERM sent (draining, not waited for)"
        return (f"sent SIGTERM to {job} (pid {answer.get('pid')}); it drains its in-flight "
                f"requests now (--timeout 0: not waited for; `fab status {s.target.flags(job)}` "
                f"shows when it stopped)")
    ctx.report.summary = f"stopped ({after.state})"
    done = _stopped(job, answer.get("pid"), after)
    return f"{done}; {cancel_batches(ctx, job, after)}" if after.live_batches else done


def _stop_all(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    p = step.args(StopJobs)
    wait_s = p.timeout
    answer: dict[str, Any] = s.run_code(
        remote_code.JOBS, {"op": "stop_all", "jobs_dir": s.target.layout.jobs, "timeout": wait_s,
                           "now": p.now},
        "stopping the jobs", timeout=wait_s + 30)
    stopped = answer.get("jobs") or {}
    # Jobs whose process was already gone but whose batches are live (`batches` of the idle).
    orphans = {untrusted.job_name(name): JobState.from_json(state)
               for name, state in (answer.get("batches") or {}).items()}
    lines = []
    for job, info in sorted(stopped.items()):
        _check_drained(s, job, info.get("pid"), bool(info.get("drained")), wait_s)
        after = JobState.from_json(info.get("state") or {})
        lines.append(_stopped(job, info.get("pid"), after))
        if after.live_batches and not after.alive:
            lines.append(f"{job}: {cancel_batches(ctx, job, after)}")
    for job, after in sorted(orphans.items()):
        if after.live_batches and not after.alive:
            lines.append(f"{job} (not running): {cancel_batches(ctx, job, after)}")
    if not lines:
        idle = answer.get("idle") or []
        ctx.report.summary = "no job running"
        return Skipped(f"no job is running ({len(idle)} job(s) on the host: {', '.join(idle) or 'none'})")
    ctx.report.summary = (f"stopped {', '.join(sorted(stopped))}" if stopped else
                          f"batches cancelled: {', '.join(sorted(orphans))}")
    return "; ".join(lines)


def cancel_batches(ctx: HostContext, job: str, after: JobState) -> str:
    """The role's cancel command on the host, for a job whose process is gone and whose
    ledger names live batches (with the placed key, as the job used it); what it did."""
    s = ctx.session
    role = s.target.role
    n = after.live_batches
    if role is None or not role.cancel:
        raise RemoteError(f"{s.label}: job {job!r} left {n} batch(es) live at the provider, and "
                          f"role {role.name if role else None!r} has no cancel command: relaunch "
                          f"the job to collect them (`fab launch {s.target.flags(job)}`)")
    facts = gather(s, None, files={KEY_FILE: str(s.vars["key_path"])}, hash_files=False)
    require_deployed(s, facts, role)
    res = s.exec(render_command(role.cancel, job_vars(s, facts, job, {}), f"role {role.name} cancel"),
                 timeout=300)
    lines = res.out.strip().splitlines()
    summary, _ = untrusted.read_shape(untrusted.CancelAnswer, _json_line(lines[-1] if lines else ""),
                                      "the cancel command's answer")
    if res.rc != 0 or summary is None:
        tail = (res.err.strip().splitlines() or lines or ["no output"])[-1]
        raise RemoteError(f"{s.label}: job {job!r}: cancelling its {n} live batch(es) failed "
                          f"(exit {res.rc}): {visible(tail, 300)}")
    cancelled = summary.cancelled or 0
    return (f"its process was gone with {n} batch(es) live at the provider: cancelled "
            f"{cancelled} (the rest were ending already); relaunch to record what they "
            f"answered, the rest is asked again")


def _json_line(text: str) -> Any:
    try:
        return untrusted.loads(text, "the cancel command's answer")
    except untrusted.Untrusted:
        return None


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
