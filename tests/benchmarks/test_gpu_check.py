"""scripts/gpu-check keeps working where CI runs it: on the CPU with its small model, every
form extracted, checked against the fp32 model and summarised in one line (the GPU run is
the same code with the 1B model: benchmarks/gpu_check.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
FORMS = {"native", "specforge", "specforge+gzip", "speculators", "speculators+fp8"}


def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check_script",
                                                  REPO / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_gpu_check_passes_on_the_cpu_with_the_small_model(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    report = tmp_path / "report.json"
    proc = subprocess.run([str(REPO / "scripts" / "gpu-check"), "--device", "cpu", "--json",
                           str(report)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-4000:])
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check PASS | cpu"), proc.stdout
    r = json.loads(report.read_text())
    assert r["size"] == "small" and r["failures"] == [] and r["skipped"] == {}
    assert set(r["forms"]) == FORMS
    for name, row in r["forms"].items():
        assert row["rc"] == 0 and row["written"] == r["samples"] == 24, (name, row)
        assert row["checked"] == 3 and row["top1"] >= 0.99, (name, row)
        assert max(row["aux_rel_l2"], row["final_rel_l2"]) <= row["tolerance"], (name, row)
        assert row["tokens_per_s"] > 0 and row["vs_bare"] > 0
        assert name in lines[0]
    assert 0.5 < r["fp8_vs_bf16"] < 0.56  # 4H+28 vs 8H+24 a token at H=128
    assert r["gzip_vs_ckpt"] < 1
    assert len(r["bare_tokens_per_s"]) == 2
    assert not list(tmp_path.glob("gpu-check-*"))  # its temp dir is gone


def test_a_form_whose_module_is_missing_is_skipped_and_named() -> None:
    """The GPU image may lack `datasets`: speculators' two forms are skipped with the
    reason, the rest run; without float8 in torch, only the fp8 form is skipped."""
    m = gpu_check()
    run, skipped = m.available(m.FORMS, has_module=lambda name: name != "datasets")
    assert [f.name for f in run] == ["native", "specforge", "specforge+gzip"]
    assert set(skipped) == {"speculators", "speculators+fp8"}
    assert all("datasets" in why for why in skipped.values())
    run, skipped = m.available(m.FORMS, has_module=lambda name: True, has_fp8=False)
    assert list(skipped) == ["speculators+fp8"] and len(run) == 4


def test_fp8_on_a_device_is_compared_byte_for_byte() -> None:
    """The GPU run compares FP8 quantized on the GPU with the CPU's bytes (here the CPU
    on both sides: the comparison itself runs and finds nothing differing)."""
    import torch

    m = gpu_check()
    torch.manual_seed(0)
    stored = {"aux": torch.randn(40, 3 * 32), "final": torch.randn(40, 32)}
    assert m.fp8_on(stored, "cpu") == {"bytes_differing": 0.0, "scale_rel_diff": 0.0}


def test_the_summary_says_fail_and_why() -> None:
    """A failed check is FAIL on the one line, with what failed; over budget is said too."""
    m = gpu_check()
    row = {"tokens_per_s": 1000, "vs_bare": 0.9, "bytes_per_token": 540.0, "aux_rel_l2": 0.2,
           "final_rel_l2": 0.01, "tolerance": 0.08, "top1": 0.5, "top1_positions": 300,
           "top1_all": 0.4}
    line = m.summary({"device": "cpu", "torch": "2", "transformers": "5", "forms":
                      {"speculators+fp8": row}, "skipped": {"speculators": "needs datasets"},
                      "failures": ["speculators+fp8: relative error 0.2/0.01 > 0.08"],
                      "wall_s": 500.0, "budget_s": 480})
    assert line.startswith("gpu-check FAIL") and "relative error 0.2" in line
    assert "skipped speculators: needs datasets" in line and "OVER BUDGET" in line
    assert "\n" not in line
