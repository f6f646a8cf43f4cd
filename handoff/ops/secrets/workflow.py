"""cleanup-secrets from start to end: what to clean (`cleanup.cleanup_entries`), the key files
removed host by host (`cleanup.cleanup_plan`), then the child keys revoked (`revoke`), and
one summary saying what is dead and what may remain. `handoff.cli.commands` only gathers
the hosts to check and passes them in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from handoff import console
from handoff.host.session import Connector
from handoff.host.targets import Target
from handoff.ops.secrets import cleanup, revoke, settings
from handoff.run import plan


def cleanup_secrets(wanted: set[str] | None, resolve: Callable[[str], list[Target]],
                    everywhere: Iterable[str], *, connect: Connector, dry_run: bool,
                    force: bool = False) -> int:
    """Remove the key files and revoke the child keys of the `wanted` hosts (by name or
    address), or of every host in `everywhere` and the ledger; the exit code (0: all clean,
    or nothing to clean; 1: something may remain, each said). A host where a job runs is
    left as it is, its keys neither removed nor revoked, unless `force` (exit 1, naming the
    jobs)."""
    scope = cleanup.cleanup_entries(wanted, resolve, everywhere)
    for skipped in scope.skipped:
        console.warn(f"not checked: {skipped}")
    if not scope.entries and not scope.minted:
        console.say("the ledger lists no placed or minted keys and there is no host to check: "
                    "nothing to clean (already absent)")
        return 0
    p = cleanup.cleanup_plan(scope, force)
    why = "named with --host/--role" if wanted is not None else (
        "every host the ledger, the inventory and the last deploy name")
    console.note(f"hosts: {', '.join(hp.target.label for hp in p.hosts) or 'none'} ({why})")
    if dry_run:
        plan.render(p)
        console.say(revoke.revocation_plan(revoke.revocations(scope)))
        return 0
    reports = plan.execute(p, connect=connect) if p.hosts else []
    # A host refused for its running jobs keeps its keys: none of them is revoked either.
    kept = [r.target for r in reports if r.data_as(cleanup.KeysRemoved).refused]
    scope.minted = [e for e in scope.minted if not any(
        e.host == t.label or (e.hostname, e.port, e.user) == (t.endpoint.hostname, t.endpoint.port,
                                                                t.endpoint.user) for t in kept)]
    todo = revoke.revocations(scope, reports)
    keys = settings.ManagementKeys()
    # The ledger is a cache, the API the truth: what it lists for these hosts goes too.
    listed, unlisted = revoke.listed_at_api(scope, keys, {r.key_hash for r in todo},
                                            skip={t.label for t in kept})
    todo += listed
    revoked = revoke.revoke_all(todo, keys) if todo else []
    if revoked:
        console.say(revoke.revocation_table(revoked))
    ok, lines = revoke.cleanup_summary(reports, revoked)
    for line in lines:
        (console.say if ok else console.error)(line)
    # A key only the API names may live: an error where child keys are in use, a warning
    # where nothing says any was minted (plain keys, a keyring this shell cannot reach).
    fatal = bool(unlisted) and revoke.minting_in_use(scope, reports)
    for problem in unlisted:
        (console.error if fatal else console.warn)(problem)
    return 0 if ok and not fatal else 1


__all__ = ["cleanup_secrets"]
