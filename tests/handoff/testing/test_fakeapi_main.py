"""The fake OpenRouter run alone, as the benchmarks and the README run it."""

from __future__ import annotations

import subprocess
import sys

from tests.support.fab import REPO


def test_the_fake_api_still_runs_alone() -> None:
    """`python -m handoff.testing.fakeapi` (the benchmarks and README use it) after its split."""
    out = subprocess.run([sys.executable, "-m", "handoff.testing.fakeapi", "--help"],
                         capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.startswith("usage: python -m handoff.testing.fakeapi")
    assert "The project's own fake OpenRouter" in out.stdout
