"""The `fab` tasks as plain functions returning an exit code: the command layer.

Each command does only what every command does: pick its targets, build its plan (or call
its read-only operation), run it on the hosts, print the summary and return the exit code.
What happens ON a host lives with the thing it acts on:

| concern | module |
|---|---|
| verify (probe, checks, `--install`) | handoff.ops.verify, handoff.host.facts |
| the release (build, upload, switch, prune) | handoff.ops.releases, handoff.host.transfer |
| the key (keyring, placement, cleanup) | handoff.ops.secrets |
| deploy = verify + release + key | handoff.ops.deploy |
| jobs: launch, status, logs, stop, smoke-test | handoff.ops.jobs.* |
| fetch | handoff.ops.fetch |
| host keys (trust-host) | handoff.ops.trust, handoff.ssh.hostkeys |

fabfile.py parses flags and calls these; `fab demo` and tests call them directly. Every
command catches HandoffError at the top and prints its message (which names the fix),
so no traceback is ever the user interface. Exit codes: 0 done everywhere, 1 a host
failed (or a job is not running / finished, for `status`), 2 bad usage (flags, inventory,
roles, hosts), 130 interrupted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handoff import console
from handoff.config import flags as _flag
from handoff.config.inventory import load_inventory
from handoff.defaults import API_KEY_USERNAME, SECRET_SERVICE
from handoff.errors import HandoffError, SecretError, UsageError
from handoff.host import untrusted
from handoff.host.session import Connector
from handoff.host.ssh_session import SSHSession
from handoff.host.targets import Targets, resolve
from handoff.run import plan
from handoff.run.parallel import HostReport, run_on_hosts
from handoff.ssh import connect
from payload import units

# How commands reach a host. Tests may point it at handoff.testing.local.LocalSession.
CONNECT: Connector = SSHSession


class Interrupted(KeyboardInterrupt):
    """Ctrl-C with a message saying what it means for the hosts (e.g. the job runs on)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def guarded(fn: Callable[..., int]) -> Callable[..., int]:
    """Turn expected failures into a message and an exit code. Ctrl-C closes every SSH
    connection in flight (their threads stop at once) and exits 130 without a traceback."""

    def wrapper(*args: Any, **kwargs: Any) -> int:
        console.install()
        try:
            return fn(*args, **kwargs)
        except HandoffError as exc:
            console.error(str(exc))
            return exc.exit_code
        except KeyboardInterrupt as exc:
            from handoff.host import progress

            progress.stop_all()  # cursor back, and the message below on a line of its own
            connect.abort_all()
            message = exc.message if isinstance(exc, Interrupted) else (
                "interrupted: what a host was doing may be half done; rerun the command (each "
                "step is safe to repeat)")
            console.error(message)
            return 130

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def targets_for(host: str | None, role: str | None, values: dict[str, Any] | None = None,
                *, quiet: bool = False) -> Targets:
    """The hosts a command acts on (see handoff.host.targets), said on stderr with why these."""
    targets = resolve(host, load_inventory(), role, values)
    if not quiet:
        console.note(targets.describe())
    return targets


def exit_code(reports: list[HostReport]) -> int:
    return 0 if all(r.ok for r in reports) else 1


def run_plan(p: plan.Plan, dry_run: bool) -> int:
    """Print the plan (`--dry-run`), or execute it; the exit code either way."""
    if dry_run:
        plan.render(p)
        return 0
    return exit_code(plan.execute(p, connect=CONNECT))


# --- the first half: verify, push-script, push-key, deploy ---------------------------------


@guarded
def deploy(
    host: str | None = None,
    role: str | None = None,
    *,
    verify: bool = True,
    script: bool = True,
    key: bool = True,
    install: bool = False,
    dry_run: bool = False,
    title: str = "deploy",
    remember: bool = True,
) -> int:
    """verify → push-script → push-key; each flag set selects one checklist step alone."""
    from handoff.config import state
    from handoff.ops import deploy as deploy_plan
    from handoff.ops.secrets import settings

    targets = targets_for(host, role)
    entry = settings.keyring_entry(targets, required=title == "push-key") if key else None
    # Each host's key_mode says which keyring entries are needed (checked before anything,
    # once: the plan's place-key steps reuse them).
    chosen = settings.for_hosts(targets) if entry is not None else {}
    modes = settings.key_modes(chosen)
    if dry_run:
        unavailable = None
        try:
            secret = None if entry is None else settings.read_credentials(*entry, modes)
        except SecretError as exc:
            # A dry run still shows the whole plan; the missing key becomes a note in it.
            secret, unavailable = None, str(exc)
        return run_plan(deploy_plan.build(targets, verify=verify, script=script, key=secret,
                                          install=install, title=title, key_unavailable=unavailable,
                                          key_settings=chosen or None),
                        dry_run=True)
    # Read on a thread while the hosts connect and probe; the plan's changing steps wait.
    pending = None if entry is None else settings.read_credentials_soon(*entry, modes)
    p = deploy_plan.build(targets, verify=verify, script=script, key=pending, install=install,
                          title=title, key_settings=chosen or None)
    reports = plan.execute(p, connect=CONNECT)
    failure = None if pending is None else pending.exception()
    if isinstance(failure, SecretError):
        raise failure  # how to store the key: printed once, after the hosts' "nothing changed"
    code = exit_code(reports)
    if remember and host:
        # Only a deploy that succeeded on every host becomes what later bare commands act on;
        # a failed one (a dead or mistyped host) leaves the remembered targets as they were.
        if code == 0:
            state.save_targets([t.spec for t in targets], role)
        else:
            console.note("the remembered hosts are unchanged (deploy failed on "
                         f"{', '.join(r.target.label for r in reports if not r.ok)})")
    return code


def verify(host: str | None = None, role: str | None = None, install: bool = False,
           dry_run: bool = False) -> int:
    return deploy(host, role, verify=True, script=False, key=False, install=install,
                  dry_run=dry_run, title="verify", remember=False)


def push_script(host: str | None = None, role: str | None = None, dry_run: bool = False) -> int:
    return deploy(host, role, verify=False, script=True, key=False, dry_run=dry_run,
                  title="push-script", remember=False)


def push_key(host: str | None = None, role: str | None = None, dry_run: bool = False) -> int:
    return deploy(host, role, verify=False, script=False, key=True, dry_run=dry_run,
                  title="push-key", remember=False)


@guarded
def set_key(service: str = SECRET_SERVICE, username: str = API_KEY_USERNAME) -> int:
    """Store the key in the OS keyring from a hidden prompt (or stdin when piped)."""
    import getpass

    from handoff.config import os_keyring

    if sys.stdin.isatty():
        try:
            key = getpass.getpass(f"API key for {service}/{username} (hidden): ")
        except EOFError:  # Ctrl-D at the prompt: nothing typed, never a traceback
            print(file=sys.stderr)
            key = ""
    else:
        key = sys.stdin.readline()
    key = key.strip()
    if not key:
        raise UsageError("empty key; nothing stored")
    if not key.startswith("sk-"):
        console.warn("that does not look like an OpenRouter key (sk-or-…); storing it anyway")
    where = os_keyring.store_key(key, service, username)
    console.say(f"stored key {os_keyring.fingerprint(key)} in {console.r(where)} as "
                f"{console.r(service)}/{console.r(username)}")
    return 0


@guarded
def trust_host(host: str | None = None, role: str | None = None, yes: bool = False,
               replace: bool = False, known_hosts: bool = False) -> int:
    """Show each target's host key fingerprint and pin it after confirmation; a changed
    key only with `replace`."""
    from handoff.ops import trust

    failed = 0
    for t in targets_for(host, role):
        try:
            trusted = trust.trust(t, yes, replace, known_hosts)
        except HandoffError as exc:
            console.error(str(exc))
            trusted = False
        failed += not trusted
    return 1 if failed else 0


# --- the second half: smoke-test, launch, status, logs, stop, fetch, cleanup ---------------


@guarded
def smoke_test(host: str | None, role: str | None, model: str | None = None) -> int:
    """One real request per host with the placed key."""
    from handoff.config import state
    from handoff.ops.jobs import smoke

    reports = smoke.run(targets_for(host, role, {"model": model}), CONNECT)
    if len(reports) > 1:  # one host: its block already shows every line the table would
        console.say(smoke.table(reports))
    for rep in reports:  # launch's estimate reads what was measured, per API and model
        measured = smoke.measured(rep.data_as(smoke.Smoked).fields) if rep.ok else None
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
) -> int:
    """Start one job per dataset detached on each host, sharded i/n; the estimate first."""
    from handoff.ops.jobs import estimate
    from handoff.ops.jobs import launch as launch_plan
    from handoff.ops.secrets import settings

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
    loaded = launch_plan.load_datasets(targets, inputs, job_flag) if inputs and not remote_input else None
    p = launch_plan.plan(targets, local_input=inputs, remote_input=remote_input, job_flag=job_flag,
                         shard=shard, loaded=loaded)
    for ds in loaded or []:
        n = ds.check.prompts
        line = f"{ds.job}: {ds.path} ({units.size(ds.size)}), {n} prompt{'s' if n != 1 else ''}"
        if ds.check.duplicates:
            line += f", {ds.check.duplicates} repeated ids (done once)"
        if ds.check.bad:
            console.warn(f"{line}; {ds.check.bad_summary()}: skipped, never sent")
        else:
            console.say(line)
    if loaded:
        rows, basis = estimate.rows_for(loaded, targets)
        console.say(estimate.table(rows, basis, len(targets), int(targets[0].vars.get("concurrency") or 1)))
        for warning in estimate.budget_warnings(rows, launch_plan.job_budget(targets[0])):
            console.warn(warning)
    private = launch_plan.private_of(p)
    budget_line = launch_plan.budget_line(targets, [j.job for j in private.jobs])
    if budget_line:
        console.say(budget_line)
    # A budget limits the hosts' child keys too: the management key is read (once, on this
    # workstation) only if a host turns out to hold one.
    private.management = settings.ManagementKeys()
    return run_plan(p, dry_run)


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
    watcher = st.Watcher(targets_for(host, role), job, CONNECT,
                         key_lookup=settings.ManagementKeys().lookup)
    live = wait and console.console().is_terminal and not as_json
    try:
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
        console.say(st.table(views))
    if not as_json:
        for line in st.breakdown_notes(views):
            console.say(console.r(line))
    for note in [*st.bad_line_notes(views), *st.table_notes(views)]:
        console.warn(note)
    bad = [f"{v.host}/{v.job}" if v.job else v.host for v in views if not v.ok]
    if bad and not as_json:
        console.say(f"not running or finished: {console.r(', '.join(bad))}")
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

    watcher = st.Watcher(targets_for(host, role), None, CONNECT)
    try:
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
    targets = targets_for(host, role)
    p = forgetting.plan(targets, job_flag=job)
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


def ask(prompt: str) -> str:
    """A line from the user; Ctrl-D (end of input) is a "no", never an EOFError traceback."""
    try:
        return input(prompt)
    except EOFError:
        print(file=sys.stderr)
        return ""


@guarded
def logs(host: str | None, role: str | None, *, job: str | None = None, follow: bool = False,
         lines: int | str | None = None) -> int:
    """The job's last log lines; `follow` streams from every host until Ctrl-C."""
    from handoff.ops.jobs import logs as job_logs

    count = _flag.whole("--lines", lines, minimum=0, default=40)
    assert count is not None
    targets = targets_for(host, role)
    if follow:
        return job_logs.follow(targets, job, count, CONNECT)
    return exit_code(job_logs.tail(targets, job, count, CONNECT))


@guarded
def stop(host: str | None, role: str | None, *, job: str | None = None,
         timeout: float | str | None = None, dry_run: bool = False) -> int:
    """SIGTERM the job: graceful drain, stays resumable."""
    from handoff.ops.jobs import stop as stop_plan

    wait_s = _flag.real("--timeout", timeout, minimum=0, default=60.0)
    assert wait_s is not None
    return run_plan(stop_plan.plan(targets_for(host, role), job_flag=job, timeout=wait_s), dry_run)


@guarded
def fetch(host: str | None, role: str | None, *, job: str | None = None, dest: str = "results") -> int:
    """Pull each host's job folders (every job, or `--job`) to DEST/<host>/<job>/ (resumes
    partial files), then merge each job's shards into DEST/<job>/ (every id once, checked)."""
    from functools import partial

    from handoff.ops import fetch as fetching

    folder = Path(dest).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--dest {dest}: a file, not a folder; give a folder (created when "
                         f"missing), e.g. --dest results")
    targets = targets_for(host, role)
    one = partial(fetching.fetch, job_flag=job, dest=folder)
    reports = run_on_hosts(targets, one, connect=CONNECT, title="fetch")
    problems = []
    for merged in fetching.merge_jobs(reports, folder):
        console.say(f"[green]✓[/] merged {console.r(merged.job)} → "
                    f"{console.r(merged.folder / 'output.jsonl')}: {console.r(merged.describe())}")
        if merged.problem:
            problems.append(merged.problem)
    for rep in reports:
        refused = rep.data_as(fetching.FetchedTo).refused if rep.ok else []
        if refused:
            problems.append(f"{rep.target.label}: refused {len(refused)} entr"
                            f"{'y' if len(refused) == 1 else 'ies'} the host listed: "
                            f"{untrusted.refused(refused)}")
    for problem in problems:
        console.error(problem)
    return 1 if problems else exit_code(reports)


@guarded
def cleanup_secrets(host: str | None = None, dry_run: bool = False, role: str | None = None) -> int:
    """Remove the key files (the ledger's, and key_path on every inventory and remembered
    host, or on the --host hosts), revoke the child keys, and verify each is gone."""
    from handoff.config import state
    from handoff.errors import InventoryError
    from handoff.ops.secrets import workflow

    wanted = {h.strip() for h in host.split(",") if h.strip()} if host else None
    if role is not None:
        # --role as every task takes it: the inventory's hosts of that role (within --host).
        from handoff.config.inventory import check_role_name

        check_role_name(role)
        of_role = {h.name for h in load_inventory().hosts_for_role(role)}
        wanted = of_role if wanted is None else wanted & of_role
    everywhere: list[str] = []
    if wanted is None:
        # The hosts themselves are checked, not only the ledger: a wiped state dir or another
        # clone's deploy leaves keys this ledger does not list.
        try:
            everywhere = list(load_inventory().hosts)
        except InventoryError as exc:
            console.warn(f"{exc}; checking only the hosts the ledger and the last deploy name")
        everywhere += state.load_targets()[0]
    return workflow.cleanup_secrets(wanted, lambda spec: targets_for(spec, None, quiet=True),
                                    everywhere, connect=CONNECT, dry_run=dry_run)
