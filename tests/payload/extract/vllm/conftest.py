"""Module fixtures of the vLLM extraction tests: the vLLM venv, the tiny chat model, the
input, and the HF backend's output per format (the reference). Module-scoped: each test
file of this folder builds its own, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.payload.extract.helpers import run_extract, write_jsonl
from tests.payload.extract.vllm.cases import COMMON, RECORDS
from tests.vllm_support import build_chat_model, needs_vllm


@pytest.fixture(scope="module")
def vpy() -> Path:
    return needs_vllm()


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_model(tmp_path_factory.mktemp("vllm-llama"))


@pytest.fixture(scope="module")
def inp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("vllm-in") / "in.jsonl", RECORDS)


@pytest.fixture(scope="module")
def hf_out(tmp_path_factory: pytest.TempPathFactory, chat_model: Path, inp: Path):
    """The HF backend's output per format (and storage flags; in-process, the reference)."""
    made: dict[tuple[str, ...], Path] = {}

    def get(fmt: str, *flags: str) -> Path:
        key = (fmt, *flags)
        if key not in made:
            out = tmp_path_factory.mktemp(f"hf-{fmt}") / "out"
            assert run_extract(inp, chat_model, out, "--format", fmt, *flags, *COMMON) == 0
            made[key] = out
        return made[key]

    return get
