"""Memory stays flat as the input grows: the input is streamed, never loaded whole.

Peak RSS of the `generate` process (from `wait4`'s rusage, exact for that one child) is
compared between a small and a larger input at 2000 in flight against a fast fake. Both
runs must reach the full 2000 in flight: the window starts at 32 and doubles per round
trip (slow start), which takes ~4000 answers, so the small input is 6k prompts (2k would
peak at ~1000 in flight and compare less memory for requests, not for the input). The
default run is 6k vs 30k to stay fast; the `slow` variant is the issue's 20k vs 200k (run
it with `HANDOFF_SLOW_TESTS=1 pytest -m slow tests/payload`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.payload.helpers import REPO, gen_args, payload_cmd, payload_env, write_prompts

# A child forked from this pytest process starts with the parent's RSS in its ru_maxrss
# (the kernel keeps the pre-exec high-water mark), and the parent may hold torch by now.
# A tiny trampoline forks the payload instead, so only the payload's own peak is counted.
_TRAMPOLINE = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def peak_rss_mb(args: list[str]) -> float:
    proc = subprocess.run([sys.executable, "-S", "-c", _TRAMPOLINE, *payload_cmd(*args)],
                          cwd=REPO, env=payload_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    maxrss_kib, rc = (int(v) for v in proc.stdout.split())
    assert rc == 0, proc.stderr[-2000:]
    return maxrss_kib / 1024  # KiB on Linux


def measure(fake_factory, key_file: Path, tmp_path: Path, small: int, big: int
            ) -> tuple[float, float]:
    results = []
    for n in (small, big):
        # Answers slow enough that 2000 really are in flight: by Little's law in flight =
        # throughput x latency, and client + fake on 2 cores answer a few thousand a second,
        # so 0.1 s answers held only ~1000 in flight whatever the window allowed.
        fake = fake_factory(latency_s=1.0)
        inp, out = tmp_path / f"in{n}.jsonl", tmp_path / f"out{n}.jsonl"
        write_prompts(inp, n)
        results.append(peak_rss_mb(gen_args(fake, key_file, inp, out, "--concurrency", "2000")))
        assert sum(1 for _ in out.open()) == n
        assert fake.stats.peak_concurrency > 1500  # the window really was wide open
    print(f"peak RSS {small} prompts: {results[0]:.0f} MB, {big}: {results[1]:.0f} MB")
    return results[0], results[1]


@pytest.mark.serial  # peak RSS and peak concurrency > 1500: run alone (scripts/test's serial pass)
@pytest.mark.timeout(240)
def test_memory_flat_6k_vs_30k(fake_factory, key_file, tmp_path):
    small, big = measure(fake_factory, key_file, tmp_path, 6_000, 30_000)
    assert big <= 300
    assert big <= 1.2 * small, f"peak RSS grew from {small:.0f} MB to {big:.0f} MB"


@pytest.mark.serial  # peak RSS and peak concurrency > 1500: run alone (scripts/test's serial pass)
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("HANDOFF_SLOW_TESTS"),
                    reason="several minutes on 2 cores: set HANDOFF_SLOW_TESTS=1")
@pytest.mark.timeout(900)
def test_memory_flat_20k_vs_200k(fake_factory, key_file, tmp_path):
    small, big = measure(fake_factory, key_file, tmp_path, 20_000, 200_000)
    assert big <= 300
    assert big <= 1.2 * small, f"peak RSS grew from {small:.0f} MB to {big:.0f} MB"
