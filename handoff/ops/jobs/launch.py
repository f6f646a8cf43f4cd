"""`fab launch` as a plan: probe, push the inputs, start one job per dataset, detached.

One job per dataset: each `--input` file (repeatable, quoted globs expanded) is a job named
after its stem (`data/B3.jsonl` -> `B3`; `--job NAME` with one input; a role's `job` var
names its one job, e.g. the extractor's). Every job is sharded over the targets: host i of
n runs `--shard i/n`, with `max_cost / n` of the job's budget (`budget.host_share`).

Per host, in order:
1. `probe` (reads only, two round trips: the probe, then every job's state): the release
   and (for a role that takes it) the key are there, there is room on the disk for the
   role and the inputs, no job of this launch is running, and each job is bound to the
   input it was first launched with: a job whose recorded sha256 (its `job.json`) differs
   from this input is refused, naming the way out (another `--job`, or moving the old
   job's folder aside with the exact command);
2. `push-input` per local dataset: to `<remote_dir>/data/<name>`, skipped when the host
   holds the same bytes (sha256 compared on the host); `set-key-limit` (with a budget):
   the host's minted child key limited to its share of the jobs' budget;
3. `start-job` per dataset: the role's `launch` command, detached, in
   `<remote_dir>/jobs/<job>/`, `job.json` recording the input's sha256; then `check-jobs`
   (one round trip) watches them all for a second at once: a command that died fails the
   host with its log's last lines; one that finished within that second (nothing left to
   do) is fine.

The plan is all-or-nothing: no host pushes or starts anything until every host has passed
its probe, so a refusal on one host (or one host down) starts nothing anywhere.

Everything wrong before any host is touched (no input, an input with no valid record, two
inputs with one job name, `--job` with several inputs, no launch command in the role, a var
the command needs unset) fails the whole launch with exit 2, and `--dry-run` shows the plan
without connecting.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from handoff.config import flags
from handoff.config.roles import render_command
from handoff.defaults import BUILTIN_VARS
from handoff.errors import HandoffError, RemoteError, UsageError
from handoff.host import remote_code
from handoff.host.facts import KEY_FILE, disk_short, gather
from handoff.host.session import Session, sh_path
from handoff.host.targets import Target
from handoff.host.transfer import mkdirs, upload_resumable
from handoff.ops.jobs import budget, datasets
from handoff.ops.jobs.datasets import Dataset
from handoff.ops.jobs.state import (
    JobState,
    command_vars,
    job_name,
    job_vars,
    read_all,
    require_deployed,
)
from handoff.run.plan import HostContext, HostPlan, Plan, Skipped, Step
from payload import units


def input_file(job: str) -> str:
    """The name the probe reports a job's input under."""
    return f"input:{job}"


@dataclass(frozen=True)
class LaunchJob:
    """One job of the launch, the same on every host (its shards)."""

    job: str
    input_path: str  # where the hosts read it, as configured (`~` unresolved)
    dataset: Dataset | None  # the local file pushed there; None: --remote-input / input var


def budget_text(share: float) -> str:
    """A host's share as the payload's --max-cost: rounded DOWN to a micro-dollar, so the
    shares never add up to more than the job's budget."""
    floored = math.floor(share * 1e6 + 1e-6) / 1e6
    return f"{floored:.6f}".rstrip("0").rstrip(".")


@dataclass
class LaunchPrivate(budget.ManagementCarrier):
    """A launch's private values: the jobs it starts (each with its dataset, when local) and,
    from the command, where the limit step gets a management client."""

    jobs: list[LaunchJob] = field(default_factory=list)


def private_of(p: Plan) -> LaunchPrivate:
    """A launch plan's private values (the command sets its management keys)."""
    if not isinstance(p.private, LaunchPrivate):
        raise RuntimeError(f"plan {p.title!r} is not a launch plan")
    return p.private


@dataclass(frozen=True)
class ProbeJobs:
    shard: str | None  # the shard this host is given (a resumed job may have had another)


@dataclass(frozen=True)
class PushInput:
    job: str
    input: str  # where on the host


@dataclass(frozen=True)
class StartJob:
    """One job to start on the host: its input there, shard i/n of `hosts`, the job's budget
    and this host's share of it (as the payload's --max-cost)."""

    job: str
    input: str
    shard: str | None
    hosts: int
    max_cost: float | None
    share: str | None
    # Every host of the launch, in shard order, and the input's prompt count (when read
    # here): job.json records them so `status` can tell a missing shard from a small job.
    shard_hosts: tuple[str, ...] = ()
    prompts: int | None = None


@dataclass(frozen=True)
class CheckJobs:
    jobs: list[str]
    watch_s: float  # how long after the starts their states are read


def start_watch(target: Target) -> float:
    """How long the check after the starts waits before reading the jobs' states: the
    `start_watch_s` var (1 s by default)."""
    return float(flags.var("start_watch_s", target.vars.get("start_watch_s", BUILTIN_VARS["start_watch_s"])) or 0.0)


def sampling(target: Target) -> dict[str, Any]:
    """The generator's sampling and retry vars this host's job runs with (temperature,
    top_p, seed, reasoning, provider, turns, max_timeouts, token_ids: flags.SAMPLING), each
    checked by its rule; only the ones set. They are `payload generate`'s: a role whose
    launch runs another command (the extractor's `reasoning` is include|drop) is not
    checked by them, and a var its command does not name is neither checked nor shown."""
    role = target.role
    if role is None or "generate" not in [t for t in role.launch if isinstance(t, str)]:
        return {}
    used = _command_vars(role.launch)
    out: dict[str, Any] = {}
    for name in flags.SAMPLING:
        if name in used and target.vars.get(name) is not None:
            out[name] = flags.sampling_var(name, target.vars[name])
    return out


def _command_vars(tokens: Any) -> set[str]:
    """The `{var}` names a role's argv tokens use."""
    import string
    names: set[str] = set()
    for tok in tokens:
        for t in (tok if isinstance(tok, list) else [tok]):
            names.update(f for _, f, _, _ in string.Formatter().parse(t) if f)
    return names


def sampling_text(values: dict[str, Any]) -> str:
    """`temperature 1, top_p 0.95, reasoning {"effort":"high"}` for the plan; "" when none."""
    def show(v: Any) -> str:
        return json.dumps(v, separators=(",", ":"), sort_keys=True) if isinstance(v, dict) else str(v)
    return ", ".join(f"{k} {show(v)}" for k, v in values.items())


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


def jobs_of(targets: list[Target], local: list[Dataset] | None, remote_input: str | None,
            job_flag: str | None) -> list[LaunchJob]:
    """The launch's jobs: one per local dataset, else the one remote input (or `input` var)."""
    if local:
        return [LaunchJob(ds.job, targets[0].layout.data_file(ds.name), ds) for ds in local]
    first = targets[0]
    path = remote_input or (str(first.vars["input"]) if first.vars.get("input") else None)
    if not path:
        raise UsageError("no input: pass --input LOCAL.jsonl (repeatable, or a quoted glob) or "
                         "--remote-input PATH (or set the `input` var)")
    return [LaunchJob(job_name(first, job_flag, path), path, None)]


def load_datasets(targets: list[Target], local_inputs: list[str], job_flag: str | None) -> list[Dataset]:
    """The local inputs, expanded, named and checked (handoff.ops.jobs.datasets)."""
    paths = datasets.expand(local_inputs)
    if job_flag and len(paths) > 1:
        raise UsageError(f"--job names one job, but the inputs are {len(paths)} files (one job "
                         f"each, named after the file's stem); drop --job, or launch one input "
                         f"at a time")
    names = [job_name(targets[0], job_flag, p.name) for p in paths]
    return datasets.load(paths, names)


def plan(targets: list[Target], *, local_input: str | list[str] | None, remote_input: str | None,
         job_flag: str | None, shard: bool = True,
         loaded: list[Dataset] | None = None) -> Plan:
    """The launch plan; raises UsageError/RoleError for what no host could fix. `loaded`:
    the local inputs already checked (the command checks them once, for the estimate too)."""
    inputs = [local_input] if isinstance(local_input, str) else list(local_input or [])
    if inputs and remote_input:
        raise UsageError("give --input (local files) or --remote-input (a file on the hosts), not both")
    if not targets:
        raise UsageError("no hosts to launch on")
    local = loaded if loaded is not None else (load_datasets(targets, inputs, job_flag) if inputs else None)
    jobs = jobs_of(targets, local, remote_input, job_flag)
    result = Plan("launch", [], private=LaunchPrivate(jobs=jobs), all_or_nothing=True)
    n = len(targets)
    for i, target in enumerate(targets):
        role = target.role
        if role is None or not role.launch:
            raise UsageError(f"{target.label}: role {role.name if role else None!r} has no launch command")
        lay = target.layout
        shard_spec = f"{i}/{n}" if shard and n > 1 else None
        total = job_budget(target)
        share = budget.host_share(total, n) if total is not None else None
        if share is not None and float(budget_text(share)) <= 0:
            raise UsageError(f"--max-cost {total:g} over {n} hosts leaves each less than $0.000001")
        names = ", ".join(j.job for j in jobs)
        steps = [Step("probe", f"probe the host: release{' and key' if role.secret else ''} present, "
                               f"disk, job{'s' if len(jobs) > 1 else ''} {names} not running and "
                               f"launched with the same input",
                      f"{target.vars['python']} -c <remote_code/probe.py> (sha256 of the inputs); "
                      f"-c <remote_code/jobs.py> list (reads only)", "always",
                      ProbeJobs(shard_spec), run=_probe, changes=False)]
        for j in jobs:
            if j.dataset is not None:
                ds = j.dataset
                steps.append(Step(
                    "push-input", f"push {ds.name} ({units.size(ds.size)}, {ds.check.prompts} "
                                  f"prompts, sha256 {ds.sha256[:12]}) to {j.input_path}",
                    f"sftp put {lay.data}/.{ds.name}.tmp-part (a cut upload's part resumed "
                    f"when its prefix matches: a 2 MiB probe, then its whole sha256 beside the "
                    f"upload) then rename to {j.input_path}",
                    "unless the host holds the same file (sha256 compared on the host)",
                    PushInput(j.job, j.input_path), run=_push_input))
        if share is not None and role.secret:
            # The key's own limit enforces this host's share too (handoff.ops.jobs.budget).
            steps.append(budget.limit_step(target, share, [j.job for j in jobs]))
        chosen = sampling(target)
        for j in jobs:
            extra = {"input": j.input_path, "shard": shard_spec,
                     "max_cost": budget_text(share) if share is not None else None, **chosen}
            # Rendered now with the paths as configured (`~` unresolved), so a missing var
            # stops the launch before any host is touched, and the dry run shows the command.
            preview = render_command(role.launch, command_vars(
                target, lay.root, str(target.vars["python"]), str(target.vars["key_path"]),
                j.job, extra), f"role {role.name} launch")
            money = (f", budget ${budget_text(share)} of the job's ${total:g}" if share is not None
                     and total is not None else "")
            steps.append(Step(
                "start-job", f"start job {j.job} detached in {lay.job(j.job)}"
                             + (f", shard {shard_spec}" if shard_spec else "") + money
                             + (f"; sampling: {sampling_text(chosen)}" if chosen else ""),
                f"setsid nohup {preview} >>log 2>&1 </dev/null (pid to {lay.job(j.job)}/pid; "
                f"~ is the login user's home)",
                "once every host passed its probe",
                StartJob(j.job, j.input_path, shard_spec, n, total, extra["max_cost"],
                         tuple(t.label for t in targets),
                         j.dataset.check.prompts if j.dataset is not None else None),
                run=_start))
        steps.append(Step(
            "check-jobs", f"check that job{'s' if len(jobs) > 1 else ''} {names} still run a "
                          f"second later (or finished: nothing left to do)",
            f"python -c <remote_code/jobs.py> check: wait {start_watch(target):g} s, then each "
            f"job's state and, for one that exited, its log's tail", "after the starts",
            CheckJobs([j.job for j in jobs], start_watch(target)), run=_check, changes=False))
        result.hosts.append(HostPlan(target, steps))
    return result


# --- on the host ----------------------------------------------------------------------------


def _probe(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    jobs = ctx.private_as(LaunchPrivate).jobs
    files = {KEY_FILE: str(s.vars["key_path"])}
    files.update({input_file(j.job): j.input_path for j in jobs})
    ctx.facts = facts = gather(s, None, files=files)
    role = s.target.role
    require_deployed(s, facts, role)
    # Room for the role, and for each input that is not there yet.
    incoming = sum(j.dataset.size for j in jobs
                   if j.dataset is not None and facts.file(input_file(j.job)).sha256 != j.dataset.sha256)
    short = disk_short(facts, role, s.layout.root, incoming)
    if short:
        raise HandoffError(f"{s.label}: {short}; nothing was started")
    host_jobs = read_all(s)
    problems = []
    for j in jobs:
        current = host_jobs.get(j.job)
        if current.alive:
            problems.append(f"job {j.job!r} is already running (pid {current.pid}); watch it with "
                            f"`fab status {s.target.flags(j.job)}`, or stop it first with "
                            f"`fab stop {s.target.flags(j.job)}`")
            continue
        if j.dataset is None and not facts.file(input_file(j.job)).exists:
            problems.append(f"input {j.input_path} of job {j.job!r} is not on the host; put it "
                            f"there, or pass --input LOCAL.jsonl to push it")
            continue
        problem = identity_problem(s, j, current, facts.file(input_file(j.job)).sha256)
        if problem:
            problems.append(problem)
    if problems:
        raise HandoffError(f"{s.label}: " + "; ".join(problems) + " (nothing was started on any host)")
    # "job B3: new" rather than the state's own word for a job never launched ("none").
    states = ", ".join(f"job {j.job}: " + ("new" if host_jobs.get(j.job).state == "none" else
                                          f"was {host_jobs.get(j.job).state}, resumes") for j in jobs)
    # A job resumed over another set of hosts gets another share of the ids: say so (ids
    # another host already did may be asked again here; the merge keeps each id once).
    shard = step.args(ProbeJobs).shard
    moved = []
    for j in jobs:
        meta = host_jobs.get(j.job).meta
        if meta is not None and meta.get("shard") != shard:
            moved.append(f"{j.job} was shard {meta.get('shard') or 'all'} here, now {shard or 'all'}")
    note = f" (resharded: {'; '.join(moved)})" if moved else ""
    return Skipped(f"release {'and key ' if role and role.secret else ''}in place, "
                   f"{units.size(facts.disk_free)} free; {states}{note}")


def identity_problem(s: Session, j: LaunchJob, current: JobState, remote_sha: str | None) -> str | None:
    """Why this launch may not run under job `j.job` on this host: the job exists and was
    launched with another input. None when it is new, or its input is the same."""
    sha = j.dataset.sha256 if j.dataset is not None else remote_sha
    meta = current.meta or {}
    recorded = current.input_sha256
    if recorded and sha and recorded == sha:
        return None
    if recorded is None:
        # A job from before inputs were recorded: known by the path it read.
        old_path = meta.get("input")
        if not old_path or old_path == s.abs(j.input_path):
            return None
        was = f"another input ({old_path})"
    else:
        was = f"another input (sha256 {recorded[:12]}, {meta.get('input', '?')})"
    if sha is None:
        return None
    old_dir = s.layout.job(j.job)
    aside = f"{old_dir}-{(recorded or 'old')[:12]}"
    return (f"job {j.job!r} was launched with {was}; this input is sha256 {sha[:12]}, so "
            f"resuming would mix two datasets. Launch it under another name (`--job "
            f"{j.job}-2`), or move the old job aside first (its results stay there, listed as "
            f"job {aside.rsplit('/', 1)[-1]}): {ssh_command(s.target, f'mv {shlex.quote(old_dir)} {shlex.quote(aside)}')}")


def ssh_command(target: Target, command: str) -> str:
    """The plain `ssh` line that runs `command` on the host, for a message to paste. When
    the host's key is pinned in handoff's state dir (trust-host without --known-hosts),
    the line names that file too: plain ssh would answer "Host key verification failed"."""
    from handoff.ssh import hostkeys

    ep = target.endpoint
    hops = ",".join(ep.proxy_jump)
    opts = (f"-p {ep.port} " if ep.port != 22 else "") + "".join(
        f"-i {shlex.quote(i)} " for i in ep.identity[:1]) + (f"-J {shlex.quote(hops)} " if hops else "")
    pinned = hostkeys.state.pinned_keys_path()
    names = hostkeys.names_for(ep.hostname, ep.port, ep.host_key_alias)
    if any(e.matches(names) for e in hostkeys.read_file(pinned)):
        files = " ".join([str(pinned), *(ep.known_hosts or ("~/.ssh/known_hosts",))])
        opts += f"-o {shlex.quote('UserKnownHostsFile=' + files)} "
    return f"`ssh {opts}{ep.user}@{ep.hostname} {shlex.quote(command)}`"


def _push_input(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    jobs = ctx.private_as(LaunchPrivate).jobs
    j = next(j for j in jobs if j.job == step.args(PushInput).job)
    assert j.dataset is not None  # push-input steps exist only for local datasets
    ds = j.dataset
    if ctx.need_facts().file(input_file(j.job)).sha256 == ds.sha256:
        return Skipped(f"input {ds.name} unchanged on the host")
    dest = s.abs(j.input_path)
    try:
        mkdirs(s.files, dest.rsplit("/", 1)[0], known=ctx.need_facts().dirs)
        notes: list[str] = []
        resumed = upload_resumable(s.files, ds.path, dest, label=s.label,
                                   remote_sha256=lambda path, n: _prefix_sha256(s, path, n),
                                   remote_probe=lambda path, n: _probe_sha256(s, path, n),
                                   notes=notes)
    except OSError as exc:
        raise RemoteError(f"{s.label}: pushing {ds.name} to {dest} failed: {exc}; run the "
                          f"launch again to resume the upload") from None
    more = f" (resumed after {units.size(resumed)})" if resumed else ""
    said = "".join(f"; not resumed: {note}" for note in notes)
    return f"pushed {ds.name} → {dest}{more}{said}"


def _prefix_sha256(s: Session, path: str, n: int) -> str | None:
    """The sha256 of the first `n` bytes of `path` on the host (computed there: a resumed
    upload checks its part file without reading it back)."""
    res = s.exec(f"head -c {int(n)} {sh_path(path)} | sha256sum")
    return res.out.split()[0] if res.rc == 0 and res.out.split() else None


def _probe_sha256(s: Session, path: str, n: int) -> str | None:
    """The probe sha256 of the first `n` bytes of `path` on the host (their first and last
    MiB: remote_code.fetch_list's `hash` mode), the cheap check before a resumed upload."""
    answer = s.run_code(remote_code.FETCH_LIST, {"hash": {path: int(n)}, "probe": True},
                        "checking the uploaded part")
    digests = answer.get("sha256") if isinstance(answer, dict) else None
    digest = digests.get(path) if isinstance(digests, dict) else None
    return digest if isinstance(digest, str) else None


def _start(ctx: HostContext, step: Step) -> str:
    s, facts = ctx.session, ctx.need_facts()
    role = s.target.role
    assert role is not None  # plan() refused targets without a launch command
    p = step.args(StartJob)
    job, shard = p.job, p.shard
    jobs = ctx.private_as(LaunchPrivate).jobs
    j = next(j for j in jobs if j.job == job)
    input_path = s.abs(j.input_path)
    chosen = sampling(s.target)  # checked when the plan was built: the same vars
    command = render_command(role.launch, job_vars(s, facts, job, {"input": input_path, "shard": shard,
                                                                   "max_cost": p.share, **chosen}),
                             f"role {role.name} launch")
    jd = s.layout.job(job)
    sha = j.dataset.sha256 if j.dataset is not None else facts.file(input_file(job)).sha256
    meta = {"job": job, "role": role.name, "shard": shard, "hosts": p.hosts,
            "shard_hosts": list(p.shard_hosts), "prompts": p.prompts,
            "input": input_path, "input_sha256": sha,
            "dataset": str(j.dataset.path) if j.dataset is not None else None,
            "max_cost": p.max_cost, "host_max_cost": p.share,
            # what the payload was told (unset ones: the payload's defaults)
            "sampling": {name: chosen.get(name) for name in flags.SAMPLING},
            "started": time.time(), "host": s.label}
    # Started without the watch: check-jobs watches every job of the launch at once.
    answer: dict[str, Any] = s.run_code(remote_code.JOBS, {"op": "start", "job_dir": jd,
                                                           "command": command, "meta": meta,
                                                           "watch_s": 0},
                                        "starting the job", timeout=60)
    notes = (f", shard {shard}" if shard else "") + (f", budget ${p.share}" if p.share else "")
    return f"started {job} (pid {answer.get('pid')}) in {jd}{notes}"


def _check(ctx: HostContext, step: Step) -> str:
    """Each job started a second ago: still running, finished (nothing to do), or dead."""
    s = ctx.session
    p = step.args(CheckJobs)
    names = list(p.jobs)
    answer: dict[str, Any] = s.run_code(remote_code.JOBS, {"op": "check", "jobs_dir": s.layout.jobs,
                                                           "jobs": names,
                                                           "watch_s": p.watch_s},
                                        "checking the jobs", timeout=60)
    parts, dead = [], []
    for name in names:
        raw = (answer.get("jobs") or {}).get(name) or {}
        current = JobState.from_json(raw)
        if current.alive:
            parts.append(f"{name} running (pid {current.pid})")
        elif current.state == "finished":
            parts.append(f"{name} ran and finished already")
        else:
            tail = [str(line) for line in raw.get("log_tail") or []][-6:]
            dead.append(f"job {name!r} exited right after start: "
                        f"{' / '.join(tail) or f'nothing in {current.job_dir}/log'}")
    if dead:
        raise RemoteError(f"{s.label}: " + "; ".join(dead))
    ctx.report.summary = "job " + "; ".join(parts)
    return Skipped(", ".join(parts))
