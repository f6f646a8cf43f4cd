"""The payload's exit codes and the one error base that carries them.

Every expected failure is a `PayloadError` whose class fixes the exit code, so the
command entry (`payload/cli.py`) maps any of them to its code in one place and prints the
message, which names the fix. No command catches a stray exception class of its own to
turn it into a code. Unexpected exceptions stay exceptions (exit 1 with a redacted
traceback): an internal invariant is a bug, not a user's input.

The exceptions several modules raise live here, below every user of them: a bad key
file (`keyfile`), a bad input record (`records`), a provider filter that leaves no
endpoint (`generate/preflight`), a budget that is spent (`generate/budget`).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The contract every subcommand follows (docs/records.md, "Exit codes")."""

    OK = 0  # finished: every id done, or failed permanently within the allowed share
    FAILED = 1  # finished, but too many ids / samples failed
    USAGE = 2  # bad usage or input; nothing (more) was done
    STOPPED = 3  # stopped early and resumable (bad key, out of credit, budget, SIGTERM, full disk)


class PayloadError(Exception):
    """An expected failure with a user-facing message."""

    exit_code: ExitCode = ExitCode.FAILED


class UsageError(PayloadError, ValueError):
    """Bad flags, a bad input file or environment: the message names the fix (exit 2)."""

    exit_code = ExitCode.USAGE


class Stopped(PayloadError):
    """The run stopped before the end and can be resumed as it is (exit 3)."""

    exit_code = ExitCode.STOPPED


class KeyFileError(UsageError):
    """No usable API key (missing, empty, readable by others): the message says how to fix
    it (exit 2)."""


class BadRecord(UsageError):
    """An input line that cannot become a prompt; the message says why, for the user.

    A run counts and skips such lines (they are exit 2 only when no line is valid); it is
    still a ValueError, as it always was, for callers that catch that."""


class PreflightRefused(UsageError):
    """The provider filter leaves no endpoint for the model: the message names the filter
    and the endpoints that exist (exit 2; every request would fail with 404)."""


class BudgetReached(Stopped):
    """Spent + one more expected request would pass --max-cost, with nothing in flight
    (exit 3: raise --max-cost and rerun to go on)."""
