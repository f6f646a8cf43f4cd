"""scripts/gpu-check: the extractor's CUDA path, end to end, in one command, with nothing
downloaded.

    scripts/gpu-check                       # CUDA when torch sees it (the 1B run), else CPU (small)
    scripts/gpu-check --device cpu          # what CI runs: a small model, well under a minute
    scripts/gpu-check --json OUT.json       # also every figure as JSON

It builds a random Llama (on a GPU ~1.1B parameters, TinyLlama's shape: hidden 2048, 22
layers; on a CPU hidden 128, 8 layers) and a chat tokenizer locally, makes ~200 generator
records (24 on a CPU) with reasoning, and runs `payload extract` in-process on them in bf16
with the HF backend in every form: native, specforge, specforge + `--compress gzip`,
speculators, speculators + `--feature-dtype fp8`. Then:

- **correctness**: a few samples of each output are read back (gzip and FP8 decoded as the
  trainers do) and compared with the same model in fp32 on the CPU: relative L2 error of
  the stored states within a bf16 tolerance (FP8's own for fp8); each stored slot nearest
  to the model state it should hold (not a neighbouring layer, not the other side of the
  final norm); and the next-token top-1 from the stored final state (the lm_head after it,
  or after the target's norm for the pre-norm formats) equal to the fp32 model's on >= 99%
  of the positions where the fp32 model is confident (a random model's distribution is
  flat: over all positions, bf16 arithmetic alone flips ~7% of the 1B model's top-1s; the
  share over all positions is printed too);
- **speed**: each form's tokens/s (the extract phase: forward, capture, NaN/Inf check,
  copy to the host, writes) against a bare HF forward loop over exactly the same batches
  on the same device (the faster of a run before and one after the forms);
- **disk**: bytes a token on disk per form; gzip against .ckpt, fp8 against bf16.

It prints one summary line on stdout (progress on stderr) and exits 0 when every check
passes, 1 when one fails. A form whose module is missing is skipped and named with the
reason (speculators' layout needs `datasets`); nothing else beyond torch, transformers
(with tokenizers and safetensors) and this checkout is needed: no vLLM, no trainer, no
network. Budget: 8 minutes on one H200 for the 1B run; the wall time is in the summary.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import importlib.util
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BUDGET_S = 480
TOP1_MIN = 0.99
CONFIDENT = 0.2  # top-1 compared where it leads by > 0.2 std of the logits (see compare)
# Relative L2 error of the stored states against the fp32 model's. bf16 keeps 8 bits of
# mantissa (2^-9 relative per rounding) and the bf16 forward accumulates its own rounding
# over the layers; FP8 keeps 3 (a value within 1/16 of itself, ~1/28 rms).
TOLERANCE = {"bf16": 0.05, "fp8": 0.08}


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int  # the model's (>= the tokenizer's)
    samples: int
    batch_tokens: int
    max_length: int
    check: int  # samples compared with the fp32 model
    words: tuple[tuple[int, int], ...]  # (lo, hi) words: prompt, reasoning, response


SIZES = {
    "1b": Size(2048, 22, 32, 4, 5632, 32000, 200, 16384, 4096, 4,
               ((40, 300), (20, 200), (100, 700))),
    "small": Size(128, 8, 4, 4, 256, 0, 24, 2048, 512, 3, ((5, 40), (3, 20), (5, 60))),
}


@dataclass(frozen=True)
class Form:
    name: str
    fmt: str
    flags: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # modules the form's writer imports

    @property
    def fp8(self) -> bool:
        return "fp8" in self.flags


FORMS = (
    Form("native", "native"),
    Form("specforge", "specforge"),
    Form("specforge+gzip", "specforge", ("--compress", "gzip")),
    Form("speculators", "speculators", needs=("datasets",)),
    Form("speculators+fp8", "speculators", ("--feature-dtype", "fp8"), needs=("datasets",)),
)


def available(forms: tuple[Form, ...], has_module: Any = None,
              has_fp8: bool = True) -> tuple[list[Form], dict[str, str]]:
    """(the forms to run, {skipped form: why}): a form whose writer needs a module that is
    not installed (speculators' layout: `datasets`), or FP8 on a torch without it."""
    def installed(m: str) -> bool:
        return importlib.util.find_spec(m) is not None

    has = has_module or installed
    run: list[Form] = []
    skipped: dict[str, str] = {}
    for f in forms:
        missing = [m for m in f.needs if not has(m)]
        if missing:
            skipped[f.name] = (f"needs {', '.join(missing)} (pip install 'datasets>=4', or "
                               "ship its wheel)")
        elif f.fp8 and not has_fp8:
            skipped[f.name] = "this torch has no float8_e4m3fn"
        else:
            run.append(f)
    return run, skipped


def log(msg: str) -> None:
    print(f"[gpu-check] {msg}", file=sys.stderr, flush=True)


# -- the model, the tokenizer, the records ---------------------------------------------
SPECIALS = ["[UNK]", "<|pad|>", "<s>", "<|eot|>", "<|system|>", "<|user|>", "<|assistant|>",
            "<think>", "</think>"]
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


def vocabulary(n: int) -> list[str]:
    """n distinct pronounceable words (consonant-vowel syllables), the same every run."""
    rng = random.Random(7)
    cons, vows = "bcdfghjklmnprstvwz", "aeiou"
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(cons) + rng.choice(vows)
                          for _ in range(rng.randint(1, 4))))
    return sorted(words)


def build_tokenizer(words: list[str]) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIALS, min_frequency=1)
    # the template's own punctuation too (":" after each role), so nothing is [UNK]
    tok.train_from_iterator([" ".join([*words, ":", ",", ".", "?", "!"])], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<|pad|>",
                                   bos_token="<s>", eos_token="<|eot|>",
                                   chat_template=CHAT_TEMPLATE)


def build_model(size: Size, vocab: int, device: str, dest: Path) -> int:
    """A random Llama saved in bf16 under `dest`; returns its parameter count. Norm weights
    random (a pre-/post-norm mix-up shows), embeddings x4 copied into the lm_head (a
    peaked next-token distribution, so top-1 agreement is meaningful)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=max(vocab, size.vocab), hidden_size=size.hidden,
                      intermediate_size=size.intermediate, num_hidden_layers=size.layers,
                      num_attention_heads=size.heads, num_key_value_heads=size.kv_heads,
                      max_position_embeddings=size.max_length + 64, bos_token_id=2,
                      eos_token_id=3, pad_token_id=1, tie_word_embeddings=False)
    with torch.device(device):  # initialised where it runs: seconds for 1B on a GPU
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand_like(p))
        model.model.embed_tokens.weight.mul_(4)
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(dest)
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return params


def make_records(size: Size, words: list[str]) -> list[dict[str, Any]]:
    rng = random.Random(1)

    def text(bounds: tuple[int, int]) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(*bounds)))

    prompt, reasoning, response = size.words
    return [{"id": f"g-{i}", "messages": [{"role": "user", "content": text(prompt)}],
             "response": text(response), "reasoning": text(reasoning), "finish_reason": "stop"}
            for i in range(size.samples)]


# -- runs ------------------------------------------------------------------------------
def extract(form: Form, inp: Path, model: Path, out: Path, size: Size, device: str,
            ) -> dict[str, Any]:
    """One in-process `payload extract` run; its stats (exit code checked)."""
    from payload.extract import add_arguments, run

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--input", str(inp), "--model", str(model), "--output-dir", str(out),
                         "--dtype", "bfloat16", "--device", device, "--format", form.fmt,
                         *form.flags, "--batch-tokens", str(size.batch_tokens),
                         "--max-length", str(size.max_length), "--progress", "none"])
    t0 = time.perf_counter()
    rc = run(args)
    wall = time.perf_counter() - t0
    stats = json.loads(next(out.glob("stats.*.json")).read_text())
    stats.update(rc=rc, wall_s=wall)
    return stats


def planned(model: Path, inp: Path, max_length: int) -> list[Any]:
    """The samples exactly as the extractor tokenizes them (same renderer, same truncation)."""
    from transformers import AutoTokenizer

    from payload.extract.tokens import Renderer, parse_record, truncate

    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    lines = inp.read_text().splitlines()
    convs = [parse_record(line, i) for i, line in enumerate(lines, 1)]
    samples = [s for s in Renderer(tok, "include", {tok.eos_token_id}).encode_many(convs)
               if not isinstance(s, Exception)]  # a BoundaryError: the extractor fails it too
    return [truncate(s, max_length) if s.num_tokens > max_length else s for s in samples]


def bare_forward(model_dir: Path, samples: list[Any], batch_tokens: int, device: str,
                 ) -> float:
    """tokens/s of the decoder alone over the extractor's batch plan: no hooks, no copies,
    no writes (what `for batch: model.model(**batch)` costs on this device)."""
    import torch
    from transformers import AutoModelForCausalLM

    from payload.extract.batching import collate, plan_batches

    kw: dict[str, Any] = {"dtype": torch.bfloat16, "local_files_only": True}
    if device == "cuda":
        kw["device_map"] = {"": 0}
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kw).eval()
    decoder = model.get_decoder()
    dev = next(model.parameters()).device
    batches = [collate([samples[i] for i in idx], 0)
               for idx in plan_batches([s.num_tokens for s in samples], batch_tokens)]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            decoder(input_ids=b.input_ids.to(dev, non_blocking=True),
                    attention_mask=b.attention_mask.to(dev, non_blocking=True),
                    position_ids=b.position_ids.to(dev, non_blocking=True), use_cache=False)
    sync()
    took = time.perf_counter() - t0
    del model, decoder
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return sum(s.num_tokens for s in samples) / took


# -- reading an output back, as its trainer does ---------------------------------------
def read_sample(out: Path, form: Form, entry: dict[str, Any]) -> dict[str, Any]:
    """{"ids" [T], "aux" [T, 3H] fp32, "final" [T, H] fp32} of one manifest entry."""
    import torch
    from safetensors.torch import load_file

    from payload.extract.feature_dtype import SCALES_KEY, dequantize

    path = out / entry["file"]
    if form.fmt == "native":
        f = load_file(str(path))
        return {"ids": f["input_ids"], "aux": f["aux_hidden_states"].float(),
                "final": f["hidden_state"].float()}
    if form.fmt == "specforge":
        if path.name.endswith(".gz"):  # SpecForge's load_feature_file, as it reads one
            with gzip.open(path, "rb") as fh:
                f = torch.load(io.BytesIO(fh.read()), weights_only=True)
        else:
            f = torch.load(path, weights_only=True, mmap=True)
        return {"ids": f["input_ids"], "aux": f["aux_hidden_state"][0].float(),
                "final": f["hidden_state"][0].float()}
    f = load_file(str(path))
    hs = f["hidden_states"]
    if SCALES_KEY in f:  # hs-connectors' FP8Transfer: values x scale, in bf16
        hs = dequantize(hs, f[SCALES_KEY])
    hs = hs.float()
    return {"ids": f["token_ids"], "aux": hs[:, :3].flatten(1), "final": hs[:, 3]}


def fp8_on(stored: dict[str, Any], device: str) -> dict[str, float]:
    """FP8 quantization on `device` against the CPU's bytes (which are hs-connectors',
    tests/payload/extract/formats/test_smaller.py), on a stored sample's bf16 states: the
    speculators+fp8 form quantizes on the GPU, and this is measured even where that form
    is skipped (no `datasets`). {"bytes_differing": share of FP8 values not bit-equal,
    "scale_rel_diff": largest relative difference of a scale}."""
    import torch

    from payload.extract.feature_dtype import quantize

    aux, final = stored["aux"].bfloat16()[None], stored["final"].bfloat16()[None]
    qa, qf, sc = (t.cpu() for t in quantize(aux.to(device), final.to(device)))
    ra, rf, rs = quantize(aux, final)
    differ = sum(int((a.view(torch.uint8) != b.view(torch.uint8)).sum())
                 for a, b in ((qa, ra), (qf, rf)))
    return {"bytes_differing": differ / (ra.numel() + rf.numel()),
            "scale_rel_diff": float(((sc - rs).abs() / rs).max())}


def disk_bytes(out: Path, form: Form) -> int:
    """The feature files' bytes (speculators: row files and the dataset's Arrow files)."""
    if form.fmt == "speculators":
        files = [*(out / "hidden_states").glob("*.safetensors"), *out.glob("data-*.arrow")]
    else:
        suffix = ".safetensors" if form.fmt == "native" else \
            ".ckpt.gz" if "--compress" in form.flags else ".ckpt"
        files = [p for p in (out / "samples").rglob(f"*{suffix}") if not p.name.startswith(".")]
    return sum(p.stat().st_size for p in files)


@dataclass
class Reference:
    """The fp32 CPU model and its view of the checked samples, computed once."""

    model: Any
    layers: list[int]
    views: dict[tuple[int, ...], dict[str, Any]] = field(default_factory=dict)

    def view(self, ids: Any) -> dict[str, Any]:
        import torch

        key = tuple(ids.tolist())
        if key not in self.views:
            seen: dict[str, Any] = {}
            norm = self.model.model.norm
            h = norm.register_forward_pre_hook(lambda _m, a: seen.__setitem__("pre", a[0]))
            try:
                with torch.inference_mode():
                    o = self.model(input_ids=ids[None], output_hidden_states=True)
            finally:
                h.remove()
            self.views[key] = {"hs": [x[0] for x in o.hidden_states], "pre": seen["pre"][0],
                               "logits": o.logits[0]}
        return self.views[key]


def compare(ref: Reference, form: Form, got: dict[str, Any]) -> dict[str, Any]:
    """How one stored sample compares with the fp32 model:

    - `aux_rel_l2`, `final_rel_l2`: relative L2 errors against the states the format
      stores (max over the three aux layers);
    - `misplaced`: stored slots nearer to another of the model's states than to their own
      (every decoder layer's output, the final norm's input and output are candidates;
      neighbouring layers differ by tens of percent, rounding by a few);
    - top-1 of the next token from the stored final state against the fp32 model's, over
      all positions (`top1_all`) and over the positions where the fp32 model is confident
      (`top1`: its top-1 leads the runner-up by more than CONFIDENT x the logits' standard
      deviation). A random model's distribution is flat: over all positions bf16 itself
      disagrees with fp32 on ~7% of the 1B model's positions; where one token clearly
      leads, a correct extraction agrees.
    """
    import torch

    v = ref.view(got["ids"])
    n = len(v["hs"]) - 1
    raw_last = form.fmt != "native"  # the trainer formats store the pre-norm last layer
    prenorm = form.fmt == "speculators"
    candidates = {f"L{k}": v["hs"][k] for k in range(1, n)}
    candidates.update(prenorm=v["pre"], postnorm=v["hs"][n])
    wants = [("prenorm" if raw_last else "postnorm") if k == n else f"L{k}" for k in ref.layers]
    wants.append("prenorm" if prenorm else "postnorm")
    h = got["final"].shape[-1]
    slots = [got["aux"][:, i * h:(i + 1) * h] for i in range(3)] + [got["final"]]

    def rel(a: Any, b: Any) -> float:
        return float((a - b).norm() / b.norm())

    errors, misplaced = [], []
    for i, (slot, want) in enumerate(zip(slots, wants, strict=True)):
        errs = {name: rel(slot, c) for name, c in candidates.items()}
        errors.append(errs[want])
        nearest = min(errs, key=lambda k: errs[k])
        if nearest != want:
            misplaced.append(f"slot {i} holds {nearest}, not {want}")
    m = ref.model
    with torch.inference_mode():
        post = m.model.norm(got["final"]) if prenorm else got["final"]
        logits = m.lm_head(post)
    want_logits = v["logits"]
    agree = logits.argmax(-1) == want_logits.argmax(-1)
    top2 = want_logits.topk(2, dim=-1).values
    sure = (top2[:, 0] - top2[:, 1]) > CONFIDENT * want_logits.std(-1)
    return {"aux_rel_l2": max(errors[:3]), "final_rel_l2": errors[3], "misplaced": misplaced,
            "agree_all": int(agree.sum()), "positions": int(agree.numel()),
            "agree_sure": int(agree[sure].sum()), "sure": int(sure.sum())}


def check_form(form: Form, inp: Path, model_dir: Path, out: Path, size: Size, device: str,
               samples: list[Any], check_keys: set[str], state: dict[str, Any],
               report: dict[str, Any], failures: list[str]) -> None:
    """Extract `form`, then check what it wrote: every sample, bytes a token, the checked
    samples against the fp32 model (loaded once, into `state`); a row in report["forms"]."""
    import torch
    from transformers import AutoModelForCausalLM

    stats = extract(form, inp, model_dir, out, size, device)
    tokens = sum(s.num_tokens for s in samples)
    row: dict[str, Any] = {
        "rc": int(stats["rc"]), "written": stats.get("written"),
        "tokens_per_s": round(stats.get("tokens_per_s") or 0.0),
        "extract_s": round(stats.get("extract_s") or 0.0, 2),
        "wall_s": round(stats["wall_s"], 1)}
    report["forms"][form.name] = row
    if stats["rc"] != 0 or stats.get("written") != len(samples):
        failures.append(f"{form.name}: exit {stats['rc']}, wrote {stats.get('written')} of "
                        f"{len(samples)}")
        return
    row["bytes"] = disk_bytes(out, form)
    row["bytes_per_token"] = round(row["bytes"] / tokens, 1)
    if state["ref"] is None:
        meta = json.loads((out / "meta.json").read_text())
        cpu_model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, local_files_only=True).eval()
        state["ref"] = Reference(cpu_model, meta["layers"])
    ref: Reference = state["ref"]
    entries = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    errs = [compare(ref, form, read_sample(out, form, e)) for e in entries
            if str(e["id"]) in check_keys]
    if len(errs) != len(check_keys):
        failures.append(f"{form.name}: {len(errs)} of the {len(check_keys)} checked samples "
                        "found in its manifest")
        return
    tol = TOLERANCE["fp8" if form.fp8 else "bf16"]
    sure = sum(e["sure"] for e in errs)
    row.update(checked=len(errs), tolerance=tol,
               aux_rel_l2=round(max(e["aux_rel_l2"] for e in errs), 5),
               final_rel_l2=round(max(e["final_rel_l2"] for e in errs), 5),
               top1=round(sum(e["agree_sure"] for e in errs) / max(sure, 1), 4),
               top1_positions=sure,
               top1_all=round(sum(e["agree_all"] for e in errs)
                              / sum(e["positions"] for e in errs), 4))
    misplaced = [m for e in errs for m in e["misplaced"]]
    if max(row["aux_rel_l2"], row["final_rel_l2"]) > tol:
        failures.append(f"{form.name}: relative error {row['aux_rel_l2']}/"
                        f"{row['final_rel_l2']} > {tol}")
    if misplaced:
        failures.append(f"{form.name}: {misplaced[0]}")
    if row["top1"] < TOP1_MIN or not sure:
        failures.append(f"{form.name}: top-1 {row['top1']} on {sure} confident positions")
    log(f"{form.name}: {row}")
    if form.name == "native" and device == "cuda":
        fp8 = fp8_on(read_sample(out, form, entries[0]), device)
        report["fp8_cuda_vs_cpu"] = fp8
        # the same arithmetic (IEEE fp32 division, round-to-nearest casts): any difference
        # beyond a rare rounding tie would be a different quantization, not rounding
        if fp8["scale_rel_diff"] > 1e-6 or fp8["bytes_differing"] > 1e-3:
            failures.append(f"fp8: quantized on cuda differs from the CPU's: {fp8}")


# -- the run ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                    help="auto: cuda when torch sees a GPU (default)")
    ap.add_argument("--size", choices=["auto", *SIZES], default="auto",
                    help="the model: 1b (the GPU run) or small (the CPU run); auto: by device")
    ap.add_argument("--samples", type=int, default=None, help="records (default 200 / 24)")
    ap.add_argument("--forms", default=",".join(f.name for f in FORMS),
                    help="comma-separated subset of: " + ", ".join(f.name for f in FORMS))
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the model and outputs go (default: a temp dir, removed)")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure here")
    a = ap.parse_args(argv)

    t_start = time.perf_counter()
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    device = ("cuda" if cuda else "cpu") if a.device == "auto" else a.device
    if device == "cuda" and not cuda:
        ap.error(f"--device cuda, but torch {torch.__version__} sees no CUDA device")
    size_name = ("1b" if device == "cuda" else "small") if a.size == "auto" else a.size
    size = SIZES[size_name]
    if a.samples:
        size = Size(**{**size.__dict__, "samples": a.samples})
    wanted = a.forms.split(",")
    unknown = set(wanted) - {f.name for f in FORMS}
    if unknown:
        ap.error(f"--forms: unknown {sorted(unknown)}")
    forms, skipped = available(tuple(f for f in FORMS if f.name in wanted),
                               has_fp8=hasattr(torch, "float8_e4m3fn"))
    where = (torch.cuda.get_device_name(0) if device == "cuda" else
             f"cpu ({os.cpu_count()} cores)")
    log(f"{where}; torch {torch.__version__}, transformers {transformers.__version__}; "
        f"size {size_name}; forms {', '.join(f.name for f in forms)}"
        + (f"; skipped {skipped}" if skipped else ""))

    work = a.workdir or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HOME", str(work / "hf-home"))
    report: dict[str, Any] = {"device": where, "torch": torch.__version__,
                              "transformers": transformers.__version__, "size": size_name,
                              "skipped": skipped, "forms": {}}
    failures: list[str] = []
    try:
        model_dir = work / "model"
        words = vocabulary(6000 if size_name == "1b" else 400)
        tok = build_tokenizer(words)
        t0 = time.perf_counter()
        params = build_model(size, len(tok), device, model_dir)
        tok.save_pretrained(model_dir)
        report.update(params=params, build_s=round(time.perf_counter() - t0, 1))
        log(f"random llama, {params:,} params (hidden {size.hidden}, {size.layers} "
            f"layers) built and saved in {report['build_s']} s")
        inp = work / "records.jsonl"
        inp.write_text("".join(json.dumps(r) + "\n" for r in make_records(size, words)))
        samples = planned(model_dir, inp, size.max_length)
        tokens = sum(s.num_tokens for s in samples)
        report.update(samples=len(samples), tokens=tokens)

        bare = [bare_forward(model_dir, samples, size.batch_tokens, device)]
        log(f"bare forward: {bare[0]:,.0f} tokens/s ({len(samples)} samples, {tokens} tokens)")
        # the samples compared with the fp32 model: a few of middling length (CPU time)
        by_len = sorted(samples, key=lambda s: abs(s.num_tokens - 256))
        check_keys = {s.key for s in by_len[:size.check]}  # (fewer with --samples < check)
        state: dict[str, Any] = {"ref": None}
        for form in forms:
            out = work / f"out-{form.name}"
            try:  # one form's failure is reported, the other forms still run
                check_form(form, inp, model_dir, out, size, device, samples, check_keys,
                           state, report, failures)
            except Exception as exc:
                import traceback

                traceback.print_exc()
                failures.append(f"{form.name}: crashed: {type(exc).__name__}: {exc}")
            finally:
                shutil.rmtree(out, ignore_errors=True)  # 1B: gigabytes each
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
        bare.append(bare_forward(model_dir, samples, size.batch_tokens, device))
        best = max(bare)
        report["bare_tokens_per_s"] = [round(b) for b in bare]
        for row in report["forms"].values():
            row["vs_bare"] = round(row["tokens_per_s"] / best, 3)
        plain = {name: row["bytes"] for name, row in report["forms"].items() if "bytes" in row}
        if "specforge" in plain and "specforge+gzip" in plain:
            report["gzip_vs_ckpt"] = round(plain["specforge+gzip"] / plain["specforge"], 4)
        if "speculators" in plain and "speculators+fp8" in plain:
            report["fp8_vs_bf16"] = round(plain["speculators+fp8"] / plain["speculators"], 4)
    except Exception as exc:  # a crash is a failed check, reported on the summary line
        import traceback

        traceback.print_exc()
        failures.append(f"crashed: {type(exc).__name__}: {exc}")
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    wall = time.perf_counter() - t_start
    report.update(wall_s=round(wall, 1), budget_s=BUDGET_S, failures=failures)
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))
    print(summary(report))
    return 1 if failures else 0


def summary(r: dict[str, Any]) -> str:
    """The one line: verdict, device, model, per-form speed/disk/accuracy, skips, wall."""
    parts = [f"gpu-check {'FAIL' if r['failures'] else 'PASS'}",
             f"{r['device']}, torch {r['torch']}, transformers {r['transformers']}"]
    if "params" in r:
        p = r["params"]
        count = f"{p / 1e9:.2f}B" if p >= 1e8 else f"{p / 1e6:.1f}M"
        parts.append(f"llama {count} bf16, {r.get('samples')} samples / {r.get('tokens')} tokens")
    if r.get("bare_tokens_per_s"):
        parts.append(f"bare forward {max(r['bare_tokens_per_s']):,} tok/s")
    for name, row in r["forms"].items():
        if "top1" not in row:
            parts.append(f"{name} not checked")
            continue
        parts.append(f"{name} {row['tokens_per_s']:,} tok/s ({row.get('vs_bare', '?')}x bare), "
                     f"{row['bytes_per_token']} B/tok, err {max(row['aux_rel_l2'], row['final_rel_l2'])}"
                     f" (tol {row['tolerance']}), top-1 {row['top1']:.1%} of "
                     f"{row['top1_positions']} confident ({row['top1_all']:.1%} of all)")
    if "gzip_vs_ckpt" in r:
        parts.append(f"gzip {r['gzip_vs_ckpt']} of .ckpt")
    if "fp8_vs_bf16" in r:
        parts.append(f"fp8 {r['fp8_vs_bf16']} of bf16")
    if "fp8_cuda_vs_cpu" in r:
        d = r["fp8_cuda_vs_cpu"]
        parts.append(f"fp8 quantized on cuda vs cpu: {d['bytes_differing']:.2e} of values "
                     f"differ, scales within {d['scale_rel_diff']:.1e}")
    if r["skipped"]:
        parts.append("skipped " + "; ".join(f"{k}: {v}" for k, v in r["skipped"].items()))
    if r["failures"]:
        parts.append("failed: " + "; ".join(r["failures"]))
    over = " OVER BUDGET" if r["wall_s"] > r["budget_s"] else ""
    parts.append(f"wall {r['wall_s']} s (budget {r['budget_s']} s{over})")
    return " | ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
