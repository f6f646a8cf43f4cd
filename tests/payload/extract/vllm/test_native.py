"""`extract --backend vllm`, native format at TP=1 and TP=2, against a real vLLM engine
(CPU): the same files, ids, masks, manifest and meta.json as the HF backend's on the same
input, features within 1e-4 (fp32); no engine process, engine file, `.lock` or temp file
left after the run; bad engine settings refused before any engine starts. And
speculators' FP8 form (`--feature-dtype fp8`) from the engine: the HF backend's FP8 rows
but for rounding at an FP8 step, read by speculators' own FP8 loader.

The vLLM venv is scripts/vllm-venv's; without it these tests skip (tests/vllm_support.py).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.payload.extract.vllm.cases import assert_clean, assert_same_as_hf, extract_cmd, run_vllm
from tests.vllm_support import REPO, engine_env

pytestmark = pytest.mark.timeout(900)


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


# -- the features equal the HF backend's ---------------------------------------------
def test_native_tp1_equals_hf(native_tp1: Path, hf_out) -> None:
    assert_same_as_hf(native_tp1, hf_out("native"), "native")
    assert_clean(native_tp1)


def test_native_tp2_equals_hf(native_tp2: Path, hf_out) -> None:
    assert_same_as_hf(native_tp2, hf_out("native"), "native")
    assert_clean(native_tp2)


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


# -- FP8 features from the engine ------------------------------------------------------
@pytest.fixture(scope="module")
def fp8_tp1(vpy: Path, tmp_path_factory: pytest.TempPathFactory, chat_model: Path,
            inp: Path) -> Path:
    out = tmp_path_factory.mktemp("v-fp8-tp1") / "out"
    proc = run_vllm(vpy, inp, chat_model, out, "--format", "speculators", "--feature-dtype",
                    "fp8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_fp8_rows_from_the_engine_are_the_hf_backends(fp8_tp1: Path, hf_out, chat_model: Path,
                                                      tmp_path: Path) -> None:
    """The pipeline quantizes what either backend hands it: the engine's states differ
    from HF's by ~1e-6 (fp32), so the FP8 rows are the HF backend's except where a value
    sits at an FP8 rounding step (then one step apart: at most 1/8 of the token's largest
    value), and the scales agree within 1e-4. speculators' own loader reads them."""
    import json

    import torch
    from safetensors.torch import load_file

    from tests.payload.extract.helpers import manifest, read_features

    hout = hf_out("speculators", "--feature-dtype", "fp8")
    assert_clean(fp8_tp1)
    mine, ref = read_features(fp8_tp1, "speculators"), read_features(hout, "speculators")
    assert set(mine) == set(ref)
    same = total = 0
    for key, r in ref.items():
        m = mine[key]
        assert torch.equal(m["input_ids"], r["input_ids"]) and torch.equal(m["loss_mask"],
                                                                         r["loss_mask"])
        a, b = load_file(str(fp8_tp1 / m["file"])), load_file(str(hout / r["file"]))
        assert a["hidden_states"].dtype == torch.float8_e4m3fn == b["hidden_states"].dtype
        torch.testing.assert_close(a["hidden_states_scales"], b["hidden_states_scales"],
                                   rtol=1e-4, atol=0)
        same += int((a["hidden_states"].view(torch.uint8)
                     == b["hidden_states"].view(torch.uint8)).sum())
        total += a["hidden_states"].numel()
        step = (m["aux"] - r["aux"]).abs().amax(-1) / r["aux"].abs().amax(-1)
        assert float(step.max()) <= 1 / 8, key
    assert same / total > 0.99, same / total
    meta = json.loads((fp8_tp1 / "meta.json").read_text())
    assert (meta["feature_dtype"], meta["hidden_states_backend"]) == ("float8_e4m3fn", "fp8")
    assert len(manifest(fp8_tp1)) == len(ref)
    # speculators' loader with its FP8 backend: the draft's input within FP8's rounding
    from transformers import AutoModelForCausalLM

    from tests.payload.extract.formats.test_trainers import (
        FP8_AUX_TOL,
        aux_error,
        needs,
        speculators_rows,
    )

    needs("speculators", "hs_connectors")
    target = AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float32,
                                                  local_files_only=True).eval()
    rows = speculators_rows(fp8_tp1, chat_model, target, tmp_path,
                            having="--hidden-states-backend fp8")
    assert len(rows) == len(ref) and aux_error(rows) < FP8_AUX_TOL
