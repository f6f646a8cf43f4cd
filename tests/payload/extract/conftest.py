"""Session fixtures of the extract tests: the tiny model's folder, its tokenizer, the
model loaded in fp32 (the reference the features must equal). Helpers: helpers.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.payload.extract.helpers import build_model, build_tokenizer


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    tok = build_tokenizer()
    model = build_model(len(tok))
    # sharded, so the folder has a *.index.json (SpecForge's TargetHead reads only that)
    model.save_pretrained(d, max_shard_size="400KB")
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


@pytest.fixture(scope="session")
def hf_model(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                local_files_only=True).eval()


@pytest.fixture(scope="session")
def peaked_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny model with a peaked next-token distribution (helpers.build_model): for
    top-1 agreement checks of rounded features (FP8)."""
    d = tmp_path_factory.mktemp("tiny-llama-peaked")
    tok = build_tokenizer()
    build_model(len(tok), peaked=True).save_pretrained(d, max_shard_size="400KB")
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def peaked_hf_model(peaked_model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(peaked_model_dir, dtype=torch.float32,
                                                local_files_only=True).eval()
