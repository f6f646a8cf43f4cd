"""The end of the checklist: `fetch` (every host's job folders, each job's shards merged)
and `cleanup-secrets` (the key files removed, the child keys revoked, each checked gone).
"""

from __future__ import annotations

from pathlib import Path

from handoff import console
from handoff.cli.commands import common
from handoff.cli.commands.common import exit_code, guarded, targets_for
from handoff.config.inventory import load_inventory
from handoff.errors import Interrupted, UsageError
from handoff.host import untrusted
from handoff.run.parallel import HostsInterrupted, run_on_hosts


@guarded
def fetch(host: str | None, role: str | None, *, job: str | None = None,
          dest: str | None = None) -> int:
    """Pull each host's job folders (every job, or `--job`) to DEST/<host>/<job>/ (resumes
    partial files), then merge each job's shards into DEST/<job>/ (every id once, checked).
    Without `dest`: `results/` in the project folder, wherever the command runs."""
    from functools import partial

    from handoff.config import paths
    from handoff.ops import fetch as fetching

    folder = Path(dest).expanduser() if dest is not None else paths.results_dir()
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--dest {dest}: a file, not a folder; give a folder (created when "
                         f"missing), e.g. --dest results")
    targets = targets_for(host, role)
    # One share of the disk for the whole command: every file of every host takes from it.
    room = fetching.Room(folder)
    one = partial(fetching.fetch, job_flag=job, dest=folder, room=room)
    try:
        reports = run_on_hosts(targets, one, connect=common.CONNECT, title="fetch")
    except HostsInterrupted as exc:
        raise Interrupted(_fetch_cut(exc, folder)) from None
    problems = []
    merged_jobs: list[str] = []
    try:
        for merged in fetching.merge_jobs(reports, folder, room):
            merged_jobs.append(merged.job)
            # Partial (a shard missing or still running, a host's last copy standing in) is
            # never a green tick.
            mark = ("[red]✗[/]" if merged.problem else "[yellow]~[/]" if merged.partial
                    else "[green]✓[/]")
            console.say(f"{mark} merged {console.r(merged.job)} → "
                        f"{console.r(merged.folder / 'output.jsonl')}: {console.r(merged.describe())}")
            for note in merged.notes:
                console.warn(note)
            if merged.problem:
                problems.append(merged.problem)
    except KeyboardInterrupt:
        raise Interrupted(
            "interrupted (Ctrl-C) while merging: every host's files are fetched (above); the "
            "merged files of the jobs not said merged above are as the last merge left them, "
            "or hold part of the new lines (checked again by the next merge); `fab fetch` "
            "again merges them, moving nothing that is already here") from None
    for rep in reports:
        refused = rep.data_as(fetching.FetchedTo).refused if rep.ok else []
        if refused:
            problems.append(f"{rep.target.label}: refused {len(refused)} entr"
                            f"{'y' if len(refused) == 1 else 'ies'} the host listed: "
                            f"{untrusted.refused(refused)}")
    for problem in problems:
        console.error(problem)
    return 1 if problems else exit_code(reports)


def _fetch_cut(exc: HostsInterrupted, folder: Path) -> str:
    """What a Ctrl-C during the downloads means, per host: fetched, failed, or cut (with the
    partial files kept, which the next fetch resumes); the merge did not run."""
    from handoff.host.transfer import completes, is_partial

    lines = ["interrupted (Ctrl-C) during fetch; on each host:"]
    for rep in exc.reports:
        label = rep.target.label
        if label in exc.ended:
            lines.append(f"  {label}: " + ("fetched (every file it listed)" if rep.ok else
                                           f"failed before the Ctrl-C: {rep.reason}"))
            continue
        host_dir = folder / rep.target.safe_label
        parts = sorted((of, p) for p in (host_dir.rglob("*") if host_dir.is_dir() else [])
                       if is_partial(p.name) and (of := completes(p)) is not None)
        kept = ", ".join(f"{of.relative_to(host_dir)} ({untrusted.mb(p.stat().st_size)} here)"
                         for of, p in parts)
        lines.append(f"  {label}: cut mid-way: " + (
            f"kept {kept}: the next fetch resumes from there, moving only the rest"
            if parts else f"what is in {host_dir} are whole files (a grown one continued up to a "
                          f"whole line); the next fetch brings the rest"))
    lines.append(f"the merge into {folder}/<job>/ did not run: those files are as the last fetch "
                 f"left them; `fab fetch` again resumes and merges (nothing changed on the hosts: "
                 f"fetch only reads them)")
    return "\n".join(lines)


@guarded
def cleanup_secrets(host: str | None = None, dry_run: bool = False, role: str | None = None,
                    force: bool = False) -> int:
    """Remove the key files (the ledger's, and key_path on every inventory and remembered
    host, or on the --host hosts), revoke the child keys, and verify each is gone. A host
    where a job runs is left as it is (exit 1, the jobs named) unless `force`."""
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
        everywhere += state.load_targets()
    try:
        return workflow.cleanup_secrets(wanted, lambda spec: targets_for(spec, None, quiet=True),
                                        everywhere, connect=common.CONNECT, dry_run=dry_run,
                                        force=force)
    except Interrupted:
        raise  # during the removals: said per host
    except KeyboardInterrupt:
        raise Interrupted(
            "interrupted (Ctrl-C) while revoking the child keys: the key files are removed as "
            "said above; a child key not yet said revoked may or may not be: `fab "
            "cleanup-secrets` again revokes every one not confirmed gone (and finds the files "
            "already absent)") from None
