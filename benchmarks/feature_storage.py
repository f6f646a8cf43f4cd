"""The smaller feature forms, measured: bytes on disk and write speed per writer thread.

    .venv/bin/python benchmarks/feature_storage.py [--samples 48] [--reps 3] [--hidden 1024]
    .venv/bin/python benchmarks/feature_storage.py --features OUT   # your own features

Makes bf16 features once (the extractor itself, `--format specforge --dtype bfloat16`, on
a random Llama of width --hidden built in a temp dir; or, with --features, the samples of
an existing output dir of any format), then writes those same tensors again through each
form's own `write` on ONE thread, alternating the forms, --reps times:

  specforge     .ckpt (torch.save), the baseline
  gzip-1/6/9    .ckpt.gz at zlib level 1 (what --compress gzip writes), 6 and 9
  spec-bf16     speculators' row file, bf16
  spec-fp8      speculators' row file, fp8 (--feature-dtype fp8), quantized on the CPU here
                (on a GPU the extractor quantizes on the device: see scripts/gpu-check)

Prints per form: bytes a token on disk and against the baseline of its format, and the
median write rate per thread in MB/s of bf16 features (8*H bytes a token: the rate the
extractor can hand it features at) and tokens/s. The extractor writes on two threads, so a
form keeps up with a GPU while 2 x its rate exceeds what the GPU produces (tokens/s x 8*H).

A random model's states are nearly Gaussian; a trained model's have heavier tails (a few
outlier channels), which moves the bf16 exponents' spread and so gzip's ratio: measure your
own features with --features before deciding (docs/training.md, "Smaller features").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf-home-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FORMS = ("specforge", "gzip-1", "gzip-6", "gzip-9", "spec-bf16", "spec-fp8")


def build(d: Path, hidden: int, layers: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.payload.extract.helpers import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                      max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # random norm weights, as the tests' models (helpers.build_model)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand_like(p))
    model.to(torch.bfloat16).save_pretrained(d / "model")
    tok.save_pretrained(d / "model")
    return d / "model"


def records(n: int) -> list[dict]:
    import random

    from tests.payload.extract.helpers import sentence

    rng = random.Random(0)
    return [{"id": i, "messages": [{"role": "user", "content": sentence(rng, rng.randint(20, 150))}],
             "response": sentence(rng, rng.randint(100, 400)),
             "reasoning": sentence(rng, rng.randint(10, 60))} for i in range(n)]


def make_features(d: Path, samples: int, hidden: int) -> Path:
    from payload.extract import add_arguments, run

    model = build(d, hidden, 8)
    inp = d / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in records(samples)))
    p = argparse.ArgumentParser()
    add_arguments(p)
    out = d / "features"
    assert run(p.parse_args(["--input", str(inp), "--model", str(model), "--output-dir",
                             str(out), "--dtype", "bfloat16", "--format", "specforge",
                             "--progress", "none"])) == 0
    return out


def load(out: Path) -> tuple[list[tuple[Any, Any, Any]], int, str]:
    """[(sample, aux [T,3H], final [T,H])], H, the source format, from any output dir."""
    from tests.payload.extract.helpers import read_features, samples_like

    meta = json.loads((out / "meta.json").read_text())
    fmt = meta.get("format", "native")
    feats = read_features(out, fmt)
    by_id = {str(e["id"]): e for e in json.loads("[" + ",".join(
        (out / "manifest.jsonl").read_text().splitlines()) + "]")}
    rows = []
    for key, f in feats.items():
        sample = samples_like([by_id[key]])[0]
        sample.input_ids[:] = type(sample.input_ids)("i", f["input_ids"].tolist())
        rows.append((sample, f["aux"].bfloat16().contiguous(), f["final"].bfloat16().contiguous()))
    return rows, int(meta["hidden_size"]), fmt


def write_all(form: str, rows: list, hidden: int, out: Path) -> tuple[float, int]:
    """Write every sample in `form` on this thread: (seconds, bytes on disk)."""
    from payload.extract import formats
    from payload.extract.feature_dtype import quantize
    from payload.extract.formats import specforge

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if form.startswith("gzip-"):
        specforge.GZIP_LEVEL = int(form.split("-")[1])
        fmt = formats.make("specforge", out, hidden, "bfloat16", "gzip")
    elif form == "specforge":
        fmt = formats.make("specforge", out, hidden, "bfloat16")
    else:
        fmt = formats.make("speculators", out, hidden,
                           "float8_e4m3fn" if form == "spec-fp8" else "bfloat16")
    total = 0
    t0 = time.perf_counter()
    for sample, aux, final in rows:
        if form == "spec-fp8":
            q_aux, q_final, scale = quantize(aux, final)
            total += fmt.write(sample, q_aux, q_final, scale)
        else:
            total += fmt.write(sample, aux, final)
    took = time.perf_counter() - t0
    specforge.GZIP_LEVEL = 1
    return took, total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=1024, help="the random model's width")
    ap.add_argument("--features", type=Path, default=None,
                    help="an existing output dir (any format) to measure instead")
    ap.add_argument("--forms", default=",".join(FORMS))
    a = ap.parse_args()
    forms = a.forms.split(",")
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
        d = Path(tmp)
        src = a.features or make_features(d, a.samples, a.hidden)
        rows, hidden, src_fmt = load(src)
        tokens = sum(s.num_tokens for s, _, _ in rows)
        times: dict[str, list[float]] = {f: [] for f in forms}
        size: dict[str, int] = {}
        for rep in range(a.reps):
            order = forms if rep % 2 == 0 else forms[::-1]
            for form in order:
                took, total = write_all(form, rows, hidden, d / f"w-{form}")
                times[form].append(took)
                size[form] = total
    feature_mb = tokens * 8 * hidden / 1e6  # the bf16 features handed to the writer
    head = {"source": str(a.features) if a.features else
            f"random llama H={hidden} 8 layers, bf16, {a.samples} samples",
            "source_format": src_fmt, "tokens": tokens, "hidden": hidden, "reps": a.reps,
            "bf16_feature_MB": round(feature_mb, 1), "cores": os.cpu_count()}
    base = {"specforge": size.get("specforge"), "spec": size.get("spec-bf16")}
    rows_out = []
    for f in forms:
        med = statistics.median(times[f])
        ref = base["spec" if f.startswith("spec-") else "specforge"]
        rows_out.append({"form": f, "bytes_per_token": round(size[f] / tokens, 1),
                         "vs_plain": round(size[f] / ref, 4) if ref else None,
                         "write_s": round(med, 3),
                         "feature_MB_per_s_per_thread": round(feature_mb / med, 1),
                         "tokens_per_s_per_thread": round(tokens / med)})
    for k, v in head.items():
        print(f"{k:18} {v}")
    cols = list(rows_out[0])
    print(" | ".join(cols))
    for r in rows_out:
        print(" | ".join(str(r[c]) for c in cols))
    print(json.dumps({**head, "forms": rows_out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
