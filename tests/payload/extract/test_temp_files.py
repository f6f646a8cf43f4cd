"""A kill -9 inside safetensors' own save_file leaves its `.tmpXXXXXX` (a name that
says nothing about the sample or the writer): the rerun removes it, and leaves alone
one that a live process still writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.payload.extract.helpers import (
    REPO,
    make_records,
    run_extract,
    stats,
    write_jsonl,
)

KILL_INSIDE_SAVE_FILE = """
import sys, torch
from safetensors.torch import save_file
save_file({"x": torch.zeros(1 << 28, dtype=torch.uint8)}, sys.argv[1])  # 256 MiB
"""


def kill_inside_save_file(target: Path) -> Path:
    """Start a real save_file of a big tensor to `target`, kill -9 it mid-write; returns
    the library temp file it leaves."""
    target.parent.mkdir(parents=True, exist_ok=True)
    before = set(os.listdir(target.parent))
    proc = subprocess.Popen([sys.executable, "-c", KILL_INSIDE_SAVE_FILE, str(target)],
                            cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while True:
            new = [n for n in os.listdir(target.parent) if n not in before]
            if new:
                break
            assert proc.poll() is None, "save_file ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not target.exists()
    (left,) = new
    assert left.startswith(".tmp") and len(left) == 10, left
    return target.parent / left


def test_library_temp_files_of_a_killed_write_are_removed(tmp_path: Path, model_dir: Path,
                                                           ) -> None:
    from payload.extract.writer import id_relpath

    records = make_records(4, seed=9)
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out"
    rel = id_relpath(str(records[0]["id"]), "samples", ".safetensors")
    left = kill_inside_save_file(out / Path(rel).with_name(".x.safetensors.tmp-1-1"))
    # a live writer's temp file in the same folder (this process holds it open)
    busy = left.with_name(".tmpLIVE01")
    with busy.open("wb") as fh:
        fh.write(b"in progress")
        fh.flush()
        assert run_extract(inp, model_dir, out) == 0
        assert not left.exists()
        assert busy.exists(), "a temp file a live process has open was removed"
    assert stats(out)["temp_files_removed"] == 1
    assert stats(out)["written"] == 4
