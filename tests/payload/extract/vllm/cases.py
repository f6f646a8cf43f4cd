"""What the vLLM extraction tests share: the input, the command, and the checks against the
HF backend's output (tests/payload/extract/vllm/test_native.py, test_kill_resume.py).

Each engine start costs 20-70 s on a 2-core machine, so each file makes every extraction
once (module fixtures) and checks it from several sides. The two files are separate units
of the test scheduler (tests/conftest.py LONG_CHAINS), so their engines start on two
workers at once instead of one after the other on one.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path

from tests.payload.extract.helpers import manifest, read_features
from tests.vllm_support import REPO, chat_records, engine_env, marked_engine_processes

TOL = 1e-4
LAYERS = "2,3,6"  # includes N: the native format's post-norm index, trainers' pre-norm
COMMON = ("--max-length", "600", "--layers", LAYERS, "--batch-tokens", "2048")
RECORDS = chat_records(16, seed=21)
TAG = "shard0-of-1.rank0-of-1"


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
