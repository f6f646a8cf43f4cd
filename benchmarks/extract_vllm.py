"""`extract --backend vllm` against a bare loop driving the same vLLM engine, on CPU.

    python benchmarks/extract.py --backend vllm [--samples 96] [--reps 1] [--tp 1]
    (re-runs itself as: <vLLM venv>/bin/python benchmarks/extract_vllm.py ...)

Builds the tests' tiny chat model (tests/vllm_support.py: Llama H=256, 6 layers, fp32)
and generator-style records, then, --reps times, in alternating order:
  vllm  `python -m payload extract --backend vllm --format native` (its extract phase:
        feeding the engine, reading each engine file back, checks, the format's writes,
        the manifest; the engine start is its load phase and the engine's shutdown after
        the last write its close_s, neither counted: the bare loop counts neither);
  bare  a fresh engine with exactly the backend's engine arguments
        (backends/vllm.engine_kwargs), the same prompts as token ids (read back from the
        vllm run's own files), the same layers; `LLM.generate` over all of them at once,
        then every file read back (safetensors load) and deleted: nothing else;
  hf    `python -m payload extract --backend hf` on the same input (its extract phase).
Prints wall seconds per token for each and the vllm/bare ratio (target <= 1.15x).
Every engine runs with VLLM_HOST_IP=127.0.0.1 (loopback only).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LAYERS = "2,3,6"
MAX_LENGTH = "1000"


def records(n: int) -> list[dict]:
    from tests.vllm_support import sentence

    rng = random.Random(0)
    return [{"id": i, "messages": [{"role": "user", "content": sentence(rng, rng.randint(20, 120))}],
             "response": sentence(rng, rng.randint(50, 300)),
             "reasoning": sentence(rng, rng.randint(10, 60))} for i in range(n)]


def flags(model: Path, inp: Path, out: Path, batch_tokens: int, tp: int | None) -> list[str]:
    """The extract flags both backends share; `tp` None for the hf backend."""
    return ["--input", str(inp), "--model", str(model), "--output-dir", str(out),
            "--dtype", "float32", "--layers", LAYERS, "--max-length", MAX_LENGTH,
            "--batch-tokens", str(batch_tokens), "--progress", "none",
            *(["--tensor-parallel-size", str(tp)] if tp is not None else [])]


def run_extract(backend: str, model: Path, inp: Path, out: Path, batch_tokens: int,
                tp: int) -> dict:
    import shutil

    from tests.vllm_support import engine_env

    shutil.rmtree(out, ignore_errors=True)
    argv = flags(model, inp, out, batch_tokens, tp if backend == "vllm" else None)
    proc = subprocess.run([sys.executable, "-m", "payload", "extract", "--backend", backend,
                           *argv], cwd=REPO, env=engine_env(tp), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{backend} extract failed: {proc.stderr[-3000:]}")
    return json.loads(next(out.glob("stats.*.json")).read_text())


def prompts_of(out: Path) -> list[list[int]]:
    from safetensors.torch import load_file

    rows = [json.loads(x) for x in (out / "manifest.jsonl").read_text().splitlines()]
    return [load_file(str(out / r["file"]))["input_ids"].tolist() for r in rows]


def bare(model: Path, inp: Path, prompts_file: Path, work: Path, batch_tokens: int,
         tp: int) -> dict:
    """The bare loop, in its own process (a fresh engine, the benchmark's own env)."""
    from tests.vllm_support import engine_env

    proc = subprocess.run([sys.executable, __file__, "--bare", str(model), str(inp),
                           str(prompts_file), str(work), str(batch_tokens), str(tp)],
                          cwd=REPO, env=engine_env(tp), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bare loop failed: {proc.stderr[-3000:]}")
    return json.loads((work / "bare.json").read_text())


def bare_main(model: str, inp: str, prompts_file: str, work: str, batch_tokens: str,
              tp: str) -> int:
    import fcntl

    from safetensors.torch import load_file
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from payload.extract import add_arguments
    from payload.extract.backends import read_info
    from payload.extract.backends.vllm import engine_ids, engine_kwargs
    from payload.extract.config import from_args

    prompts = json.loads(Path(prompts_file).read_text())
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = from_args(parser.parse_args(["--backend", "vllm", *flags(
        Path(model), Path(inp), Path(work) / "unused", int(batch_tokens), int(tp))]))
    storage = Path(work) / "bare-store"
    max_len = min(cfg.max_length, max(len(p) for p in prompts)) + 1
    llm = LLM(**engine_kwargs(cfg, engine_ids(read_info(cfg)), max_len, storage, True))
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                        SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    tokens = 0
    for o in outs:
        path = o.kv_transfer_params["hidden_states_path"]
        with open(path + ".lock") as lf:
            fcntl.flock(lf, fcntl.LOCK_SH)
            tokens += int(load_file(path)["hidden_states"].shape[0])
        os.unlink(path)
        os.unlink(path + ".lock")
    wall = time.perf_counter() - t0
    # a file, not stdout: vLLM prints its own lines there, also after ours
    (Path(work) / "bare.json").write_text(json.dumps({"wall_s": wall, "tokens": tokens}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--batch-tokens", type=int, default=2048,
                    help="the engine's max_num_batched_tokens (both sides)")
    a = ap.parse_args()
    from tests.vllm_support import build_chat_model

    med = statistics.median
    with tempfile.TemporaryDirectory(prefix="bench-extract-vllm-") as tmp:
        d = Path(tmp)
        model = build_chat_model(d / "model")
        inp = d / "in.jsonl"
        inp.write_text("".join(json.dumps(r) + "\n" for r in records(a.samples)))
        got: dict[str, list[float]] = {"vllm": [], "bare": [], "hf": []}
        cpu: list[float] = []  # the vllm run's own CPU seconds (the engine's are not in it)
        close: list[float] = []  # the vllm run's engine teardown (stats close_s), not counted
        tokens = 0
        prompts_file = d / "prompts.json"
        for rep in range(a.reps):
            order = ["vllm", "bare", "hf"] if rep % 2 == 0 else ["hf", "vllm", "bare"]
            for which in order:
                if which == "bare":
                    r = bare(model, inp, prompts_file, d, a.batch_tokens, a.tp)
                    assert r["tokens"] == tokens, (r, tokens)
                    got["bare"].append(r["wall_s"])
                    continue
                s = run_extract(which, model, inp, d / f"out-{which}", a.batch_tokens, a.tp)
                assert s["written"] == a.samples, s
                tokens = s["tokens_written"]
                got[which].append(s["extract_s"])
                if which == "vllm":
                    cpu.append(s["extract_cpu_s"])
                    close.append(s.get("close_s", 0.0))
                if which == "vllm":
                    prompts_file.write_text(json.dumps(prompts_of(d / "out-vllm")))
    per = {k: med(v) / tokens * 1e6 for k, v in got.items()}
    result = {"model": "llama 6 layers H=256 fp32, vLLM 0.32 CPU", "samples": a.samples,
              "tokens": tokens, "reps": a.reps, "tp": a.tp, "batch_tokens": a.batch_tokens,
              "us_per_token": {k: round(v, 1) for k, v in per.items()},
              "median_s": {k: round(med(v), 3) for k, v in got.items()},
              "vllm_payload_cpu_s": round(med(cpu), 3),
              "vllm_engine_close_s": round(med(close), 3),
              "ratio_vllm_vs_bare": round(per["vllm"] / per["bare"], 3),
              "ratio_hf_vs_bare": round(per["hf"] / per["bare"], 3)}
    for k, v in result.items():
        print(f"{k:20} {v}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--bare":
        sys.exit(bare_main(*sys.argv[2:8]))
    sys.exit(main())
