"""The systematic-error detector: the first answers, or a run of them, all the same error."""

from __future__ import annotations

import pytest

from payload.generate.client import (
    Kind,
    Outcome,
)
from payload.generate.systematic import Held, SystematicError

pytestmark = pytest.mark.timeout(30)


def held(n: int, message: str = "Invalid model", sent: int = 0) -> Held:
    return Held(prompt=n, outcome=Outcome(Kind.PERMANENT, 400, "bad_request", message),
                attempts=1, sent=sent)


def test_systematic_error_first_answers_and_runs():
    written: list[Held] = []
    det = SystematicError(written.append, first_answers=8, run_of_answers=64)
    assert not any(det.permanent(held(i)) for i in range(7))
    assert det.permanent(held(7)) and not written  # the first 8 answers: all the same
    assert "the first 8 answers were all the same error: 400 bad_request" in det.describe()

    written.clear()
    det = SystematicError(written.append, first_answers=8, run_of_answers=64)
    for i in range(5):
        det.permanent(held(i, sent=10 + i))
    det.success(sent=3)  # sent before the refusals began: proves nothing
    assert not written
    det.success(sent=20)  # a later request went through: those were per-prompt failures
    assert len(written) == 5
    assert not any(det.permanent(held(i, sent=30 + i)) for i in range(63))
    det.permanent(held(99, "another message", sent=99))  # a different error breaks the run
    assert len(written) == 5 + 63
    assert not det.at_end() and len(written) == 5 + 63 + 1

    # Every answer of a small run the same error: systematic at the end too.
    det = SystematicError(written.append)
    det.permanent(held(1))
    det.permanent(held(2))
    assert det.at_end()
