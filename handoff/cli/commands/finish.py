"""The end of the checklist: `fetch` (every host's job folders, each job's shards merged)
and `cleanup-secrets` (the key files removed, the child keys revoked, each checked gone).
"""

from __future__ import annotations

from pathlib import Path

from handoff import console
from handoff.cli.commands import common
from handoff.cli.commands.common import exit_code, guarded, targets_for
from handoff.config.inventory import load_inventory
from handoff.errors import UsageError
from handoff.host import untrusted
from handoff.run.parallel import run_on_hosts


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
    one = partial(fetching.fetch, job_flag=job, dest=folder)
    reports = run_on_hosts(targets, one, connect=common.CONNECT, title="fetch")
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
        everywhere += state.load_targets()
    return workflow.cleanup_secrets(wanted, lambda spec: targets_for(spec, None, quiet=True),
                                    everywhere, connect=common.CONNECT, dry_run=dry_run)
