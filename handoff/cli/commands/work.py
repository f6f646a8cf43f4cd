"""The jobs' commands: `smoke-test`, `launch` (its estimate first), `status` (`--wait`),
`jobs`, `forget`, `logs`, `stop`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from handoff import console
from handoff.cli.commands import common
from handoff.cli.commands.common import (
    Interrupted,
    ask,
    exit_code,
    guarded,
    only_reading,
    run_plan,
    targets_for,
)
from handoff.config import flags as _flag
from handoff.errors import UsageError
from handoff.run.parallel import HostsInterrupted
from payload import units


@guarded
def smoke_test(host: str | None, role: str | None, model: str | None = None) -> int:
    """One real request per host with the placed key."""
    from handoff.config import state
    from handoff.ops.jobs import smoke

    targets = targets_for(host, role, {"model": model})
    try:
        reports = smoke.run(targets, common.CONNECT)
    except HostsInterrupted as exc:
        lines = [f"  {r.target.label}: " + ("answered (above)" if r.target.label in exc.ended and r.ok
                                            else "failed (above)" if r.target.label in exc.ended
                                            else "cut: its one request may have been sent (it "
                                                 "costs one request, nothing else)")
                 for r in exc.reports]
        raise Interrupted("\n".join(["interrupted (Ctrl-C) during smoke-test, which changes "
                                      "nothing on the hosts; on each host:", *lines,
                                      "nothing was recorded for launch's estimate: `fab "
                                      "smoke-test` again measures"])) from None
    if len(reports) > 1:  # one host: its block already shows every line the table would
        console.say(smoke.table(reports))
    for rep in reports:  # launch's estimate reads what was measured, per API and model
        measured = rep.data_as(smoke.Smoked).measured if rep.ok else None
        if measured is not None:
            v = rep.target.vars
            state.save_smoke(str(v.get("base_url") or ""), str(v.get("model") or ""),
                             {**measured, "host": rep.target.label})
    return exit_code(reports)


@guarded
def launch(
    host: str | None,
    role: str | None,
    *,
    local_input: str | list[str] | None,
    remote_input: str | None,
    flags: dict[str, Any],
    shard: bool = True,
    dry_run: bool = False,
    take_over: str | None = None,
    dest: str | None = None,
) -> int:
    """Start one job per dataset detached on each host, sharded i/n (a relaunch over the
    hosts that run a job's shards: each its own again); the estimate first (of every
    prompt), and on a relaunch, once the hosts have answered, the estimate of what is left.
    `take_over`: move that host's shard of the job to the one `host` (its last fetched copy
    under `dest` says what is in hand)."""
    from handoff.config import shards as shard_layouts
    from handoff.ops.jobs import estimate
    from handoff.ops.jobs import launch as launch_plan
    from handoff.ops.jobs.probe import Resumed
    from handoff.ops.secrets import minted
    from handoff.run import plan

    values = dict(flags)
    job_flag = values.pop("job", None)
    for name in ("concurrency", "max_tokens", "max_cost"):  # each by its one rule
        values[name] = _flag.var(name, values.get(name), flag="--" + name.replace("_", "-"))
    for name in _flag.SAMPLING:  # temperature, top_p, seed, reasoning, provider, turns, ...
        values[name] = _flag.sampling_var(name, values.get(name), flag="--" + name.replace("_", "-"))
    targets = targets_for(host, role, values)
    inputs = [local_input] if isinstance(local_input, str) else list(local_input or [])
    # Every local input is read once, here: checked (an all-bad file stops the launch before
    # any host is touched), measured for the estimate, hashed for the job's identity.
    sharded = shard and len(targets) > 1
    loaded = (launch_plan.load_datasets(targets, inputs, job_flag, len(targets) if sharded else 1)
              if inputs and not remote_input else None)
    placements = _placements(targets, loaded, remote_input, job_flag, sharded=shard,
                             take_over=take_over, dest=dest, dry_run=dry_run)
    p = launch_plan.plan(targets, local_input=inputs, remote_input=remote_input, job_flag=job_flag,
                         shard=shard, loaded=loaded, placements=placements)
    for ds in loaded or []:
        n = ds.check.prompts
        line = f"{ds.job}: {ds.path} ({units.size(ds.size)}), {n} prompt{'s' if n != 1 else ''}"
        if ds.check.duplicates:
            line += f", {ds.check.duplicates} repeated ids (done once)"
        if ds.check.bad:
            console.warn(f"{line}; {ds.check.bad_summary()}: skipped, never sent")
        else:
            console.say(line)
    # An extractor reads features, it asks no API: its own estimate, no budget (issue 32 #9).
    extractor = targets[0].role is not None and targets[0].role.kind == "extractor"
    if loaded and extractor:
        console.say(estimate.extractor_table(loaded, len(targets), note=(
            "a relaunch extracts only the samples not written yet")))
    elif loaded:
        rows, basis = estimate.rows_for(loaded, targets)
        # Before any host answers, every prompt counts: a relaunch asks only what is left.
        note = ("on a relaunch only the prompts not done yet are asked: "
                + ("a dry run contacts no host to count them" if dry_run else
                   "what is left is said once the hosts answer"))
        console.say(estimate.table(rows, basis, len(targets),
                                   int(targets[0].vars.get("concurrency") or 1), note=note))
        for warning in estimate.budget_warnings(rows, launch_plan.job_budget(targets[0])):
            console.warn(warning)
        mode = targets[0].vars.get("mode")
        if mode in ("batch", "auto"):
            console.say(f"--mode {mode}: {'where the server has one, ' if mode == 'auto' else ''}"
                        "the provider's Batch API, at about half the synchronous price this "
                        "estimate is at; answers within 24 h, not in the time above")
    private = launch_plan.private_of(p)
    budget_line = None if extractor else launch_plan.budget_line(targets, [j.job for j in private.jobs])
    if budget_line:
        console.say(budget_line)
    # A job with a budget runs on a child key of its own where the hosts hold minted keys:
    # the management key is read (once, on this workstation) only if a host turns out to.
    private.management = minted.JobKeys()
    for placed in placements.values():
        for line in placed.notes:
            console.warn(console.r(line))
    if dry_run:
        return run_plan(p, dry_run)
    for placed in placements.values():
        move = placed.take_over
        if move is not None:
            # The source may only seem dead (a partition): its key for the job dies first, so
            # it cannot go on asking what the taker now asks.
            found = _resolved(move.source)
            if not found:
                console.warn(f"{move.source} is no host of the inventory any more: its child key "
                             f"for job {move.job} (if any) is not revoked now; `fab "
                             f"cleanup-secrets` revokes it")
                continue
            revoked = private.management.revoke_job_keys(found[0], move.job) if isinstance(
                private.management, minted.JobKeys) else []
            if revoked:
                console.note(f"revoked {move.source}'s child key for job {move.job} "
                             f"({', '.join(h[:12] for h in revoked)}): it cannot ask any more")
    # The shard layout is the workstation's: recorded here for each job a host started (or
    # may have, cut by a Ctrl-C), so status, jobs and fetch never judge it by a host's
    # job.json, and a merge takes a taker's records of the shard it took over.
    advice = p.next_after_interrupt

    def record_then_advise(progress: dict[str, Any]) -> str:
        cut = {step.params.job for pr in progress.values()
               for step in [*(s for s, _ in pr.acted), *([pr.current] if pr.current else [])]
               if step.action == "start-job"}
        for job in cut:
            shard_layouts.record(job, placements[job].launch)
        return advice(progress) if advice else ""

    p.next_after_interrupt = record_then_advise
    reports = plan.execute(p, connect=common.CONNECT)
    started = {job for r in reports if isinstance(r.data, Resumed) for job in r.data.started}
    for j in private.jobs:
        if j.job in started:
            shard_layouts.record(j.job, placements[j.job].launch)
    if loaded and not extractor and all(isinstance(r.data, Resumed) for r in reports):  # every probe answered
        done = estimate.already_done([r.data_as(Resumed).recorded for r in reports],
                                     sharded=shard and len(targets) > 1)
        for line in estimate.left_lines(loaded, targets, done):
            console.say(console.r(line))
    return exit_code(reports)


def _resolved(label: str) -> list[Any]:
    """The host a job's layout names, as the inventory (or ssh_config) resolves it now; []
    when it no longer can (a host dropped from the inventory)."""
    from handoff.errors import HandoffError

    try:
        return list(targets_for(label, None, quiet=True))
    except HandoffError:
        return []


def _placements(targets: Any, loaded: Any, remote_input: str | None, job_flag: str | None, *,
                sharded: bool, take_over: str | None, dest: str | None,
                dry_run: bool) -> dict[str, Any]:
    """Each job's shard per host (handoff.ops.jobs.moves): the recorded layout's on a
    relaunch over the hosts that run it, a take-over's, else cut anew; refused (exit 1,
    nothing started) while a host a relaunch leaves may still run its shard."""
    from handoff.config import paths
    from handoff.config import shards as shard_layouts
    from handoff.errors import HandoffError
    from handoff.ops.jobs import launch as launch_plan
    from handoff.ops.jobs import moves
    from handoff.ops.jobs.start import command_var_names

    jobs = launch_plan.jobs_of(targets, loaded, remote_input, job_flag)
    labels = [t.label for t in targets]
    found: dict[str, Any] = {}
    if dest is not None and take_over is None:
        raise UsageError("--dest goes with --take-over (where the host's last fetched copy is)")
    if take_over is not None:
        if len(jobs) != 1 or len(targets) != 1:
            raise UsageError("--take-over DEAD moves one job's shard to one host: `fab launch "
                             "--job J --take-over DEAD --host NEW` (with the job's --input)")
        j = jobs[0]
        role = targets[0].role
        if role is None or "exclude_ids" not in command_var_names(role.launch):
            raise UsageError(f"--take-over: role {role.name if role else None!r}'s launch command "
                             f"takes no {{exclude_ids}}, so the new host could not leave out what "
                             f"is in hand; a take-over moves a generator job's shard")
        folder = Path(dest).expanduser() if dest else paths.results_dir()
        placed, _ = moves.take_over(j.job, take_over.strip(), targets[0], folder,
                                    input_sha256=j.dataset.sha256 if j.dataset else None,
                                    sharded=sharded)
        if not dry_run:
            source = _resolved(take_over.strip())
            state = moves.states(source, j.job, common.CONNECT)[source[0].label] if source else None
            if state in ("running", "starting", "stopping"):
                raise HandoffError(
                    f"{take_over}: job {j.job} still {state} there: a take-over moves the shard "
                    f"of a host that is gone. Stop it first (`fab stop --job {j.job} --host "
                    f"{take_over}`), fetch it (`fab fetch --job {j.job}`: what it answered is "
                    f"then not asked again), then take over; nothing was started")
            if state is not None:
                placed.notes.append(f"{take_over} is reachable (job {j.job} {state}): its "
                                    f"answers since the last fetch are asked again on "
                                    f"{targets[0].label}; `fab fetch --job {j.job}` first "
                                    f"avoids that")
        return {j.job: placed}
    for j in jobs:
        ds = j.dataset
        placed = moves.placement(j.job, labels, sharded=sharded,
                                 input_sha256=ds.sha256 if ds is not None else None,
                                 prompts=ds.check.prompts if ds is not None else None,
                                 per_shard=ds.check.per_shard if ds is not None else None)
        gone = moves.leaving(placed)
        if gone and not dry_run:
            leavers = [t for label in gone for t in _resolved(label)]
            states: dict[str, str | None] = dict.fromkeys(gone)  # not found: cannot be told
            states.update(moves.states(leavers, j.job, common.CONNECT))
            layout = shard_layouts.load(j.job)
            problem = moves.refusal(j.job, states, labels,
                                    layout.holders if layout is not None else ())
            if problem:
                raise HandoffError(problem)
        layout = shard_layouts.load(j.job)
        if layout is not None and layout.sharded and not placed.reused and (
                ds is None or layout.input_sha256 in (None, ds.sha256)):
            placed.notes.append(moves.reshard_note(j.job, gone, layout))
        found[j.job] = placed
    return found


@guarded
def status(host: str | None, role: str | None, *, job: str | None = None, as_json: bool = False,
           wait: bool = False, interval: float | str | None = None) -> int:
    """Each host's job: state, progress, tok/s, cost, ETA, whether a key is placed."""
    import json

    from handoff.ops.jobs import status as st
    from handoff.ops.secrets import settings

    every = _flag.real("--interval", interval, minimum=0.2, default=2.0)
    assert every is not None
    # Child keys' usage, limit and expiry: from the management API, on this workstation.
    watcher = st.Watcher(targets_for(host, role), job, common.CONNECT,
                         key_lookup=settings.ManagementKeys().lookup)
    live = wait and console.console().is_terminal and not as_json
    try:
        with only_reading("status"):
            views = watcher.collect()
        if wait:
            try:
                # Off a terminal (piped, logged) one line per job per refresh, so the
                # watch shows progress instead of nothing until the end.
                views = st.watch(watcher, views, every, live,
                                 say=None if as_json else console.say)
            except KeyboardInterrupt:
                raise Interrupted(
                    "stopped watching; the jobs keep running on the hosts (`fab status` shows "
                    "them again, `fab stop` ends them)") from None
    finally:
        watcher.close()
    if as_json:
        for v in views:
            print(json.dumps(v.record(), sort_keys=True))
    elif not live:  # the live display leaves its last frame on screen: no second table
        for part in st.status_parts(views):
            console.say(part)
    if not as_json:
        for line in [*st.breakdown_notes(views), *st.batch_notes(views)]:
            console.say(console.r(line))
    for note in [*st.bad_line_notes(views), *st.table_notes(views), *st.layout_notes(views)]:
        console.warn(note)
    bad = [f"{v.host}/{v.job}" if v.job else v.host for v in views if not v.ok]
    if bad and not as_json:
        console.say(f"not running or finished: {console.r(', '.join(bad))}")
    if not as_json and views and all(v.job is None and v.ok for v in views):
        console.say(f"no jobs on {console.r(', '.join(v.host for v in views))}: `fab launch "
                    f"--input FILE` starts one")
    # A shard not seen (its host unreachable, or not asked) is never a success.
    missing = st.unaccounted(views)
    for line in missing:
        console.warn(f"{line}; `fab status` over every host of the job accounts for them "
                     f"(or `fab forget --job JOB` for an abandoned one)")
    return 1 if bad or missing else 0


@guarded
def jobs(host: str | None, role: str | None) -> int:
    """Every job on the hosts: input, shards → hosts, state (one round trip per host)."""
    from handoff.ops.jobs import status as st

    watcher = st.Watcher(targets_for(host, role), None, common.CONNECT)
    try:
        with only_reading("jobs"):
            views = watcher.collect()
    finally:
        watcher.close()
    console.say(st.jobs_table(views))
    down = [v.host for v in views if v.state == "unreachable"]
    for v in views:
        if v.state == "unreachable":
            console.error(str(v.error))
    return 1 if down else 0


@guarded
def forget(host: str | None, role: str | None, *, job: str | None, yes: bool = False,
           dry_run: bool = False) -> int:
    """Remove a finished or abandoned job's folder from the hosts, after confirmation."""
    from handoff.ops.jobs import forget as forgetting

    if not job:
        raise UsageError("fab forget needs --job NAME (the jobs: fab jobs)")
    from handoff.ops.secrets import minted

    targets = targets_for(host, role)
    p = forgetting.plan(targets, job_flag=job)
    p.private = forgetting.ForgetPrivate(minted.JobKeys())  # its own key revoked too
    if dry_run:
        return run_plan(p, dry_run=True)
    if not yes:
        where = ", ".join(t.label for t in targets)
        if not sys.stdin.isatty():
            raise UsageError(f"forgetting job {job!r} removes its folder and outputs on {where}; "
                             f"pass --yes to confirm (fetch first: fab fetch --job {job})")
        answer = ask(f"Remove job {job!r} and its outputs from {where}? (fetch first) [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            console.say("nothing removed")
            return 1
    return run_plan(p, dry_run=False)


@guarded
def logs(host: str | None, role: str | None, *, job: str | None = None, follow: bool = False,
         lines: int | str | None = None) -> int:
    """The job's last log lines; `follow` streams from every host until Ctrl-C."""
    from handoff.ops.jobs import logs as job_logs

    count = _flag.whole("--lines", lines, minimum=0, default=40)
    assert count is not None
    targets = targets_for(host, role)
    if follow:
        return job_logs.follow(targets, job, count, common.CONNECT)
    with only_reading("logs"):
        return exit_code(job_logs.tail(targets, job, count, common.CONNECT))


@guarded
def stop(host: str | None, role: str | None, *, job: str | None = None,
         timeout: float | str | None = None, now: bool = False, dry_run: bool = False) -> int:
    """SIGTERM the job: graceful drain (`now`: none, its requests closed), stays resumable."""
    from handoff.ops.jobs import stop as stop_plan

    wait_s = _flag.real("--timeout", timeout, minimum=0, default=60.0)
    assert wait_s is not None
    return run_plan(stop_plan.plan(targets_for(host, role), job_flag=job, timeout=wait_s,
                                   now=now), dry_run)
