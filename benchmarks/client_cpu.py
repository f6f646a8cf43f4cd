"""The client's CPU per request over a run's body, by server shape and garbage-collector
thresholds: where `--scenarios random` (benchmarks/generator.py) reads a ratio, this reads
what the client spent.

One `payload generate` per run (a child process: this file's `--child` mode wraps it), at
--concurrency 200 against benchmarks/capped.py answering as fast as its CPU allows, clean
or with 20% random 429s with Retry-After 1. The child reads its own CPU time
(`time.process_time`) from the pipeline's start until 0.8 x (1 - share) of the prompts
were served, the body the random scenario measures (the Retry-After tail left out), and
divides by the requests answered meanwhile. `--gc default` runs with CPython's thresholds
(700, 10, 10) instead of the run's (payload/generate/run.py GC_THRESHOLDS), the peer here.
Runs alternate shapes and settings; medians are quoted.

    .venv/bin/python benchmarks/client_cpu.py --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.generator import MODEL, CappedServer, write_prompts  # noqa: E402

SHAPES = {"clean": ("clean", 0.0), "20% 429, Retry-After 1": ("random-ra", 0.2)}


def child(argv: list[str]) -> int:
    """`payload generate` in this process, its body's CPU per request written to the file
    named by the first argument (as JSON)."""
    import gc

    from payload import cli
    from payload.generate import run as run_module

    result_path, gc_mode, mark = Path(argv[0]), argv[1], float(argv[2])
    if gc_mode == "default":
        run_module.GC_THRESHOLDS = gc.get_threshold()
    pipeline = run_module.Generator._run_pipeline
    seen: dict[str, float] = {}

    async def measured(self: run_module.Generator, display: object, endpoint: object) -> None:
        counters = self.c

        async def watch() -> None:
            cpu, wall = time.process_time(), time.monotonic()
            while counters.done < mark:
                await asyncio.sleep(0.002)
            seen.update(cpu=time.process_time() - cpu, wall=time.monotonic() - wall,
                        requests=counters.done + counters.retries)

        watcher = asyncio.create_task(watch())
        try:
            await pipeline(self, display, endpoint)  # type: ignore[arg-type]
        finally:
            watcher.cancel()

    run_module.Generator._run_pipeline = measured  # type: ignore[method-assign]
    rc = cli.main(argv[3:])
    result_path.write_text(json.dumps(seen))
    return rc


def one(tmp: Path, shape: str, share: float, gc_mode: str, n: int, seed: int) -> dict[str, float]:
    server = CappedServer(["--shape", shape, "--latency", "0", "--refuse-share", str(share),
                           "--seed", str(seed)])
    try:
        out, result = tmp / f"out-{time.monotonic_ns()}.jsonl", tmp / "result.json"
        cmd = [sys.executable, __file__, "--child", str(result), gc_mode,
               str(0.8 * (1.0 - share) * n), "generate", "--input", str(tmp / "in.jsonl"),
               "--output", str(out), "--base-url", server.url, "--api-key-file",
               str(tmp / "key"), "--concurrency", "200", "--model", MODEL]
        proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"payload generate exited {proc.returncode}: {proc.stderr[-2000:]}")
        seen: dict[str, float] = json.loads(result.read_text())
        return seen
    finally:
        server.close()


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=12000)
    args = ap.parse_args()
    per: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp_s:
        tmp = Path(tmp_s)
        write_prompts(tmp / "in.jsonl", args.prompts)
        key = tmp / "key"
        key.touch(mode=0o600)
        key.write_text("sk-bench-key\n")
        for rep in range(args.reps):
            for label, (shape, share) in SHAPES.items():
                for gc_mode in ("run", "default"):
                    seen = one(tmp, shape, share, gc_mode, args.prompts, rep + 1)
                    ms = 1e3 * seen["cpu"] / seen["requests"]
                    per.setdefault((label, gc_mode), []).append(ms)
                    print(f"rep {rep} {label:24s} gc {gc_mode:7s} {ms:.3f} ms/request "
                          f"({seen['requests']:.0f} requests, {seen['wall']:.2f}s)", flush=True)
    print(f"\n{args.prompts} prompts, --concurrency 200, latency 0, {args.reps} reps; "
          "client CPU per request over the body, median (min-max):\n")
    print("| server | run's GC thresholds | CPython's default | default / run's |")
    print("|---|---:|---:|---:|")
    clean = statistics.median(per[("clean", "run")])
    for label in SHAPES:
        run_ms, default_ms = per[(label, "run")], per[(label, "default")]
        print(f"| {label} | {statistics.median(run_ms):.3f} ({min(run_ms):.3f}-"
              f"{max(run_ms):.3f}) | {statistics.median(default_ms):.3f} "
              f"({min(default_ms):.3f}-{max(default_ms):.3f}) | "
              f"{statistics.median(default_ms) / statistics.median(run_ms):.2f}x |")
    refusing = statistics.median(per[("20% 429, Retry-After 1", "run")])
    print(f"\n20% refused with Retry-After 1 / clean, the run's thresholds: "
          f"{refusing / clean:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
