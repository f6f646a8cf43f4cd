"""verify's deep probe run for real, locally: the probe module, the torch/CUDA child and
the extractor's disk preflight (the built payload.pyz) against a tiny model folder.

No host and no sshd: the probe's source is what `Session.run_code` ships over SSH, here
run by this python (which has torch, CPU build). Skipped where transformers is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from handoff.config.roles import get_role
from handoff.host import remote_code
from handoff.host.facts import Facts, deep_args
from handoff.ops import releases
from handoff.ops.verify import evaluate
from payload.records import Shard

pytest.importorskip("transformers")


def tiny_model_dir(path: Path) -> Path:
    """Config and chat tokenizer only: the preflight reads those, never the weights."""
    from transformers import LlamaConfig

    from tests.payload.extract.helpers import HIDDEN, NUM_LAYERS, build_tokenizer

    tok = build_tokenizer()
    LlamaConfig(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=128,
                num_hidden_layers=NUM_LAYERS, num_attention_heads=4,
                num_key_value_heads=4).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def run_probe(tmp_path: Path, variables: dict[str, Any], shard: str | None) -> Facts:
    role = get_role("extractor")
    args: dict[str, Any] = {"remote_dir": variables["remote_dir"],
                            "modules": role.requires.modules_needed(variables),
                            "commands": list(role.requires.commands), "gpus": True,
                            "files": {}, "dirs": [], "hash": False}
    args.update(deep_args(role, variables, shard))
    out = subprocess.run([sys.executable, "-c", remote_code.source(remote_code.PROBE), remote_code.encode_args(args)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, check=True)
    return Facts.from_json(json.loads(out.stdout.strip().splitlines()[-1]))


def test_probe_runs_torch_check_and_preflight(tmp_path: Path) -> None:
    from tests.payload.extract.helpers import make_records, write_jsonl

    rd = tmp_path / "rd"
    release = rd / "releases" / "abc"
    release.mkdir(parents=True)
    (release / "payload.pyz").write_bytes(releases.build_bytes())
    (rd / "current").symlink_to(release)
    inp = write_jsonl(tmp_path / "gen.jsonl", make_records(12))
    model = tiny_model_dir(tmp_path / "model")
    role = get_role("extractor")
    v: dict[str, Any] = dict(role.vars)
    v.update(python="python3", remote_dir=str(rd), gpus=1, model_dir=str(model), input=str(inp))

    facts = run_probe(tmp_path, v, "0/2")
    torch_facts = facts.torch
    assert torch_facts is not None and torch_facts.error is None and torch_facts.version
    assert facts.preflight is not None
    pre = json.loads(facts.preflight.out.strip().splitlines()[-1])
    assert facts.preflight.rc == 0 and pre["fits"] is True
    owned = sum(Shard(0, 2).owns(str(r["id"])) for r in make_records(12))
    assert pre["samples"] == owned < 12  # shard 0/2: this host's share only
    assert pre["estimate_bytes"] > 0 and pre["tokens"] > 0
    assert not (rd / "jobs").exists()  # the preflight writes nothing

    verdict = evaluate(facts, role, v)
    disk = next(c for c in verdict.checks if c.name == "disk for the features")
    assert disk.ok and f"for {owned} samples" in disk.have, disk
    cuda = next(c for c in verdict.checks if c.name == "CUDA via torch")
    assert cuda.ok == torch_facts.available  # CPU here: fails, with the CPU-build fix
    assert next(c for c in verdict.checks if c.name.startswith("file ")).ok


def test_verify_counts_fp8_features_at_half_the_bytes(tmp_path: Path) -> None:
    """The role's `feature_dtype` var reaches the payload's preflight that `fab verify`
    runs: fp8 speculators features are counted at 4H + 28 bytes a token, not 8H + 24."""
    from tests.payload.extract.helpers import HIDDEN, make_records, write_jsonl

    rd = tmp_path / "rd"
    release = rd / "releases" / "abc"
    release.mkdir(parents=True)
    (release / "payload.pyz").write_bytes(releases.build_bytes())
    (rd / "current").symlink_to(release)
    inp = write_jsonl(tmp_path / "gen.jsonl", make_records(4))
    model = tiny_model_dir(tmp_path / "model")
    role = get_role("extractor")
    v: dict[str, Any] = dict(role.vars)
    v.update(python=sys.executable, remote_dir=str(rd), gpus=1, model_dir=str(model),
             input=str(inp), format="speculators")
    per_token = {}
    for fd in ("bf16", "fp8"):
        v["feature_dtype"] = fd
        facts = run_probe(tmp_path, v, None)
        assert facts.preflight is not None and facts.preflight.rc == 0, facts.preflight
        pre = json.loads(facts.preflight.out.strip().splitlines()[-1])
        per_token[fd] = pre["bytes_per_token"]
        disk = next(c for c in evaluate(facts, role, v).checks
                    if c.name == "disk for the features")
        assert disk.ok and f"{pre['bytes_per_token']} B/token, {pre['feature_dtype']}" in disk.have
    assert per_token == {"bf16": 8 * HIDDEN + 24, "fp8": 4 * HIDDEN + 28}
