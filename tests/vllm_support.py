"""What the tests that run a real vLLM engine share: the vLLM venv, its environment, a
tiny chat model vLLM serves, and a look at the engine processes still alive.

vLLM lives in its own venv (it pins transformers < 5.20 and setuptools):
`scripts/vllm-venv` builds it, and `scripts/test` calls that first, so a plain test run
has it. Without it (a bare `pytest`), these tests skip and say how to get it.

The model: a random Llama (hidden 256, 6 layers, 4 heads / 2 KV heads: head size 64,
which vLLM's CPU attention supports), random norm weights (0.5 + U[0,1): a pre-/post-norm
mix-up shows), max_position_embeddings 2048, a byte-level BPE tokenizer trained here and
a ChatML chat template that renders `reasoning_content` in the final assistant turn.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VLLM_VERSION = "0.32.0"
NUM_LAYERS = 6
HIDDEN = 256
MAX_POSITIONS = 2048
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and loop.last and m.reasoning_content %}"
    "<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_WORD_TEXT = ("the a of to and in is it that what why how who you we they can will do not yes "
               "hello please tell me about story cat dog sky blue red water fire one two three "
               "think answer question")
WORDS = _WORD_TEXT.split()


def vllm_python() -> Path:
    """The vLLM venv's python (HANDOFF_VLLM_PYTHON, else where scripts/vllm-venv builds it:
    as root on a system python, /var/cache, so the sandbox's container users can run it)."""
    explicit = os.environ.get("HANDOFF_VLLM_PYTHON")
    if explicit:
        return Path(explicit)
    venv = os.environ.get("HANDOFF_VLLM_VENV")
    if not venv and os.geteuid() == 0 and Path("/usr/bin/python3").exists():
        venv = f"/var/cache/handoff-vllm-{VLLM_VERSION}"
    return Path(venv or Path.home() / ".cache" / "handoff" / f"vllm-{VLLM_VERSION}") / "bin" / "python"


def needs_vllm() -> Path:
    import pytest  # lazily: the benchmark imports this module in the vLLM venv, without pytest

    if os.environ.get("HANDOFF_NO_VLLM"):
        pytest.skip("HANDOFF_NO_VLLM is set: the tests against a real vLLM engine are off")
    py = vllm_python()
    if not py.is_file():
        pytest.skip(f"the vLLM venv is absent ({py}): run `bash scripts/vllm-venv` "
                    "(scripts/test builds it) to run the tests against a real vLLM engine")
    return py


def engine_env(tp: int = 1) -> dict[str, str]:
    """The environment every engine of the tests runs in: loopback only, offline."""
    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    if tp == 2:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    return env


def build_chat_model(d: Path, seed: int = 0) -> Path:
    """Save the tiny model and its tokenizer to `d` (sharded: SpecForge's TargetHead
    reads only a *.index.json)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(seed)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) + " .,?!:;()0123456789"
              for _ in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)
    fast.save_pretrained(d)
    torch.manual_seed(seed)
    eos = fast.convert_tokens_to_ids("<|im_end|>")
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=HIDDEN, intermediate_size=512,
                      num_hidden_layers=NUM_LAYERS, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=MAX_POSITIONS, eos_token_id=eos, pad_token_id=0,
                      bos_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(0.5 + torch.rand_like(param))
    model.save_pretrained(d, max_shard_size="2MB")
    return d


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def chat_records(n: int, seed: int = 1) -> list[dict[str, Any]]:
    """Generator-style records: some with reasoning, some multi-turn, varied lengths."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": sentence(rng, rng.randint(3, 40))}]
        if i % 4 == 1:
            msgs += [{"role": "assistant", "content": sentence(rng, rng.randint(2, 10))},
                     {"role": "user", "content": sentence(rng, rng.randint(2, 10))}]
        out.append({"id": i if i % 2 else f"s-{i}", "messages": msgs,
                    "response": sentence(rng, rng.randint(1, 60)),
                    "reasoning": sentence(rng, rng.randint(2, 12)) if i % 2 == 0 else None,
                    "finish_reason": "stop"})
    return out


def marked_engine_processes(prefix: str = "") -> list[int]:
    """Pids of live processes marked by the vllm backend (reaper.ENV), optionally only
    those of one owner (reaper.owner_of)."""
    from payload.extract.backends.reaper import ENV, marked

    alive = []
    for pid, _mark in marked(prefix):
        try:
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            alive.append(pid)
    assert ENV  # the variable the backend marks its engine with
    return alive
