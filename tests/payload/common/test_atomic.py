"""payload.atomic: the one temp-then-rename writer (used by the payload and handoff)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from payload import atomic


def test_replaces_with_mode_from_creation(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    old_umask = os.umask(0o077)
    try:
        atomic.write_json(target, {"a": 1}, mode=0o644)
    finally:
        os.umask(old_umask)
    assert json.loads(target.read_text()) == {"a": 1}
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    atomic.write_text(target, "private", mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert target.read_text() == "private"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_failure_keeps_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "out.jsonl"
    target.write_bytes(b"keep\n")
    with pytest.raises(RuntimeError), atomic.atomic_file(target) as fh:
        fh.write(b"half")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"keep\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_temp_names_differ_per_thread(tmp_path):
    import threading

    names = set()
    together = threading.Barrier(4)  # alive at once: a finished thread's ident may be reused

    def grab():
        names.add(atomic.temp_name(tmp_path / "f"))
        together.wait()

    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(names) == 4
    assert all(atomic.TMP_MARK in n.name for n in names)
