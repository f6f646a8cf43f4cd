"""`extract --backend vllm` killed and resumed, against a real vLLM engine (CPU):
- speculators: killed with -9 mid-run; the watchdog ends the engine's processes, the
  rerun completes the output (every id once, rows dense);
- specforge: the payload AND its watchdog killed with -9 (the engine's processes stay:
  that is the orphan problem); the rerun ends them, says so, and completes;
- both outputs equal the HF backend's, and the trainers' own loaders reproduce the
  target's logits from them; nothing of the engine or of a write is left.

The vLLM venv is scripts/vllm-venv's; without it these tests skip (tests/vllm_support.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.payload.extract.vllm.cases import (
    RECORDS,
    TAG,
    TOL,
    assert_clean,
    assert_same_as_hf,
    extract_cmd,
    owner,
    run_vllm,
)
from tests.vllm_support import REPO, engine_env, marked_engine_processes

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def chat_hf(chat_model: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float32,
                                                local_files_only=True).eval()


def spawn_stalled(vpy: Path, inp: Path, model: Path, out: Path, fmt: str, marker: Path,
                  after: int) -> subprocess.Popen[str]:
    """The run, through the test harness: after `after` samples, the next write stalls
    half-way (tests/payload/extract/harness.py), as a run caught mid-write."""
    env = {**engine_env(), "STALL_AFTER": str(after), "STALL_MARKER": str(marker)}
    # a file, not a pipe: orphaned engine processes keep the payload's stderr open, and a
    # pipe would never reach EOF while they live
    with marker.with_suffix(".log").open("w") as log:
        return subprocess.Popen(extract_cmd(vpy, inp, model, out, "--format", fmt,
                                            harness=True),
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log,
                                text=True)


def wait_for(marker: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 400
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError("the run ended before the stall: "
                                 + marker.with_suffix(".log").read_text()[-3000:])
        assert time.monotonic() < deadline, "the extractor never reached the stall"
        time.sleep(0.2)


def watchdog_of(payload_pid: int) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"payload.extract.backends.reaper" in argv and any(
                a.endswith(f":{payload_pid}".encode()) for a in argv):
            return int(entry.name)
    raise AssertionError(f"no watchdog for payload pid {payload_pid}")


@pytest.fixture(scope="module")
def speculators_killed(vpy: Path, tmp_path_factory: pytest.TempPathFactory, chat_model: Path,
                       inp: Path) -> dict[str, Any]:
    """kill -9 of the payload mid-run: the watchdog ends the engine; then the rerun."""
    d = tmp_path_factory.mktemp("v-spec-kill")
    out, marker = d / "out", d / "stalled"
    proc = spawn_stalled(vpy, inp, chat_model, out, "speculators", marker, after=5)
    try:
        wait_for(marker, proc)
        engine = marked_engine_processes(owner(out))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 20
    while marked_engine_processes(owner(out)) and time.monotonic() < deadline:
        time.sleep(0.5)
    after_kill = marked_engine_processes(owner(out))
    halves = [p for p in out.rglob("*") if ".tmp" in p.name]
    rerun = run_vllm(vpy, inp, chat_model, out, "--format", "speculators")
    return {"out": out, "engine": engine, "after_kill": after_kill, "halves": halves,
            "rerun": rerun}


@pytest.fixture(scope="module")
def specforge_orphaned(vpy: Path, tmp_path_factory: pytest.TempPathFactory, chat_model: Path,
                       inp: Path) -> dict[str, Any]:
    """kill -9 of the payload and its watchdog: the engine is orphaned; then the rerun."""
    d = tmp_path_factory.mktemp("v-sf-orphan")
    out, marker = d / "out", d / "stalled"
    proc = spawn_stalled(vpy, inp, chat_model, out, "specforge", marker, after=3)
    try:
        wait_for(marker, proc)
        os.kill(watchdog_of(proc.pid), signal.SIGKILL)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(5)
    orphans = marked_engine_processes(owner(out))
    rerun = run_vllm(vpy, inp, chat_model, out, "--format", "specforge")
    return {"out": out, "orphans": orphans, "rerun": rerun}


def test_speculators_kill_9_watchdog_then_resume(speculators_killed: dict[str, Any], hf_out,
                                                 ) -> None:
    r = speculators_killed
    assert r["engine"], "no engine process was marked while the run was alive"
    assert not r["after_kill"], f"engine processes {r['after_kill']} outlived a kill -9"
    assert r["halves"], "the kill did not land mid-write"
    assert r["rerun"].returncode == 0, r["rerun"].stderr[-3000:]
    s = json.loads((r["out"] / f"stats.{TAG}.json").read_text())
    assert s["already_done"] == 5 and s["written"] == len(RECORDS) - 5
    assert s["temp_files_removed"] >= 1
    assert_same_as_hf(r["out"], hf_out("speculators"), "speculators")
    assert not (r["out"] / "pending").exists()
    assert_clean(r["out"])


def test_specforge_orphans_ended_by_the_rerun(specforge_orphaned: dict[str, Any], hf_out,
                                              ) -> None:
    r = specforge_orphaned
    assert r["orphans"], "the engine died with its payload even without the watchdog"
    err = r["rerun"].stderr
    assert r["rerun"].returncode == 0, err[-3000:]
    assert "engine processes left by an earlier run of this output dir" in err
    assert_same_as_hf(r["out"], hf_out("specforge"), "specforge")
    assert_clean(r["out"])


# -- the trainers' own loaders read the vllm output ----------------------------------
def test_trainers_load_the_vllm_output(specforge_orphaned: dict[str, Any],
                                       speculators_killed: dict[str, Any], chat_model: Path,
                                       chat_hf: Any, tmp_path: Path) -> None:
    from tests.payload.extract.formats.test_trainers import (
        needs,
        specforge_error,
        speculators_error,
    )

    needs("specforge", "speculators", "hs_connectors")
    assert specforge_error(specforge_orphaned["out"], chat_model, chat_hf, 4) < TOL
    assert speculators_error(speculators_killed["out"], chat_model, chat_hf, tmp_path) < TOL
