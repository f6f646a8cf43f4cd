"""A launch's first step on each host, `probe` (reads only, two round trips: the probe, then
every job's state): the release and (for a role that takes it) the key are there, there is
room on the disk, no job of this launch runs, and each job is bound to the input it was
first launched with (`identity_problem`, naming the way out, with a pasteable `ssh` line).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from handoff.config.layout import job_key_path, key_record
from handoff.errors import HandoffError
from handoff.host.facts import (
    KEY_FILE,
    KEY_RECORD,
    disk_short,
    gather,
    job_key_fact,
    job_record_fact,
)
from handoff.host.session import Session
from handoff.host.targets import Target
from handoff.host.untrusted import count
from handoff.ops.jobs.budget import spent_of
from handoff.ops.jobs.state import HostJobs, JobState, read_all, require_deployed
from handoff.ops.jobs.upload import LaunchJob, LaunchPrivate, input_file
from handoff.run.plan import HostContext, Skipped, Step
from payload import units


@dataclass(frozen=True)
class ProbeJobs:
    shards: dict[str, str | None]  # per job, the shard this host is given (a resumed job may
    # have had another)


def _probe(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    jobs = ctx.private_as(LaunchPrivate).jobs
    key_path = str(s.vars["key_path"])
    files = {KEY_FILE: key_path, KEY_RECORD: key_record(key_path)}
    files.update({input_file(j.job): j.input_path for j in jobs})
    for j in jobs:  # a job's own key, if it has one (a job with a budget: jobs.keys)
        own = job_key_path(key_path, j.job)
        files.update({job_key_fact(j.job): own, job_record_fact(j.job): key_record(own)})
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
    given = step.args(ProbeJobs).shards
    found = resumed(host_jobs, given)

    def said(job: str) -> str:
        # "job B3: new" rather than the state's own word for a job never launched ("none").
        current = host_jobs.get(job)
        if job in found.finished:
            return f"job {job}: {found.finished[job]}: nothing to start"
        return f"job {job}: " + ("new" if current.state == "none" else f"was {current.state}, resumes")

    states = ", ".join(said(j.job) for j in jobs)
    # A job resumed over another set of hosts gets another share of the ids: say so (ids
    # another host already did may be asked again here; the merge keeps each id once).
    moved = []
    for j in jobs:
        meta = host_jobs.get(j.job).meta
        if meta is not None and meta.get("shard") != given.get(j.job):
            moved.append(f"{j.job} was shard {meta.get('shard') or 'all'} here, now "
                         f"{given.get(j.job) or 'all'}")
    ctx.report.data = found
    note = f" (resharded: {'; '.join(moved)})" if moved else ""
    return Skipped(f"release {'and key ' if role and role.secret else ''}in place, "
                   f"{units.size(facts.disk_free)} free; {states}{note}")


@dataclass
class Resumed:
    """What a launch's probe found of its jobs on one host, for the estimate of what is left
    (`estimate.already_done`): per job already launched here, the ids of this host's shard
    recorded as done or failed (a resumed run asks neither again), or None when the host
    held another shard of it (resharded: which of those ids this shard owns is unknown). A
    job new on the host is not listed."""

    recorded: dict[str, int | None] = field(default_factory=dict)
    # The jobs this launch started here (start-job): the command records their layout.
    started: list[str] = field(default_factory=list)
    # What each job already launched here says it spent (its status.json, checked: only
    # ever lowers a key's limit), and the jobs that run on a child key of their own
    # (jobs.keys: a budget on a host whose key is minted).
    spent: dict[str, float] = field(default_factory=dict)
    own_keys: set[str] = field(default_factory=set)
    # Jobs that finished here with this very shard and input: every id is recorded, so
    # starting one again would only find nothing to do. What it finished with, said.
    finished: dict[str, str] = field(default_factory=dict)


def resumed(host_jobs: HostJobs, shards: dict[str, str | None]) -> Resumed:
    """The host's `Resumed` for the jobs launched (each with the shard it is given here),
    from the job states the probe read (their status.json, checked: a count the host got
    wrong counts as none done, so the estimate stays an upper bound)."""
    found = Resumed()
    for job, shard in shards.items():
        current = host_jobs.get(job)
        if current.state == "none":
            continue
        found.spent[job] = spent_of(current.status)
        if current.meta is None or current.meta.get("shard") != shard:
            found.recorded[job] = None
            continue
        st = current.status or {}
        done, failed = count(st.get("done")) or 0, count(st.get("failed")) or 0
        found.recorded[job] = done + failed
        if current.state == "finished":
            found.finished[job] = (f"finished already ({done} done, {failed} failed"
                                   + (", more than --max-failed allows: they are in "
                                      "output.errors.jsonl" if current.with_failures else "")
                                   + ")")
    return found


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
    from handoff.config.state import pinned_keys_path
    from handoff.ssh import hostkeys

    ep = target.endpoint
    hops = ",".join(ep.proxy_jump)
    opts = (f"-p {ep.port} " if ep.port != 22 else "") + "".join(
        f"-i {shlex.quote(i)} " for i in ep.identity[:1]) + (f"-J {shlex.quote(hops)} " if hops else "")
    pinned = pinned_keys_path()
    names = hostkeys.names_for(ep.hostname, ep.port, ep.host_key_alias)
    if any(e.matches(names) for e in hostkeys.read_file(pinned)):
        files = " ".join([str(pinned), *(ep.known_hosts or ("~/.ssh/known_hosts",))])
        opts += f"-o {shlex.quote('UserKnownHostsFile=' + files)} "
    return f"`ssh {opts}{ep.user}@{ep.hostname} {shlex.quote(command)}`"
