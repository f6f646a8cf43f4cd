"""`fab launch` as a plan: probe, push the inputs, start one job per dataset, detached.

One job per dataset: each `--input` file (repeatable, quoted globs expanded) is a job named
after its stem (`data/B3.jsonl` -> `B3`; `--job NAME` with one input; a role's `job` var
names its one job, e.g. the extractor's). Every job is sharded over the targets: host i of
n runs `--shard i/n`, with `max_cost / n` of the job's budget (`budget.host_share`); a
relaunch over the hosts that run a job gives each its own shard(s) again, and a take-over
moves a dead host's shard (`moves`: the command hands each job's placement to `plan`).

Per host, in order:
1. `probe` (reads only, two round trips: the probe, then every job's state): the release
   and (for a role that takes it) the key are there, there is room on the disk for the
   role and the inputs, no job of this launch is running, and each job is bound to the
   input it was first launched with: a job whose recorded sha256 (its `job.json`) differs
   from this input is refused, naming the way out (another `--job`, or moving the old
   job's folder aside with the exact command); `check-keys` (reads only: `keys`): which key
   each job runs on, a job whose key would have nothing left refused;
2. `push-input` per local dataset: to `<remote_dir>/data/<name>`, skipped when the host
   holds the same bytes (sha256 compared on the host); `push-exclusions` on a host taking
   a shard over (`moves`); `job-key` per job with a budget: its own child key, limited to
   its share (`keys`);
3. `start-job` per dataset: the role's `launch` command, detached, in
   `<remote_dir>/jobs/<job>/`, `job.json` recording the input's sha256; then `check-jobs`
   (one round trip) watches them all for a second at once: a command that died fails the
   host with its log's last lines; one that finished within that second (nothing left to
   do) is fine.

The plan is all-or-nothing: no host pushes or starts anything until every host has passed
its probe and key check, so a refusal on one host (or one host down) starts nothing
anywhere.

Everything wrong before any host is touched (no input, an input with no valid record, two
inputs with one job name, `--job` with several inputs, no launch command in the role, a var
the command needs unset) fails the whole launch with exit 2, and `--dry-run` shows the plan
without connecting.

The modules of a launch: `upload` (the jobs and their inputs, pushing the local ones,
resumable), `probe` (step 1: the host's checks and a job's identity), `keys` (which key a
job runs on), `moves` (each host's shard; a take-over), `start` (step 3: starting the jobs
and the check after the start watch); this one builds the plan and is the launch's surface
(`__all__`).
"""

from __future__ import annotations

import functools
import math

from handoff.config import flags
from handoff.config.templates import render_command
from handoff.errors import UsageError
from handoff.host.targets import Target
from handoff.ops.jobs import budget, keys, moves
from handoff.ops.jobs.datasets import Dataset
from handoff.ops.jobs.probe import ProbeJobs, _probe, identity_problem, ssh_command
from handoff.ops.jobs.start import (
    CheckJobs,
    StartJob,
    _check,
    _start,
    sampling,
    sampling_text,
    start_watch,
)
from handoff.ops.jobs.state import command_vars
from handoff.ops.jobs.upload import (
    LaunchJob,
    LaunchPrivate,
    input_file,
    jobs_of,
    load_datasets,
    private_of,
    push_step,
)
from handoff.run.plan import HostPlan, HostProgress, Plan, Step


def budget_text(share: float) -> str:
    """A host's share as the payload's --max-cost: rounded DOWN to a micro-dollar, so the
    shares never add up to more than the job's budget."""
    floored = math.floor(share * 1e6 + 1e-6) / 1e6
    return f"{floored:.6f}".rstrip("0").rstrip(".")


def job_budget(target: Target) -> float | None:
    """The job's budget (`--max-cost` or the `max_cost` var), checked; None without one."""
    value = flags.var("max_cost", target.vars.get("max_cost"), flag="--max-cost")
    return None if value is None else float(value)


def budget_line(targets: list[Target], jobs: list[str]) -> str | None:
    """How the budget is split, for the launch output: the job's budget, each host's share."""
    total = job_budget(targets[0]) if targets else None
    if total is None:
        return None
    n = len(targets)
    share = budget_text(budget.host_share(total, n))
    which = f"job {jobs[0]}" if len(jobs) == 1 else f"each of the {len(jobs)} jobs"
    line = (f"budget: ${total:g} for {which} (--max-cost), split over {n} host"
            f"{'s' if n != 1 else ''}: ${share} per host")
    if len(jobs) > 1:
        line += f"; ${total * len(jobs):g} in all"
    return line


def plan(targets: list[Target], *, local_input: str | list[str] | None, remote_input: str | None,
         job_flag: str | None, shard: bool = True,
         loaded: list[Dataset] | None = None,
         placements: dict[str, moves.Placement] | None = None) -> Plan:
    """The launch plan; raises UsageError/RoleError for what no host could fix. `loaded`:
    the local inputs already checked (the command checks them once, for the estimate too);
    `placements`: each job's shard per host (moves.placement: the recorded layout's on a
    relaunch over the same hosts, a take-over's); without them host i of n runs i/n."""
    inputs = [local_input] if isinstance(local_input, str) else list(local_input or [])
    if inputs and remote_input:
        raise UsageError("give --input (local files) or --remote-input (a file on the hosts), not both")
    if not targets:
        raise UsageError("no hosts to launch on")
    local = loaded if loaded is not None else (load_datasets(targets, inputs, job_flag) if inputs else None)
    jobs = jobs_of(targets, local, remote_input, job_flag)
    result = Plan("launch", [], private=LaunchPrivate(jobs=jobs), all_or_nothing=True)
    taken = [p.take_over for p in (placements or {}).values() if p.take_over is not None]
    private_of(result).take_over = taken[0] if taken else None
    n = len(targets)
    labels = [t.label for t in targets]
    placed = placements or {}
    for j in jobs:
        if j.job not in placed:
            placed[j.job] = moves.placement(j.job, labels, sharded=shard, input_sha256=None,
                                            recorded=False)
    for target in targets:
        role = target.role
        if role is None or not role.launch:
            raise UsageError(f"{target.label}: role {role.name if role else None!r} has no launch command")
        lay = target.layout
        total = job_budget(target)
        parts = {j.job: placed[j.job].hosts[target.label] for j in jobs}
        shares: dict[str, float | None] = {}
        for j in jobs:
            a = parts[j.job]
            share = (None if total is None
                     else max(0.0, budget.host_share(total, a.of) * a.runs - a.less))
            if share is not None and not a.less and float(budget_text(share)) <= 0:
                raise UsageError(f"--max-cost {total:g} over {a.of} shards leaves each less "
                                 f"than $0.000001")
            shares[j.job] = share
        names = ", ".join(j.job for j in jobs)
        steps = [Step("probe", f"probe the host: release{' and key' if role.secret else ''} present, "
                               f"disk, job{'s' if len(jobs) > 1 else ''} {names} not running and "
                               f"launched with the same input",
                      f"{target.vars['python']} -c <remote_code/probe.py> (sha256 of the inputs); "
                      f"-c <remote_code/jobs.py> list (reads only)", "always",
                      ProbeJobs({job: a.spec for job, a in parts.items()}), run=_probe,
                      changes=False)]
        if role.secret:
            # Which key each job runs on, and that it has something left: before the gate.
            steps.append(keys.check_step(target, shares, [j.job for j in jobs]))
        steps += [push_step(j, lay.data) for j in jobs if j.dataset is not None]
        for j in jobs:  # a shard taken over: the ids in hand, left out there
            move = placed[j.job].take_over
            if move is not None and move.taker == target.label:
                steps.append(moves.exclusions_step(target, move))
        if role.secret:
            # A budget is its job's: a child key of its own caps it (handoff.ops.jobs.keys).
            steps += [keys.job_key_step(target, job, share) for job, share in shares.items()
                      if share is not None]
        chosen = sampling(target)
        for j in jobs:
            a, share = parts[j.job], shares[j.job]
            extra = {"input": j.input_path, "shard": a.spec,
                     "max_cost": budget_text(share) if share is not None else None,
                     "exclude_ids": f"{lay.job(j.job)}/{moves.EXCLUDE_FILE}" if a.exclude else None,
                     **chosen}
            # Rendered now with the paths as configured (`~` unresolved), so a missing var
            # stops the launch before any host is touched, and the dry run shows the command.
            preview = render_command(role.launch, command_vars(
                target, lay.root, str(target.vars["python"]), str(target.vars["key_path"]),
                j.job, extra), f"role {role.name} launch")
            money = (f", budget ${budget_text(share)} of the job's ${total:g}" if share is not None
                     and total is not None else "")
            launch_of_job = placed[j.job].launch
            steps.append(Step(
                "start-job", f"start job {j.job} detached in {lay.job(j.job)}"
                             + (f", shard {a.spec}" if a.spec else "") + money
                             + (", leaving out the ids already in hand" if a.exclude else "")
                             + (f"; sampling: {sampling_text(chosen)}" if chosen else ""),
                f"setsid nohup {preview} >>log 2>&1 </dev/null (pid to {lay.job(j.job)}/pid; "
                f"~ is the login user's home)",
                "once every host passed its probe",
                StartJob(j.job, j.input_path, a.spec, launch_of_job.shards if a.spec else n, total,
                         extra["max_cost"], launch_of_job.hosts if a.spec else tuple(labels),
                         j.dataset.check.prompts if j.dataset is not None else None,
                         extra["exclude_ids"]),
                run=_start, check=f"`fab status {target.flags(j.job)}` tells whether it runs"))
        steps.append(Step(
            "check-jobs", f"check that job{'s' if len(jobs) > 1 else ''} {names} still run a "
                          f"second later (or finished: nothing left to do)",
            f"python -c <remote_code/jobs.py> check: wait {start_watch(target):g} s, then each "
            f"job's state and, for one that exited, its log's tail", "after the starts",
            CheckJobs([j.job for j in jobs], start_watch(target)), run=_check, changes=False))
        result.hosts.append(HostPlan(target, steps))
    result.next_after_interrupt = functools.partial(after_interrupt, [j.job for j in jobs])
    return result


def after_interrupt(jobs: list[str], progress: dict[str, HostProgress]) -> str:
    """What to do after a Ctrl-C cut a launch. Before any start: rerun it. Once a job started
    (or may have) somewhere: never "rerun the launch", which would answer "already running"
    there and, all or nothing, start nothing anywhere; status shows where it runs, and a stop
    then a launch starts it everywhere (each host resumes where it was)."""
    started = [label for label, pr in progress.items() if pr.started("start-job")]
    if not started:
        return ("no job was started on any host: the launch can be rerun as it is (an input "
                "already pushed is skipped, a cut upload resumes)")
    names = ", ".join(jobs)
    flag = f" --job {jobs[0]}" if len(jobs) == 1 else ""
    every = len(started) == len(progress) and all(
        pr.current is None or pr.current.action != "start-job" for pr in progress.values())
    if every:
        return (f"{'each of ' if len(jobs) > 1 else ''}job{'s' if len(jobs) > 1 else ''} "
                f"{names} runs on every host: nothing to redo; do not rerun the launch (it would "
                f"answer 'already running'); `fab status{flag}` watches it")
    rest = [label for label in progress if label not in started]
    line = (f"job{'s' if len(jobs) > 1 else ''} {names} started (or may have) on "
            f"{', '.join(started)}: do not rerun this launch as it is (where a job runs it "
            f"answers 'already running', and then starts nothing anywhere); `fab "
            f"status{flag}` shows where it runs")
    line += (f"; to start it where it does not run{' (' + ', '.join(rest) + ')' if rest else ''}, "
             f"stop it where it runs (`fab stop{flag}`: it stays resumable), then launch again: "
             f"every host resumes where it was")
    return line


__all__ = ["LaunchJob", "LaunchPrivate", "after_interrupt", "budget_line", "budget_text",
           "identity_problem", "input_file", "job_budget", "jobs_of", "load_datasets",
           "plan", "private_of",
           "sampling", "sampling_text", "ssh_command", "start_watch"]
