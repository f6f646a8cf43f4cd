"""Runs `extract` in a real subprocess; optionally stalls mid-write so a test can kill -9 it.

With WRITE_DELAY=S every sample write first sleeps S seconds (a slow disk), so a test
can catch the run mid-way. With STALL_AFTER=K, the (K+1)th sample file is written
half-way to its temp name, a marker file appears, and the process sleeps: the test then
sends SIGKILL from outside, which is exactly a run killed in the middle of a write.
With STALL_ROWS_AFTER=K (speculators), the finalize stalls the same way after K of its
renames. With STALL_LOAD=marker, loading the model writes the marker and then takes
600 s (a vLLM engine start, a huge checkpoint): a test sends SIGTERM meanwhile. Sample files are written by safetensors' save_file or torch.save (specforge, also into
a GzipFile with --compress gzip); both are wrapped. Test-only code: the product has no such hook.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _hang(marker: Path, text: str) -> None:
    marker.write_text(text)
    while True:
        time.sleep(1)


def _wrap_sample_writes(before, after) -> None:  # type: ignore[no-untyped-def]
    """Call before() ahead of each sample file write and after(path) once it is written."""
    import io

    import safetensors.torch as st
    import torch

    real_st, real_torch = st.save_file, torch.save

    def save_file(tensors, filename, metadata=None):  # type: ignore[no-untyped-def]
        before()
        real_st(tensors, filename, metadata=metadata)
        after(str(filename))

    def save(obj, f, *args, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(f, io.BytesIO):  # token_freq.pt is built in memory: not a sample
            return real_torch(obj, f, *args, **kwargs)
        before()
        real_torch(obj, f, *args, **kwargs)
        f.flush()
        after(getattr(f, "fileobj", f).name)  # a GzipFile (.ckpt.gz): the file beneath
        return None

    st.save_file = save_file
    torch.save = save


def _stall_after(k: int, marker: Path) -> None:
    calls = {"n": 0}

    def after(filename: str) -> None:
        calls["n"] += 1
        if calls["n"] <= k:
            return
        size = os.path.getsize(filename)
        with open(filename, "r+b") as fh:
            fh.truncate(size // 2)
        _hang(marker, filename)

    _wrap_sample_writes(lambda: None, after)


def _slow_writes(delay: float) -> None:
    _wrap_sample_writes(lambda: time.sleep(delay), lambda _path: None)


def _stall_rows_after(k: int, marker: Path) -> None:
    from payload.extract.formats import speculators as rows

    real = rows.move
    calls = {"n": 0}

    def move(src: Path, dst: Path) -> None:
        if calls["n"] >= k:
            _hang(marker, str(dst))
        calls["n"] += 1
        real(src, dst)

    rows.move = move


def _stall_load(marker: Path) -> None:
    from payload.extract.backends import hf

    def slow_load(*_a: object, **_k: object) -> None:
        marker.write_text("loading")
        time.sleep(600)

    hf.FeatureModel.__init__ = slow_load  # type: ignore[assignment,method-assign]


def main() -> int:
    from payload.extract import add_arguments, run

    if os.environ.get("STALL_LOAD"):
        _stall_load(Path(os.environ["STALL_LOAD"]))
    if os.environ.get("WRITE_DELAY"):
        _slow_writes(float(os.environ["WRITE_DELAY"]))
    stall = os.environ.get("STALL_AFTER")
    if stall is not None:
        _stall_after(int(stall), Path(os.environ["STALL_MARKER"]))
    if os.environ.get("STALL_ROWS_AFTER"):
        _stall_rows_after(int(os.environ["STALL_ROWS_AFTER"]), Path(os.environ["STALL_MARKER"]))
    parser = argparse.ArgumentParser(prog="extract")
    add_arguments(parser)
    return run(parser.parse_args(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
