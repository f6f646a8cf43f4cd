"""Runs `extract` in a real subprocess; optionally stalls mid-write so a test can kill -9 it.

With WRITE_DELAY=S every sample write first sleeps S seconds (a slow disk), so a test
can catch the run mid-way. With STALL_AFTER=K, the (K+1)th sample file is written half-way to its temp name, a
marker file appears, and the process sleeps: the test then sends SIGKILL from outside,
which is exactly a run killed in the middle of a write. Test-only code: the product
has no such hook.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _stall_after(k: int, marker: Path) -> None:
    import safetensors.torch as st

    real = st.save_file
    calls = {"n": 0}

    def save_file(tensors, filename, metadata=None):  # type: ignore[no-untyped-def]
        if calls["n"] < k:
            calls["n"] += 1
            return real(tensors, filename, metadata=metadata)
        real(tensors, filename, metadata=metadata)
        size = os.path.getsize(filename)
        with open(filename, "r+b") as fh:
            fh.truncate(size // 2)
        marker.write_text(filename)
        while True:
            time.sleep(1)

    st.save_file = save_file


def _slow_writes(delay: float) -> None:
    import safetensors.torch as st

    real = st.save_file

    def save_file(tensors, filename, metadata=None):  # type: ignore[no-untyped-def]
        time.sleep(delay)
        return real(tensors, filename, metadata=metadata)

    st.save_file = save_file


def main() -> int:
    from payload.extract import add_arguments, run

    if os.environ.get("WRITE_DELAY"):
        _slow_writes(float(os.environ["WRITE_DELAY"]))
    stall = os.environ.get("STALL_AFTER")
    if stall is not None:
        _stall_after(int(stall), Path(os.environ["STALL_MARKER"]))
    parser = argparse.ArgumentParser(prog="extract")
    add_arguments(parser)
    return run(parser.parse_args(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
