"""Run last (marked `after_every_fab_run`, which tests/integration/conftest.py moves to the
end of the session, whatever the file order): no fab command run by the integration tests
of this session printed a Python traceback. User errors (bad flags, unreachable hosts, refused keys, a stalled
server, Ctrl-C) are one clear message each; a traceback is the output of a bug."""

from __future__ import annotations

import pytest

from tests.integration.conftest import ALL_RESULTS, explain


@pytest.mark.after_every_fab_run
def test_no_fab_output_of_this_session_holds_a_traceback() -> None:
    if len(ALL_RESULTS) < 5:
        pytest.skip("run with the other integration tests: it checks what they printed")
    offenders = [explain(r)[:3000] for r in ALL_RESULTS
                 if "Traceback (most recent call last)" in r.text or "Exception (client)" in r.text]
    assert not offenders, f"{len(offenders)} of {len(ALL_RESULTS)} fab runs:\n\n" + "\n\n".join(offenders)
