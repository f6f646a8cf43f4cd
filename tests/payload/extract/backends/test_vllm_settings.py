"""The vllm backend's engine settings, derived from the flags (no engine needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from payload.errors import UsageError
from payload.extract.backends import vllm as vb
from tests.payload.extract.helpers import extract_args


def cfg_for(model: Path, tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    from payload.extract.config import from_args

    inp = tmp_path / "in.jsonl"
    inp.write_text("{}\n")
    return from_args(extract_args("--input", str(inp), "--model", str(model), "--output-dir",
                                  str(tmp_path / "out"), "--backend", "vllm", *extra))


def model_with(tmp_path: Path, positions: int) -> Path:
    d = tmp_path / f"m{positions}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 6,
                                               "hidden_size": 8,
                                               "max_position_embeddings": positions}))
    return d


def test_max_model_len_from_max_length_and_positions(tmp_path: Path) -> None:
    m = model_with(tmp_path, 2048)
    # the longest sample plus the one generated token, never above the model's positions
    assert vb.max_model_len(cfg_for(m, tmp_path, "--max-length", "600"), 300) == 301
    assert vb.max_model_len(cfg_for(m, tmp_path, "--max-length", "600"), 600) == 601
    assert vb.max_model_len(cfg_for(m, tmp_path, "--max-length", "4000"), 2047) == 2048
    with pytest.raises(UsageError, match="--max-length 2047"):
        vb.max_model_len(cfg_for(m, tmp_path, "--max-length", "4000"), 2048)


def test_engine_args_cannot_override_what_the_flags_derive(tmp_path: Path) -> None:
    m = model_with(tmp_path, 2048)
    for key, flag in (("kv_cache_dtype", "--dtype"), ("max_model_len", "--max-length"),
                      ("tensor_parallel_size", "--tensor-parallel-size")):
        with pytest.raises(UsageError, match=flag):
            cfg_for(m, tmp_path, "--engine-arg", f"{key}=1")
    cfg = cfg_for(m, tmp_path, "--engine-arg", "max_num_seqs=64", "--engine-arg",
                  "enable_prefix_caching=false", "--kv-cache-memory", "2G",
                  "--tensor-parallel-size", "2")
    assert dict(cfg.engine_args) == {"max_num_seqs": 64, "enable_prefix_caching": False}
    assert cfg.kv_cache_bytes == 2 << 30 and cfg.tensor_parallel_size == 2


def test_engine_flags_need_the_vllm_backend(tmp_path: Path) -> None:
    from payload.extract.config import from_args

    m = model_with(tmp_path, 2048)
    inp = tmp_path / "in.jsonl"
    inp.write_text("{}\n")
    with pytest.raises(UsageError, match="--backend vllm"):
        from_args(extract_args("--input", str(inp), "--model", str(m), "--output-dir",
                               str(tmp_path / "o"), "--tensor-parallel-size", "8"))


def test_engine_error_names_the_flag() -> None:
    assert vb.hint("User-specified max_model_len (9000) is greater than ...") == "--max-length"
    assert "--kv-cache-memory" in vb.hint("No available memory for the cache blocks")
    assert vb.hint("Total number of attention heads (4) must be divisible by tensor "
                   "parallel size (3)") == "--tensor-parallel-size"


def test_cpu_bind_splits_the_cores_evenly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vb.os, "sched_getaffinity", lambda _pid: set(range(16)))
    assert vb._cpu_bind(2) == "0,1,2,3,4,5,6,7|8,9,10,11,12,13,14,15"
    monkeypatch.setattr(vb.os, "sched_getaffinity", lambda _pid: {0, 1})
    assert vb._cpu_bind(2) == "0|1"
