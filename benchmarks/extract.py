"""Extractor overhead and bytes on disk per output format, on CPU with a small random model.

    .venv/bin/python benchmarks/extract.py [--samples 64] [--reps 5] [--format native,speculators]
    .venv/bin/python benchmarks/extract.py --backend vllm [...]   # benchmarks/extract_vllm.py

Builds an 8-layer, H=256 Llama-shaped model and a chat tokenizer in a temp dir, then
alternates, --reps times:
  bare     the decoder's forward pass over exactly the batches the extractor plans
           (same tokenization, same --batch-tokens, same padding), nothing else;
  extract  the whole `extract` run in-process, once per --format: read, tokenize,
           preflight, load, forward with hooks, NaN/Inf check, the format's writes, the
           manifest merge (speculators: numbering the rows, the dataset, token_freq.pt).
Prints one row per format: medians and ratios against bare (target: extract <= 1.25 x
bare), samples/s, and bytes on disk per token (sample files, plus speculators' dataset)
against the format's theoretical figure: 4*H*dtype plus ids and mask (native 8+1,
specforge 8+8, speculators 8 in the row file + 16 in the dataset). Wall-clock ratios
swing with whatever else runs on the machine; the CPU-time ratio (process CPU seconds,
all threads) is the steadier figure on a shared box.
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

    from tests.payload.extract.helpers import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=688,
                      num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=2048)
    LlamaForCausalLM(cfg).save_pretrained(d / "model")
    tok.save_pretrained(d / "model")
    return d / "model"


def records(n: int) -> list[dict]:
    from tests.payload.extract.helpers import sentence

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


def extract(model_dir: Path, inp: Path, out: Path, fmt: str) -> tuple[float, dict]:
    from payload.extract import add_arguments, run

    shutil.rmtree(out, ignore_errors=True)
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--input", str(inp), "--model", str(model_dir), "--output-dir",
                         str(out), "--dtype", "float32", "--batch-tokens", str(BATCH_TOKENS),
                         "--progress", "none", "--format", fmt])
    t0 = time.perf_counter()
    rc = run(args)
    wall = time.perf_counter() - t0
    assert rc == 0, rc
    stats = json.loads(next(out.glob("stats.*.json")).read_text())
    return wall, stats


def bytes_on_disk(out: Path) -> tuple[int, int]:
    """(bytes in the files, bytes allocated): sample files plus shared dataset files."""
    files = [p for p in out.rglob("*") if p.suffix in (".safetensors", ".ckpt")
             or (p.name.startswith("data-") and p.suffix == ".arrow")]
    return (sum(f.stat().st_size for f in files), sum(f.stat().st_blocks * 512 for f in files))


def main() -> int:
    if "--backend" in sys.argv:  # the vLLM comparison runs in the vLLM venv
        at = sys.argv.index("--backend")
        backend = sys.argv[at + 1] if at + 1 < len(sys.argv) else ""
        rest = sys.argv[1:at] + sys.argv[at + 2:]
        if backend == "vllm":
            from tests.vllm_support import vllm_python

            py = vllm_python()
            if not py.is_file():
                raise SystemExit(f"no vLLM venv at {py}: run bash scripts/vllm-venv")
            script = str(REPO / "benchmarks" / "extract_vllm.py")
            os.execv(str(py), [str(py), script, *rest])
        if backend != "hf":
            raise SystemExit(f"--backend: hf or vllm, got {backend!r}")
        sys.argv[1:] = rest
    from payload.extract.formats import FORMATS, make

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--format", default=",".join(FORMATS),
                    help=f"comma-separated formats to run (default: {','.join(FORMATS)})")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads for both sides (default 1: the writer threads then "
                         "run beside the compute, as they do next to a GPU)")
    a = ap.parse_args()
    fmts = a.format.split(",")
    unknown = set(fmts) - set(FORMATS)
    if unknown:
        ap.error(f"--format: unknown {sorted(unknown)}; choose from {', '.join(FORMATS)}")
    import torch

    torch.set_num_threads(a.threads)

    with tempfile.TemporaryDirectory(prefix="bench-extract-") as tmp:
        d = Path(tmp)
        model_dir = build(d)
        inp = d / "in.jsonl"
        inp.write_text("".join(json.dumps(r) + "\n" for r in records(a.samples)))
        bare_s: list[float] = []
        bare_cpu: list[float] = []
        runs: dict[str, dict[str, list[float]]] = {
            f: {"wall": [], "phase": [], "cpu": [], "pair": []} for f in fmts}
        sizes: dict[str, tuple[int, int]] = {}
        tokens = 0
        for rep in range(a.reps):
            # alternate which goes first, so a load change on a shared box hits every side
            order = ["bare", *fmts]
            if rep % 2:
                order.reverse()
            phase_now: dict[str, float] = {}
            for which in order:
                if which == "bare":
                    s, c, tokens = bare(model_dir, inp)
                    bare_s.append(s)
                    bare_cpu.append(c)
                    continue
                out = d / f"out-{which}"
                wall, stats = extract(model_dir, inp, out, which)
                assert stats["tokens_written"] == tokens or not tokens, stats
                assert stats["written"] == a.samples, stats
                r = runs[which]
                r["wall"].append(wall)
                r["phase"].append(stats["extract_s"])
                r["cpu"].append(stats["extract_cpu_s"])
                phase_now[which] = stats["extract_s"]
                sizes[which] = bytes_on_disk(out)
            for f in fmts:
                runs[f]["pair"].append(phase_now[f] / bare_s[-1])
    med = statistics.median
    mb, cb = med(bare_s), med(bare_cpu)
    head = {"model": f"llama {LAYERS} layers H={HIDDEN} fp32 CPU, {torch.get_num_threads()} "
                     f"torch thread(s), {os.cpu_count()} cores",
            "samples": a.samples, "tokens": tokens, "batch_tokens": BATCH_TOKENS,
            "reps": a.reps, "bare_forward_s": round(mb, 3), "bare_cpu_s": round(cb, 3)}
    rows = []
    for f in fmts:
        r = runs[f]
        size, alloc = sizes[f]
        theory = make(f, d, HIDDEN, "float32").bytes_per_token()
        rows.append({
            "format": f, "extract_phase_s": round(med(r["phase"]), 3),
            "extract_end_to_end_s": round(med(r["wall"]), 3),
            "samples_per_s": round(a.samples / med(r["wall"]), 2),
            "ratio_phase_vs_bare": round(med(r["phase"]) / mb, 3),
            "median_paired_ratio_phase": round(med(r["pair"]), 3),
            "ratio_cpu_phase_vs_bare": round(med(r["cpu"]) / cb, 3),
            "bytes_per_token_file": round(size / tokens, 2),
            "bytes_per_token_allocated": round(alloc / tokens, 2),
            "bytes_per_token_theory": theory,
            "file_vs_theory": round(size / tokens / theory, 5)})
    for k, v in head.items():
        print(f"{k:22} {v}")
    cols = list(rows[0])
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(str(row[c]) for c in cols))
    print(json.dumps({**head, "formats": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
