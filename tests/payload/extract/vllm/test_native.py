"""`extract --backend vllm`, native format at TP=1 and TP=2, against a real vLLM engine
(CPU): the same files, ids, masks, manifest and meta.json as the HF backend's on the same
input, features within 1e-4 (fp32); no engine process, engine file, `.lock` or temp file
left after the run; bad engine settings refused before any engine starts.

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
