"""`fab launch` as a plan: probe, push the input, start the job detached.

Per host, in order:
1. `probe` (reads only): the release and (for a role that takes it) the key are on the
   host, and the job is not already running (a second copy is refused);
2. `push-input` (with `--input`): the local prompts file to `<remote_dir>/data/<name>`,
   skipped when the host already holds the same bytes (sha256 compared on the host);
   `set-key-limit` (with a budget): the host's minted child key limited to its share of
   the job's budget (handoff.jobs.budget);
3. `start-job`: the role's `launch` command, detached, in `<remote_dir>/jobs/<job>/`;
   host i of n runs `--shard i/n`. A command that dies at once fails the host with its
   log's last lines; one that finished within that second (nothing left to do) is fine.

Everything the command needs that is wrong before any host is touched (no input, no
launch command in the role, a var the command needs unset) fails the whole launch with
exit 2, and `--dry-run` shows the plan without connecting.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handoff import remote_code
from handoff.errors import HandoffError, RemoteError, UsageError
from handoff.facts import KEY_FILE, gather
from handoff.jobs import budget
from handoff.jobs.state import JobState, command_vars, job_name, job_vars, read, require_deployed
from handoff.plan import HostContext, HostPlan, Plan, Skipped, Step
from handoff.roles import render_command
from handoff.targets import Target
from handoff.transfer import mkdirs, temp_prefix, upload_file
from payload import units

INPUT_FILE = "input"  # the name the probe reports the pushed input under


@dataclass(frozen=True)
class LocalInput:
    """`--input`: a local prompts file, pushed to each host's data folder."""

    path: Path
    sha256: str
    size: int

    @classmethod
    def of(cls, flag: str) -> LocalInput:
        path = Path(flag).expanduser()
        if not path.is_file():
            raise UsageError(f"--input {flag}: no such file")
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        return cls(path, digest.hexdigest(), path.stat().st_size)


def plan(targets: list[Target], *, local_input: str | None, remote_input: str | None,
         job_flag: str | None, shard: bool = True) -> Plan:
    """The launch plan; raises UsageError/RoleError for what no host could fix."""
    if local_input and remote_input:
        raise UsageError("give --input (a local file) or --remote-input (a file on the hosts), not both")
    local = LocalInput.of(local_input) if local_input else None
    result = Plan("launch", [], private={"input": local})
    n = len(targets)
    for i, target in enumerate(targets):
        role = target.role
        if role is None or not role.launch:
            raise UsageError(f"{target.label}: role {role.name if role else None!r} has no launch command")
        job = job_name(target, job_flag)
        lay = target.layout
        if local is not None:
            input_path = lay.data_file(local.path.name)
        elif remote_input:
            input_path = remote_input
        elif target.vars.get("input"):
            input_path = str(target.vars["input"])
        else:
            raise UsageError("no input: pass --input LOCAL.jsonl or --remote-input PATH (or set the `input` var)")
        shard_spec = f"{i}/{n}" if shard and n > 1 else None
        params = {"job": job, "input": input_path, "shard": shard_spec}
        # Rendered now with the paths as configured (`~` unresolved), so a missing var stops
        # the launch before any host is touched, and the dry run shows the real command.
        preview = render_command(role.launch, command_vars(
            target, lay.root, str(target.vars["python"]), str(target.vars["key_path"]), job,
            {"input": input_path, "shard": shard_spec}), f"role {role.name} launch")
        steps = [Step("probe", f"probe the host: release{' and key' if role.secret else ''} "
                               f"present, job {job} not running",
                      f"{target.vars['python']} -c <remote_code/probe.py>; "
                      f"-c <remote_code/jobs.py> state (reads only)", "always", params,
                      run=_probe, changes=False)]
        if local is not None:
            folder = lay.data
            steps.append(Step(
                "push-input", f"push {local.path.name} ({units.size(local.size)}, sha256 "
                              f"{local.sha256[:12]}) to {input_path}",
                f"sftp put {folder}/{temp_prefix(local.path.name)}* then rename to {input_path}",
                "unless the host holds the same file (sha256 compared on the host)", params,
                run=_push_input))
        if target.vars.get("max_cost") is not None and role.secret:
            # The key's own limit enforces this host's share too (handoff.jobs.budget).
            steps.append(budget.limit_step(target, budget.host_share(float(target.vars["max_cost"]), n), [job]))
        steps.append(Step(
            "start-job", f"start job {job} detached in {lay.job(job)}"
                         + (f", shard {shard_spec}" if shard_spec else ""),
            f"setsid nohup {preview} >>log 2>&1 </dev/null (pid to {lay.job(job)}/pid; "
            f"~ is the login user's home)",
            "always (the probe refuses a second copy)", params, run=_start))
        result.hosts.append(HostPlan(target, steps))
    return result


def _probe(ctx: HostContext, step: Step) -> str:
    s, job = ctx.session, str(step.params["job"])
    files = {KEY_FILE: str(s.vars["key_path"])}
    if ctx.plan.private.get("input") is not None:
        files[INPUT_FILE] = str(step.params["input"])
    ctx.facts = gather(s, None, files=files)
    require_deployed(s, ctx.facts, s.target.role)
    current = read(s, job)
    if current.alive:
        raise HandoffError(
            f"{s.label}: job {job!r} is already running (pid {current.pid}); "
            f"watch it with `fab status {s.target.flags(job)}`, or stop it first with "
            f"`fab stop {s.target.flags(job)}`"
        )
    return Skipped(f"release {'and key ' if s.target.role and s.target.role.secret else ''}"
                   f"in place; job {job} is {current.state}")


def _push_input(ctx: HostContext, step: Step) -> str:
    local = ctx.private("input")
    s = ctx.session
    name = local.path.name
    if ctx.need_facts().file(INPUT_FILE).sha256 == local.sha256:
        return Skipped(f"input {name} unchanged on the host")
    dest = s.abs(str(step.params["input"]))
    try:
        mkdirs(s.files, dest.rsplit("/", 1)[0], known=ctx.need_facts().dirs)
        upload_file(s.files, local.path, dest, label=s.label)
    except OSError as exc:
        raise RemoteError(f"{s.label}: pushing {name} to {dest} failed: {exc}") from None
    return f"pushed {name} → {dest}"


def _start(ctx: HostContext, step: Step) -> str:
    s, facts = ctx.session, ctx.need_facts()
    role = s.target.role
    assert role is not None  # plan() refused targets without a launch command
    job, shard = str(step.params["job"]), step.params["shard"]
    input_path = s.abs(str(step.params["input"]))
    command = render_command(role.launch, job_vars(s, facts, job, {"input": input_path, "shard": shard}),
                             f"role {role.name} launch")
    jd = s.layout.job(job)
    meta = {"job": job, "role": role.name, "shard": shard, "input": input_path,
            "started": time.time(), "host": s.label}
    answer: dict[str, Any] = s.run_code(remote_code.JOBS, {"op": "start", "job_dir": jd,
                                                           "command": command, "meta": meta},
                                        "starting the job", timeout=60)
    shard_note = f", shard {shard}" if shard else ""
    if not answer.get("started"):
        if JobState.from_json(answer.get("state") or {}).state == "finished":
            ctx.report.summary = f"job {job} finished{shard_note}"
            return f"{job} ran and finished already{shard_note}"
        tail = [str(line) for line in answer.get("log_tail") or []][-6:]
        detail = " / ".join(tail) or f"exit {answer.get('exit')}, nothing in {jd}/log"
        raise RemoteError(f"{s.label}: job {job!r} exited right after start: {detail}")
    pid = answer.get("pid")
    ctx.report.summary = f"job {job} running, pid {pid}{shard_note}"
    return f"started {job} (pid {pid}) in {jd}{shard_note}"
