"""`extract --backend vllm` against a real vLLM engine (CPU), compared with the HF backend.

Each engine start costs 20-70 s on a 2-core machine, so every extraction here is made
once (module fixtures) and checked from several sides:
- native at TP=1 and TP=2, specforge and speculators at TP=1: the same files, ids, masks,
  manifest and meta.json as the HF backend's on the same input, features within 1e-4
  (fp32), and the trainers' own loaders reproduce the target's logits from them;
- speculators: killed with -9 mid-run; the watchdog ends the engine's processes, the
  rerun completes the output (every id once, rows dense);
- specforge: the payload AND its watchdog killed with -9 (the engine's processes stay:
  that is the orphan problem); the rerun ends them, says so, and completes;
- no engine process, engine file, `.lock` or temp file is left after any finished run.

The vLLM venv is scripts/vllm-venv's; without it these tests skip (tests/vllm_support.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.payload.extract.helpers import manifest, read_features, run_extract, write_jsonl
from tests.vllm_support import (
    REPO,
    build_chat_model,
    chat_records,
    engine_env,
    marked_engine_processes,
    needs_vllm,
)

pytestmark = pytest.mark.timeout(900)
TOL = 1e-4
LAYERS = "2,3,6"  # includes N: the native format's post-norm index, trainers' pre-norm
COMMON = ("--max-length", "600", "--layers", LAYERS, "--batch-tokens", "2048")
RECORDS = chat_records(16, seed=21)
TAG = "shard0-of-1.rank0-of-1"


@pytest.fixture(scope="module")
def vpy() -> Path:
    return needs_vllm()


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_model(tmp_path_factory.mktemp("vllm-llama"))


@pytest.fixture(scope="module")
def chat_hf(chat_model: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float32,
                                                local_files_only=True).eval()


@pytest.fixture(scope="module")
def inp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("vllm-in") / "in.jsonl", RECORDS)


def extract_cmd(vpy: Path, inp: Path, model: Path, out: Path, *extra: str,
                harness: bool = False) -> list[str]:
    entry = ["-m", "tests.payload.extract.harness"] if harness else ["-m", "payload", "extract"]
    return [str(vpy), *entry, "--backend", "vllm", "--input", str(inp), "--model", str(model),
            "--output-dir", str(out), "--dtype", "float32", "--progress", "plain", *COMMON,
            *extra]


def run_vllm(vpy: Path, inp: Path, model: Path, out: Path, *extra: str, tp: int = 1,
             ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(extract_cmd(vpy, inp, model, out, *extra), cwd=REPO,
                          env=engine_env(tp), capture_output=True, text=True, timeout=600)
    return proc


def owner(out: Path) -> str:
    from payload.extract.backends.reaper import owner_of

    return owner_of(out, TAG)


def assert_clean(out: Path) -> None:
    """Nothing of the engine or of a write is left: processes, files, locks, temps."""
    deadline = time.monotonic() + 20
    while marked_engine_processes(owner(out)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not marked_engine_processes(owner(out)), "engine processes outlived the run"
    assert not (out / ".engine").exists(), "the engine's storage dir was left"
    leftovers = [p for p in out.rglob("*") if p.name.endswith(".lock") and p.name not in
                 (".manifest.lock", ".rows.lock")]
    leftovers += [p for p in out.rglob("*") if ".tmp" in p.name]
    assert not leftovers, leftovers


def assert_same_as_hf(vout: Path, hout: Path, fmt: str) -> None:
    import torch

    mine, ref = read_features(vout, fmt), read_features(hout, fmt)
    assert set(mine) == set(ref) == {str(r["id"]) for r in RECORDS}
    worst = 0.0
    for key, r in ref.items():
        m = mine[key]
        assert torch.equal(m["input_ids"], r["input_ids"]), key
        assert torch.equal(m["loss_mask"], r["loss_mask"]), key
        assert m["aux"].dtype == r["aux"].dtype == torch.float32
        assert m["aux"].shape == r["aux"].shape and m["final"].shape == r["final"].shape
        worst = max(worst, float((m["aux"] - r["aux"]).abs().max()),
                    float((m["final"] - r["final"]).abs().max()))
    assert worst < TOL, worst
    vmeta = json.loads((vout / "meta.json").read_text())
    hmeta = json.loads((hout / "meta.json").read_text())
    for k in ("model",):
        vmeta.pop(k), hmeta.pop(k)
    assert vmeta == hmeta
    counts = Counter(str(e["id"]) for e in manifest(vout))
    assert counts == Counter(str(r["id"]) for r in RECORDS)  # every id exactly once
    strip = ("file", "row")
    assert sorted(json.dumps({k: v for k, v in e.items() if k not in strip}, sort_keys=True)
                   for e in manifest(vout)) == sorted(
        json.dumps({k: v for k, v in e.items() if k not in strip}, sort_keys=True)
        for e in manifest(hout))


@pytest.fixture(scope="module")
def hf_out(tmp_path_factory: pytest.TempPathFactory, chat_model: Path, inp: Path):
    """The HF backend's output per format (in-process, the reference)."""
    made: dict[str, Path] = {}

    def get(fmt: str) -> Path:
        if fmt not in made:
            out = tmp_path_factory.mktemp(f"hf-{fmt}") / "out"
            assert run_extract(inp, chat_model, out, "--format", fmt, *COMMON) == 0
            made[fmt] = out
        return made[fmt]

    return get


@pytest.fixture(scope="module")
def native_tp1(vpy: Path, tmp_path_factory: pytest.TempPathFactory, chat_model: Path,
               inp: Path) -> Path:
    out = tmp_path_factory.mktemp("v-native-tp1") / "out"
    proc = run_vllm(vpy, inp, chat_model, out, "--format", "native")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vllm 0.32" in proc.stderr
    return out


@pytest.fixture(scope="module")
def native_tp2(vpy: Path, tmp_path_factory: pytest.TempPathFactory, chat_model: Path,
               inp: Path) -> Path:
    out = tmp_path_factory.mktemp("v-native-tp2") / "out"
    proc = run_vllm(vpy, inp, chat_model, out, "--format", "native",
                    "--tensor-parallel-size", "2", tp=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tensor parallel 2" in proc.stderr
    return out


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


# -- the features equal the HF backend's ---------------------------------------------
def test_native_tp1_equals_hf(native_tp1: Path, hf_out) -> None:
    assert_same_as_hf(native_tp1, hf_out("native"), "native")
    assert_clean(native_tp1)


def test_native_tp2_equals_hf(native_tp2: Path, hf_out) -> None:
    assert_same_as_hf(native_tp2, hf_out("native"), "native")
    assert_clean(native_tp2)


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


# -- refusals before the engine starts -----------------------------------------------
def test_engine_flags_refused_up_front(vpy: Path, chat_model: Path, inp: Path,
                                       tmp_path: Path) -> None:
    """Bad engine settings exit 2 in seconds, before any engine starts, naming the flag."""
    cases = [
        (("--layers", "2,3,7"), "valid indices are 1..6"),
        (("--engine-arg", "kv_cache_dtype=fp8"), "--dtype"),
    ]
    for extra, says in cases:
        t0 = time.monotonic()
        proc = subprocess.run(
            [*extract_cmd(vpy, inp, chat_model, tmp_path / "out"), *extra], cwd=REPO,
            env=engine_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, (extra, proc.stderr[-2000:])
        assert says in proc.stderr, (extra, proc.stderr[-2000:])
        assert "Initializing a V1 LLM engine" not in proc.stderr
        assert time.monotonic() - t0 < 120
