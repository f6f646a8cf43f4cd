"""Extractor overhead and bytes on disk, on CPU with a small random model.

    .venv/bin/python benchmarks/extract.py [--samples 96] [--reps 3]

Builds an 8-layer, H=256 Llama-shaped model and a chat tokenizer in a temp dir, then
alternates, --reps times:
  bare     the decoder's forward pass over exactly the batches the extractor plans
           (same tokenization, same --batch-tokens, same padding), nothing else;
  extract  the whole `extract` run in-process: read, tokenize, preflight, load, forward
           with hooks, NaN/Inf check, safetensors writes, manifest merge, stats.
Prints medians and the ratios (target: extract <= 1.25 x bare), and bytes on disk per
token against the theoretical 4*H*dtype + 8 (int64 id) + 1 (uint8 mask). Wall-clock
ratios swing with whatever else runs on the machine; the CPU-time ratio (process CPU
seconds, all threads) is the steadier figure on a shared box.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf-home-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HIDDEN, LAYERS, BATCH_TOKENS = 256, 8, 8192


def build(d: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.extractor.conftest import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=688,
                      num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=2048)
    LlamaForCausalLM(cfg).save_pretrained(d / "model")
    tok.save_pretrained(d / "model")
    return d / "model"


def records(n: int) -> list[dict]:
    from tests.extractor.conftest import sentence

    rng = random.Random(0)
    return [{"id": i, "messages": [{"role": "user", "content": sentence(rng, rng.randint(20, 150))}],
             "response": sentence(rng, rng.randint(50, 350)),
             "reasoning": sentence(rng, rng.randint(10, 60))} for i in range(n)]


def bare(model_dir: Path, inp: Path) -> tuple[float, float, int]:
    """Forward passes only, over the extractor's own batch plan: (wall s, CPU s, tokens)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from payload.extract.batching import collate, plan_batches
    from payload.extract.tokens import Renderer, parse_record

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    convs = [parse_record(line, i) for i, line in enumerate(inp.read_text().splitlines(), 1)]
    samples = Renderer(tok, "include", [tok.eos_token_id]).encode_many(convs)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 local_files_only=True).eval()
    decoder = model.get_decoder()
    batches = plan_batches([s.num_tokens for s in samples], BATCH_TOKENS)  # type: ignore[union-attr]
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for idx in batches:
            b = collate([samples[i] for i in idx], 0)  # type: ignore[misc]
            decoder(input_ids=b.input_ids, attention_mask=b.attention_mask,
                    position_ids=b.position_ids, use_cache=False)
    tokens = sum(s.num_tokens for s in samples)  # type: ignore[union-attr]
    return time.perf_counter() - t0, time.process_time() - c0, tokens


def extract(model_dir: Path, inp: Path, out: Path) -> tuple[float, dict]:
    from payload.extract import add_arguments, run

    shutil.rmtree(out, ignore_errors=True)
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--input", str(inp), "--model", str(model_dir), "--output-dir",
                         str(out), "--dtype", "float32", "--batch-tokens", str(BATCH_TOKENS),
                         "--progress", "none"])
    t0 = time.perf_counter()
    rc = run(args)
    wall = time.perf_counter() - t0
    assert rc == 0, rc
    stats = json.loads(next(out.glob("stats.*.json")).read_text())
    return wall, stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads for both sides (default 1: the writer threads then "
                         "run beside the compute, as they do next to a GPU)")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)

    with tempfile.TemporaryDirectory(prefix="bench-extract-") as tmp:
        d = Path(tmp)
        model_dir = build(d)
        inp = d / "in.jsonl"
        inp.write_text("".join(json.dumps(r) + "\n" for r in records(a.samples)))
        bare_s, bare_cpu, ext_wall, ext_phase, ext_cpu, tokens = [], [], [], [], [], 0
        for rep in range(a.reps):
            # alternate which goes first, so a load change on a shared box hits both sides
            for which in (("bare", "extract") if rep % 2 == 0 else ("extract", "bare")):
                if which == "bare":
                    s, c, tokens = bare(model_dir, inp)
                    bare_s.append(s)
                    bare_cpu.append(c)
                else:
                    wall, stats = extract(model_dir, inp, d / "out")
                    ext_wall.append(wall)
                    ext_phase.append(stats["extract_s"])
                    ext_cpu.append(stats["extract_cpu_s"])
            assert stats["tokens_written"] == tokens and stats["written"] == a.samples
        files = list((d / "out").rglob("*.safetensors"))
        size = sum(f.stat().st_size for f in files)
        alloc = sum(f.stat().st_blocks * 512 for f in files)
        theory = 4 * HIDDEN * 4 + 8 + 1
    mb, mw, mp = (statistics.median(x) for x in (bare_s, ext_wall, ext_phase))
    pair = statistics.median(e / b for e, b in zip(ext_phase, bare_s, strict=True))
    cb, cp = statistics.median(bare_cpu), statistics.median(ext_cpu)
    result = {
        "model": f"llama {LAYERS} layers H={HIDDEN} fp32 CPU, {torch.get_num_threads()} torch "
                 f"thread(s), {os.cpu_count()} cores",
        "samples": a.samples, "tokens": tokens, "batch_tokens": BATCH_TOKENS, "reps": a.reps,
        "bare_forward_s": round(mb, 3), "extract_phase_s": round(mp, 3),
        "extract_end_to_end_s": round(mw, 3),
        "ratio_extract_phase_vs_bare": round(mp / mb, 3),
        "ratio_end_to_end_vs_bare": round(mw / mb, 3),
        "median_paired_ratio_phase": round(pair, 3),
        "bare_cpu_s": round(cb, 3), "extract_phase_cpu_s": round(cp, 3),
        "ratio_cpu_extract_phase_vs_bare": round(cp / cb, 3),
        "bytes_per_token_file": round(size / tokens, 2),
        "bytes_per_token_allocated": round(alloc / tokens, 2),
        "bytes_per_token_theory": theory,
        "file_vs_theory": round(size / tokens / theory, 5),
    }
    for k, v in result.items():
        print(f"{k:30} {v}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
