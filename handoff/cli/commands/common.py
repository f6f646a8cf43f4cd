"""What every command does the same way: how it reaches a host (`CONNECT`), how it turns
failures into a message and an exit code (`guarded`), how it picks its targets, runs its
plan and asks the user.

Every command catches HandoffError at the top and prints its message (which names the fix),
so no traceback is ever the user interface. Exit codes: 0 done everywhere, 1 a host
failed (or a job is not running / finished, for `status`), 2 bad usage (flags, inventory,
roles, hosts), 130 interrupted.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from handoff import console
from handoff.config.inventory import load_inventory
from handoff.errors import HandoffError, Interrupted
from handoff.host.session import Connector
from handoff.host.ssh_session import SSHSession
from handoff.host.targets import Targets, resolve
from handoff.run import plan
from handoff.run.parallel import HostReport, HostsInterrupted
from handoff.ssh import connect

# How commands reach a host, read at each call (`common.CONNECT`): tests point it at
# handoff.testing.local.LocalSession.
CONNECT: Connector = SSHSession


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
            # Every command's work on hosts says what a Ctrl-C there means (Interrupted); this
            # one came outside it (reading inputs, printing): nothing more was started.
            message = exc.message if isinstance(exc, Interrupted) else (
                "interrupted (Ctrl-C) outside the hosts' work: what the lines above say was done "
                "is done, and nothing else was started on any host")
            console.error(message)
            return 130

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


@contextlib.contextmanager
def only_reading(command: str, hosts: str = "") -> Iterator[None]:
    """A Ctrl-C during a command that only reads the hosts (status, logs, jobs) says so: per
    host nothing changed, nothing to redo (an Interrupted raised inside, e.g. `status
    --wait`'s own, goes on as it is)."""
    try:
        yield
    except HostsInterrupted as exc:
        raise Interrupted(f"interrupted (Ctrl-C): `fab {command}` only reads the hosts; nothing "
                          f"was changed on {', '.join(r.target.label for r in exc.reports)}") from None
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted (Ctrl-C): `fab {command}` only reads the hosts; nothing "
                          f"was changed{' on ' + hosts if hosts else ''}") from None


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


def ask(prompt: str) -> str:
    """A line from the user; Ctrl-D (end of input) is a "no", never an EOFError traceback."""
    try:
        return input(prompt)
    except EOFError:
        print(file=sys.stderr)
        return ""
