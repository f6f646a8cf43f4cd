"""Helpers of the extract tests: a tiny Llama-shaped model and a chat tokenizer (built in
the test session), records, runs, and readers of every format's output.

Nothing is downloaded: HF_HUB_OFFLINE=1 and HF_HOME points at a temp dir before
transformers is imported. The tokenizer is a WordLevel model trained here and wrapped
in PreTrainedTokenizerFast with a Jinja chat template that has a thinking convention
(`reasoning_content` rendered as `<think> ... </think>` in the final assistant turn,
like Qwen3/Kimi) and a generation prompt `<|assistant|>:` that a response starting
with punctuation merges into (`:!`), which is how the boundary-mismatch test fails.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HF_HOME = tempfile.mkdtemp(prefix="hf-home-")
atexit.register(shutil.rmtree, _HF_HOME, True)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HOME"] = _HF_HOME
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SPECIALS = ["[UNK]", "<|pad|>", "<s>", "<|eot|>", "<|system|>", "<|user|>", "<|assistant|>",
            "<think>", "</think>"]
_WORD_TEXT = ("the a an of to and in is it that what why how who when where which you we "
              "they he she can could would should will do does did not no yes hello hi please "
              "tell me about story cat dog sky blue red green water fire earth air one two three "
              "four five six seven eight nine ten think thought first then so because answer "
              "question are was were be been sure ok here there this those these more less many "
              "few poison long word reason step : , . ? ! ( ) - :!")
WORDS = _WORD_TEXT.split()

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|{{ m.role }}|>:"
    "{% if m.role == 'assistant' and loop.last and m.reasoning_content %}"
    "<think> {{ m.reasoning_content }} </think> "
    "{% endif %}"
    "{{ m.content }}<|eot|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>:{% endif %}"
)

REPO = Path(__file__).resolve().parents[3]
NUM_LAYERS = 8
HIDDEN = 64


def build_tokenizer(chat_template: str = CHAT_TEMPLATE, *, specials: tuple[str, ...] = (),
                    words: tuple[str, ...] = (), bos: str = "<s>", eos: str = "<|eot|>",
                    ) -> Any:
    """The WordLevel chat tokenizer; `specials`/`words` add to the vocabulary (the
    family templates' own tokens, templates.py), `bos`/`eos` name its bos and eos."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=[*SPECIALS, *specials], min_frequency=1)
    tok.train_from_iterator([" ".join([*WORDS, *words])] * 2, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="<|pad|>", bos_token=bos,
        eos_token=eos, chat_template=chat_template)


def build_model(vocab: int, seed: int = 0, *, peaked: bool = False) -> Any:
    """Random weights, norm weights included (0.5 + U[0, 1)): with HF's init (all 1) the
    states before and after the final norm differ only by a scale, which hides a
    pre-/post-norm mix-up from every comparison of logits.

    `peaked`: embeddings scaled x4 and copied into the lm_head (not tied: both are saved),
    so the next-token distribution has a clear top-1. A random head's distribution is
    nearly flat (its top two logits often differ by less than any rounding), and top-1
    agreement under FP8 or bf16 rounding then says more about the fixture than the data."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=128,
                      num_hidden_layers=NUM_LAYERS, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=512,
                      bos_token_id=2, eos_token_id=3, pad_token_id=1)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(0.5 + torch.rand_like(param))
        if peaked:
            model.model.embed_tokens.weight.mul_(4)
            model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    return model


@dataclass
class Reference:
    """The target model's own view of one sequence (fp32): what the features must equal."""

    hidden_states: tuple  # HF's output_hidden_states: [0] embeddings ... [N] post-norm
    prenorm: Any  # [T, H] the final norm's input (the last decoder layer's raw output)
    logits: Any  # [T, V]

    @property
    def postnorm(self) -> Any:
        return self.hidden_states[-1]


def reference(hf_model: Any, input_ids: Any) -> Reference:
    import torch

    seen: dict[str, Any] = {}
    norm = hf_model.get_decoder().norm
    handle = norm.register_forward_pre_hook(lambda _m, inp: seen.__setitem__("x", inp[0]))
    try:
        with torch.inference_mode():
            out = hf_model(input_ids=input_ids[None], output_hidden_states=True)
    finally:
        handle.remove()
    return Reference(tuple(h[0] for h in out.hidden_states), seen["x"][0], out.logits[0])


def sentence(rng: Any, n: int) -> str:
    plain = [w for w in WORDS if w.isalpha() and w != "poison"]
    return " ".join(rng.choice(plain) for _ in range(n))


def make_records(n: int, seed: int = 1) -> list[dict[str, Any]]:
    """Generator-style output records of varied lengths; some with reasoning, some multi-turn."""
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        msgs: list[dict[str, Any]] = []
        if i % 3 == 0:
            msgs.append({"role": "system", "content": sentence(rng, 4)})
        msgs.append({"role": "user", "content": sentence(rng, rng.randint(3, 40))})
        if i % 4 == 1:  # multi-turn: an earlier assistant turn is context only
            msgs.append({"role": "assistant", "content": sentence(rng, rng.randint(2, 10))})
            msgs.append({"role": "user", "content": sentence(rng, rng.randint(2, 10))})
        out.append({"id": i if i % 2 else f"s-{i}", "messages": msgs,
                    "response": sentence(rng, rng.randint(1, 60)),
                    "reasoning": sentence(rng, rng.randint(2, 12)) if i % 2 == 0 else None,
                    "finish_reason": "stop"})
    return out


def write_jsonl(path: Path, records: list[Any]) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def extract_args(*argv: str) -> argparse.Namespace:
    from payload.extract import add_arguments

    parser = argparse.ArgumentParser(prog="extract")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def run_extract(inp: Path, model: Path, out: Path, *extra: str) -> int:
    """In-process run (no second `import torch`); same code path as the CLI."""
    from payload.extract import run

    return run(extract_args("--input", str(inp), "--model", str(model), "--output-dir",
                            str(out), "--dtype", "float32", "--progress", "none", *extra))


def manifest(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def load_sample(out: Path, rel: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(out / rel))


def stats(out: Path) -> dict[str, Any]:
    files = sorted(out.glob("stats.*.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(files[-1].read_text())


def read_features(out: Path, fmt: str) -> dict[str, dict[str, Any]]:
    """Every sample of an output dir, by str(id), read the way its trainer reads it:
    {"input_ids" [T], "loss_mask" [T], "aux" [T, 3H], "final" [T, H], "row"/"file"}."""
    import torch

    entries = manifest(out)
    found: dict[str, dict[str, Any]] = {}
    if fmt == "native":
        for e in entries:
            f = load_sample(out, e["file"])
            found[str(e["id"])] = {"input_ids": f["input_ids"], "loss_mask": f["loss_mask"],
                                   "aux": f["aux_hidden_states"], "final": f["hidden_state"],
                                   "file": e["file"]}
    elif fmt == "specforge":
        by_file = {e["file"]: e for e in entries}
        # SpecForge's reader walks the dir for *.ckpt and *.ckpt.gz
        ckpts = sorted([*out.rglob("*.ckpt"), *out.rglob("*.ckpt.gz")])
        assert len(ckpts) == len(entries)
        for p in ckpts:
            if p.name.endswith(".gz"):
                import gzip
                import io

                with gzip.open(p, "rb") as gz:
                    f = torch.load(io.BytesIO(gz.read()), weights_only=True)
            else:
                f = torch.load(p, mmap=True, weights_only=True)
            e = by_file[str(p.relative_to(out))]
            found[str(e["id"])] = {"input_ids": f["input_ids"], "loss_mask": f["loss_mask"],
                                   "aux": f["aux_hidden_state"][0], "final": f["hidden_state"][0],
                                   "file": e["file"], "raw": f}
    elif fmt == "speculators":
        from datasets import load_from_disk
        from safetensors.torch import load_file

        ds = load_from_disk(str(out))
        assert [e["row"] for e in entries] == list(range(len(ds))), "rows are not dense"
        for e in entries:
            row = ds[e["row"]]
            hs = load_file(str(out / "hidden_states" / f"hs_{e['row']}.safetensors"))
            assert e["file"] == f"hidden_states/hs_{e['row']}.safetensors"
            assert torch.equal(hs["token_ids"], row["input_ids"])  # what speculators checks
            assert int(row["seq_len"]) == len(row["input_ids"]) == e["num_tokens"]
            states = hs["hidden_states"]
            if "hidden_states_scales" in hs:  # FP8: dequantized exactly (fp32), not as bf16
                from payload.extract.feature_dtype import dequantize

                states = dequantize(states, hs["hidden_states_scales"], torch.float32)
            found[str(e["id"])] = {"input_ids": row["input_ids"], "loss_mask": row["loss_mask"],
                                   "aux": states[:, :3].flatten(1),
                                   "final": states[:, 3], "row": e["row"],
                                   "file": e["file"], "raw": hs}
    else:
        raise AssertionError(fmt)
    assert len(found) == len(entries), "an id is listed twice"
    return found


def samples_like(entries: list) -> list:
    """Samples of the manifest's lengths and spans (what a size estimate needs)."""
    from array import array

    from payload.extract.tokens import Sample

    return [Sample(e["id"], str(e["id"]), array("i", [0] * e["num_tokens"]),
                   e["num_tokens"] - e["num_supervised"], e["num_tokens"]) for e in entries]
