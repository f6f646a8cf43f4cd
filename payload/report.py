"""The one way a payload command talks to its user: a `Reporter`.

Everything `generate` says (the input survey, resume, budget notes, outages, stops,
warnings, progress lines) goes through the reporter its run was given, never through a
`print` of its own. So the wording has one place to be checked, every line is redacted
on its way out, and a test or an embedding caller can hand in another stream (or read
`lines` back) instead of scraping stderr.

The stream is looked up when a line is written (`sys.stderr` by default), not when the
reporter is made: `payload/cli.py` swaps stderr for a redacting, error-swallowing stream
for the duration of a command, and a reporter made earlier must write to that one.
"""

from __future__ import annotations

import sys
from typing import TextIO

from payload.redact import redact


class Reporter:
    """Redacted lines to one stream: `"stderr"` (the default) or `"stdout"`, looked up on
    `sys` at each write, or a stream object. `keep=True` also keeps the lines in `lines`."""

    def __init__(self, stream: TextIO | str = "stderr", *, keep: bool = False) -> None:
        if isinstance(stream, str) and stream not in ("stderr", "stdout"):
            raise ValueError(f"a reporter writes to 'stderr' or 'stdout', not {stream!r}")
        self._stream = stream
        self.lines: list[str] | None = [] if keep else None

    @property
    def stream(self) -> TextIO:
        s = self._stream
        return getattr(sys, s) if isinstance(s, str) else s

    def say(self, text: str) -> None:
        """One line (or a few) for the user; flushed at once (a detached job's log is read live)."""
        line = redact(text)
        if self.lines is not None:
            self.lines.append(line)
        print(line, file=self.stream, flush=True)

    def warn(self, text: str) -> None:
        self.say(f"warning: {text}")

    def error(self, text: str) -> None:
        self.say(f"error: {text}")
