"""Early stop on a systematic error: the server refuses every prompt the same way.

A wrong model name (400 "Invalid model name"), a proxy that answers a bad key with 400,
a streaming-only server: every prompt gets the same permanent error. Recording each id
as failed (and exiting 0) costs a full pass, and a rerun after the fix does nothing,
because every id is "done". So permanent errors are held back, unwritten, while they
all look alike:

- the FIRST answers of the run are all the same permanent error: stop after
  `FIRST_ANSWERS` of them;
- later, a run of `RUN_OF_ANSWERS` consecutive answers all the same permanent error
  (the key was revoked, the model withdrawn mid-run): stop.

"The same" is the same status, type and message. Any other answer (a success, or a
different permanent error) releases the held records: they were real, per-prompt
failures, and are written. A success only counts if its request was sent after the first
held failure's: requests the server accepted before it started refusing still finish
fine for a while, and prove nothing about it now. On a stop, the held ids are not written, so a fixed rerun
asks them again. Retryable errors (429, 5xx) neither count nor break the run: they say
nothing about whether the prompts themselves are acceptable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from payload.generate.client import Outcome

FIRST_ANSWERS = 8
RUN_OF_ANSWERS = 64


@dataclass
class Held:
    prompt: Any
    outcome: Outcome
    attempts: int
    sent: int  # dispatch sequence number of the failing attempt


@dataclass
class SystematicError:
    write: Callable[[Held], None]  # records one held failure in the errors file
    first_answers: int = FIRST_ANSWERS
    run_of_answers: int = RUN_OF_ANSWERS
    held: list[Held] = field(default_factory=list)
    signature: tuple[Any, ...] | None = None
    any_success: bool = False
    written: int = 0  # held failures released (written) so far: other answers existed
    verdict: Outcome | None = None  # set once the error is judged systematic

    def success(self, sent: int) -> None:
        """An answer; `sent` is its request's dispatch sequence number."""
        self.any_success = True
        if self.held and sent < self.held[0].sent:
            return  # sent before the refusals began: says nothing about the server now
        self.flush()

    def permanent(self, item: Held) -> bool:
        """Hold one permanent failure; True when the error is now judged systematic."""
        o = item.outcome
        sig = (o.status, o.type, o.message)
        if sig != self.signature:
            self.flush()
            self.signature = sig
        self.held.append(item)
        limit = self.run_of_answers if self.any_success else self.first_answers
        if len(self.held) >= limit:
            self.verdict = o
        return self.verdict is not None

    def at_end(self) -> bool:
        """The input is exhausted. With no success in the whole run and every answer the same
        permanent error (two or more), that is systematic too; else the held are written."""
        if (not self.any_success and not self.written and len(self.held) >= 2
                and self.verdict is None):
            self.verdict = self.held[-1].outcome
        if self.verdict is None:
            self.flush()
        return self.verdict is not None

    def flush(self) -> None:
        held, self.held = self.held, []
        self.written += len(held)
        for item in held:
            self.write(item)

    def describe(self) -> str:
        o = self.verdict
        assert o is not None
        n = len(self.held)
        where = "the first" if not self.any_success else "a run of"
        return (f"stopping: {where} {n} answers were all the same error: "
                f"{o.status or ''} {o.type}: {o.message!r}".replace("  ", " ")
                + ". Nothing was recorded as failed for them; fix the cause (model name, "
                "key, server) and rerun the same command")
