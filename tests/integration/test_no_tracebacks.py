"""Run last (marked `after_every_fab_run`, which tests/integration/conftest.py moves to the
end of the session, whatever the file order): no fab command run by the integration tests
of this session printed a Python traceback. Where the session is split over several
processes (scripts/test: xdist workers, then a serial pass holding this check), every
process writes its fab runs to $HANDOFF_FAB_RUNS and this check reads them all. User errors (bad flags, unreachable hosts, refused keys, a stalled
server, Ctrl-C) are one clear message each; a traceback is the output of a bug."""

from __future__ import annotations

import os

import pytest

from tests.integration.conftest import FAB_RUNS_ENV, every_result, explain


@pytest.mark.after_every_fab_run
def test_no_fab_output_of_this_session_holds_a_traceback() -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get(FAB_RUNS_ENV):
        pytest.skip(f"an xdist worker sees only its own fab runs: set ${FAB_RUNS_ENV} to a "
                    "folder shared by every pytest process and run this check after the "
                    "others, alone (scripts/test does)")
    results = every_result()
    if len(results) < 5:
        pytest.skip("run with the other integration tests: it checks what they printed")
    offenders = [explain(r)[:3000] for r in results
                 if "Traceback (most recent call last)" in r.text or "Exception (client)" in r.text]
    assert not offenders, f"{len(offenders)} of {len(results)} fab runs:\n\n" + "\n\n".join(offenders)
