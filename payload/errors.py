"""The payload's exit codes and the one error base that carries them.

Every expected failure is a `PayloadError` whose class fixes the exit code, so the
command entry (cli.py) maps any of them to its code in one place and prints the
message, which names the fix. Unexpected exceptions stay exceptions (exit 1 with a
redacted traceback): an internal invariant is a bug, not a user's input.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The contract every subcommand follows (see docs/payload.md)."""

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
