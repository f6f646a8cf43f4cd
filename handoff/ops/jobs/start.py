"""A launch's last steps on each host: `start-job` per job (the role's launch command,
detached, `job.json` recording what was launched) and `check-jobs` (one round trip after
the start watch, `start_watch_s`: a job that died fails the host with its log's tail), and
the sampling vars the jobs run with.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from handoff.config import flags
from handoff.config.layout import job_key_path
from handoff.config.templates import render_command
from handoff.defaults import BUILTIN_VARS
from handoff.errors import RemoteError
from handoff.host import remote_code
from handoff.host.targets import Target
from handoff.ops.jobs.probe import Resumed
from handoff.ops.jobs.state import JobState, job_vars
from handoff.ops.jobs.upload import LaunchPrivate, input_file
from handoff.run.plan import HostContext, Skipped, Step


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
    exclude: str | None = None  # a shard taken over: the ids in hand to leave out (moves)


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
    used = command_var_names(role.launch)
    out: dict[str, Any] = {}
    for name in flags.SAMPLING:
        if name in used and target.vars.get(name) is not None:
            out[name] = flags.sampling_var(name, target.vars[name])
    return out


def command_var_names(tokens: Any) -> set[str]:
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


def _start(ctx: HostContext, step: Step) -> str:
    s, facts = ctx.session, ctx.need_facts()
    role = s.target.role
    assert role is not None  # plan() refused targets without a launch command
    p = step.args(StartJob)
    job, shard = p.job, p.shard
    finished = ctx.report.data_as(Resumed).finished.get(job)
    if finished is not None:
        # Every id of this shard is recorded: a process would start, find nothing to do and
        # end. None is started (`fab fetch` brings the outputs; `--job NAME` runs it anew).
        return Skipped(f"job {job} {finished}: not started again (fab fetch brings its "
                       f"outputs; another --job runs the input anew)")
    jobs = ctx.private_as(LaunchPrivate).jobs
    j = next(j for j in jobs if j.job == job)
    input_path = s.abs(j.input_path)
    chosen = sampling(s.target)  # checked when the plan was built: the same vars
    own = job in ctx.report.data_as(Resumed).own_keys  # a budget: the job's own key (jobs.keys)
    key = job_key_path(s.abs(str(s.vars["key_path"])), job) if own else None
    exclude = s.abs(p.exclude) if p.exclude else None
    command = render_command(role.launch, job_vars(s, facts, job, {"input": input_path, "shard": shard,
                                                                   "max_cost": p.share,
                                                                   "exclude_ids": exclude, **chosen},
                                                   key_path=key),
                             f"role {role.name} launch")
    jd = s.layout.job(job)
    sha = j.dataset.sha256 if j.dataset is not None else facts.file(input_file(job)).sha256
    meta = {"job": job, "role": role.name, "kind": role.kind, "shard": shard, "hosts": p.hosts,
            "shard_hosts": list(p.shard_hosts), "prompts": p.prompts,
            "input": input_path, "input_sha256": sha,
            "dataset": str(j.dataset.path) if j.dataset is not None else None,
            "max_cost": p.max_cost, "host_max_cost": p.share,
            "key": "job" if own else "host",  # which key it runs on (jobs.keys)
            "exclude_ids": exclude,  # a shard taken over: the ids in hand, left out
            # what the payload was told (unset ones: the payload's defaults)
            "sampling": {name: chosen.get(name) for name in flags.SAMPLING},
            "started": time.time(), "host": s.label}
    # Started without the watch: check-jobs watches every job of the launch at once.
    answer: dict[str, Any] = s.run_code(remote_code.JOBS, {"op": "start", "job_dir": jd,
                                                           "command": command, "meta": meta,
                                                           "watch_s": 0},
                                        "starting the job", timeout=60)
    ctx.report.data_as(Resumed).started.append(job)
    notes = ((f", shard {shard}" if shard else "") + (f", budget ${p.share}" if p.share else "")
             + (", on its own key" if own else ""))
    return f"started {job} (pid {answer.get('pid')}) in {jd}{notes}"


def _check(ctx: HostContext, step: Step) -> str:
    """Each job started a second ago: still running, finished (nothing to do), or dead."""
    s = ctx.session
    p = step.args(CheckJobs)
    finished = ctx.report.data_as(Resumed).finished
    names = [name for name in p.jobs if name not in finished]
    if not names:  # nothing was started: nothing to watch
        ctx.report.summary = "; ".join(f"{name} {why}" for name, why in finished.items())
        return Skipped("no job started: " + ctx.report.summary)
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
    parts += [f"{name} {why}, not started" for name, why in finished.items()]
    ctx.report.summary = "job " + "; ".join(parts)
    return Skipped(", ".join(parts))
