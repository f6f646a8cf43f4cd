"""Benchmark: `payload generate` vs the official `openai` SDK against the fake OpenRouter.

Side by side in one run, on loopback:
- the fake API runs in its OWN process, so its CPU is not counted for either client;
- both clients run as subprocesses, read the same JSONL and write the same JSONL; CPU
  (user+sys) and peak RSS come from `wait4`'s rusage of exactly that child;
- `payload generate` at 2000 in flight with 10x the input (RSS must stay flat);
- the resume index of a 1 GB synthetic output file (built in a fresh process).

    .venv/bin/python benchmarks/generator.py                   # 20k prompts, 3 repetitions
    .venv/bin/python benchmarks/generator.py --prompts 2000 --reps 1 --skip-big --index-gb 0.1

Medians are quoted: the machine's cores are shared and noisy. The SDK client is the
usual pattern (AsyncOpenAI + a semaphore-sized worker pool; httpx pool widened to the
concurrency, SDK retries off so both clients send exactly one request per prompt).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


# -- the SDK client (runs in its own process: `generator.py --sdk-client IN OUT URL KEYFILE N`) --
async def sdk_client(inp: Path, out: Path, base_url: str, key_file: Path, concurrency: int,
                     model: str, transport: str) -> None:
    from openai import AsyncOpenAI, DefaultAioHttpClient, DefaultAsyncHttpxClient
    try:  # openai >= 3 ships its own httpx fork
        import httpx2 as httpx
    except ImportError:
        import httpx  # type: ignore[no-redef]

    factory = DefaultAioHttpClient if transport == "aiohttp" else DefaultAsyncHttpxClient
    http = factory(limits=httpx.Limits(
        max_connections=concurrency, max_keepalive_connections=concurrency),
        timeout=httpx.Timeout(600.0))
    client = AsyncOpenAI(base_url=base_url, api_key=key_file.read_text().strip(),
                         http_client=http, max_retries=0)
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=concurrency)
    provider = {"quantizations": ["int4"], "ignore": ["fireworks", "baseten"]}
    with out.open("w", encoding="utf-8") as fh:
        async def worker() -> None:
            while (rec := await queue.get()) is not None:
                t0 = time.monotonic()
                resp = await client.chat.completions.create(
                    model=model, messages=rec["messages"], extra_body={"provider": provider})
                choice = resp.choices[0]
                fh.write(json.dumps({
                    "id": rec["id"], "usage": resp.usage.model_dump() if resp.usage else None,
                    "response": choice.message.content,
                    "reasoning": getattr(choice.message, "reasoning", None),
                    "finish_reason": choice.finish_reason,
                    "provider": getattr(resp, "provider", None), "model": resp.model,
                    "latency_s": round(time.monotonic() - t0, 3), "attempts": 1,
                    "messages": rec["messages"]}, ensure_ascii=False) + "\n")
                fh.flush()

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        with inp.open(encoding="utf-8") as src:
            for line in src:
                await queue.put(json.loads(line))
        for _ in workers:
            await queue.put(None)
        await asyncio.gather(*workers)
    await client.close()


# -- measurement helpers ----------------------------------------------------------------------
def run_measured(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{cmd[:4]} failed ({code}):\n{err[-3000:]}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024,
            "wall_s": wall}


def write_prompts(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": i, "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"Explain topic number {i} in one paragraph."}]})
                + "\n")


def start_fake(key_file: Path, latency: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "handoff.testing.fakeapi", "--port", "0",
                             "--key-file", str(key_file), "--latency", str(latency)],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("base_url="):
        raise SystemExit(f"fake API did not start: {line!r}")
    return proc, line.split("=", 1)[1]


def count_lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))


def make_big_output(path: Path, gigabytes: float) -> int:
    """A synthetic output file shaped like real records (~8 KB: prompt, reasoning, answer)."""
    from payload.generate.journal import encode_record
    target = int(gigabytes * (1 << 30))
    n = 0
    filler = "lorem ipsum dolor sit amet " * 100
    with path.open("wb") as fh:
        while fh.tell() < target:
            fh.write(encode_record({
                "id": secrets.token_hex(32) if n % 2 else n,
                "usage": {"prompt_tokens": 812, "completion_tokens": 1500,
                          "total_tokens": 2312, "cost": 0.0021,
                          "completion_tokens_details": {"reasoning_tokens": 700}},
                "response": filler[: 3000 + n % 500], "reasoning": filler[:2400],
                "finish_reason": "stop", "provider": "DeepInfra", "model": "m",
                "latency_s": 12.5, "attempts": 1,
                "messages": [{"role": "user", "content": filler[:2000]}]}))
            n += 1
    return n


INDEX_SNIPPET = """
import sys, time
from pathlib import Path
from payload.generate.journal import load_index
t0 = time.perf_counter()
idx = load_index(Path(sys.argv[1]), Path(sys.argv[2]))
print(time.perf_counter() - t0, len(idx.done))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--httpx-reps", type=int, default=1,
                    help="repetitions for the SDK's httpx transport (~17 ms CPU per request at "
                         "2000 in flight: minutes per run)")
    ap.add_argument("--latency", type=float, default=0.2,
                    help="fake API answer latency, s (keeps 2000 requests really in flight)")
    ap.add_argument("--big-factor", type=int, default=10)
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--index-gb", type=float, default=1.0)
    ap.add_argument("--write-md", type=Path, help="append/replace the '## Generator' section")
    ap.add_argument("--clients", default="payload,openai-aiohttp,openai-httpx",
                    help="which clients to compare (the SDK with either HTTP transport)")
    ap.add_argument("--sdk-client", nargs=7,
                    metavar=("IN", "OUT", "URL", "KEYFILE", "N", "MODEL", "TRANSPORT"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sdk_client:
        inp, out, url, key, n, model, transport = args.sdk_client
        asyncio.run(sdk_client(Path(inp), Path(out), url, Path(key), int(n), model, transport))
        return 0

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OPENROUTER_API_KEY", None)
    model = "moonshotai/kimi-k2.5"
    names = args.clients.split(",")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="bench-gen-") as tmp_s:
        tmp = Path(tmp_s)
        key_file = tmp / "key"
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, ("sk-or-v1-" + secrets.token_hex(32)).encode())
        os.close(fd)
        inp = tmp / "in.jsonl"
        write_prompts(inp, args.prompts)
        fake, url = start_fake(key_file, args.latency)
        try:
            for rep in range(args.reps):
                for name in names if rep % 2 == 0 else names[::-1]:
                    if name == "openai-httpx" and rep >= args.httpx_reps:
                        continue
                    out = tmp / f"{name}-{rep}.jsonl"
                    if name == "payload":
                        cmd = [sys.executable, "-m", "payload", "generate", "--input", str(inp),
                               "--output", str(out), "--base-url", url, "--api-key-file",
                               str(key_file), "--concurrency", str(args.concurrency),
                               "--model", model]
                    else:
                        cmd = [sys.executable, str(Path(__file__).resolve()), "--sdk-client",
                               str(inp), str(out), url, str(key_file), str(args.concurrency),
                               model, name.split("-", 1)[1]]
                    m = run_measured(cmd, env)
                    lines = count_lines(out)
                    assert lines == args.prompts, f"{name} wrote {lines} of {args.prompts}"
                    m["cpu_ms_per_req"] = 1000 * m["cpu_s"] / args.prompts
                    m["req_s"] = args.prompts / m["wall_s"]
                    results[name].append(m)
                    print(f"rep {rep} {name:14s} cpu {m['cpu_ms_per_req']:.3f} ms/req  "
                          f"rss {m['rss_mb']:.0f} MB  {m['req_s']:.0f} req/s", flush=True)
            big: dict[str, float] | None = None
            if not args.skip_big:
                big_in = tmp / "big.jsonl"
                write_prompts(big_in, args.prompts * args.big_factor)
                big = run_measured([sys.executable, "-m", "payload", "generate", "--input",
                                    str(big_in), "--output", str(tmp / "big-out.jsonl"),
                                    "--base-url", url, "--api-key-file", str(key_file),
                                    "--concurrency", str(args.concurrency), "--model", model],
                                   env)
                print(f"big input ({args.prompts * args.big_factor}): rss "
                      f"{big['rss_mb']:.0f} MB", flush=True)
        finally:
            fake.terminate()
            fake.wait(10)
        index_s = lines_1g = size_gb = None
        if args.index_gb > 0:
            big_out = tmp / "huge.jsonl"
            lines_1g = make_big_output(big_out, args.index_gb)
            size_gb = big_out.stat().st_size / (1 << 30)
            times = []
            for _ in range(3):
                res = subprocess.run([sys.executable, "-c", INDEX_SNIPPET, str(big_out),
                                      str(tmp / "none.errors.jsonl")], cwd=REPO, env=env,
                                     capture_output=True, text=True, check=True)
                secs, n = res.stdout.split()
                assert int(n) == lines_1g
                times.append(float(secs))
            index_s = statistics.median(times)
            print(f"resume index: {size_gb:.2f} GB, {lines_1g} records: {index_s:.2f} s "
                  f"(runs: {', '.join(f'{t:.2f}' for t in times)})", flush=True)

    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
           for name, runs in results.items()}
    p = med["payload"]
    sdks = [n for n in names if n != "payload"]
    header = ("metric", "payload generate", *(f"SDK ({n.split('-', 1)[1]})" for n in sdks),
              "ratio vs SDK / target")

    def row(label: str, key: str, fmt: str, note: str) -> tuple[str, ...]:
        ratios = ", ".join(f"{p[key] / med[n][key]:.2f}x {n.split('-', 1)[1]}" for n in sdks)
        return (label, format(p[key], fmt), *(format(med[n][key], fmt) for n in sdks),
                f"{ratios} {note}".strip())

    dash = tuple("-" for _ in sdks)
    rows = [row("client CPU ms / request", "cpu_ms_per_req", ".3f", "(target <= 0.5x)"),
            row("peak RSS MB", "rss_mb", ".0f", "(target: payload <= 300 MB)"),
            row("wall req/s", "req_s", ".0f", "")]
    if big is not None:
        rows.append((f"peak RSS MB, {args.big_factor}x input", f"{big['rss_mb']:.0f}", *dash,
                     f"{big['rss_mb'] / p['rss_mb']:.2f}x of {args.prompts} (target <= 1.2x)"))
    if index_s is not None:
        rows.append((f"resume index, {size_gb:.2f} GB ({lines_1g} records)",
                     f"{index_s:.2f} s", *dash, "target <= 3 s"))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    table = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
             for r in [header, tuple("-" * w for w in widths), *rows]]
    print("\n".join(table))
    if args.write_md:
        write_section(args.write_md, table, args)
    return 0


def write_section(md: Path, table: list[str], args: argparse.Namespace) -> None:
    cmd = ("python benchmarks/generator.py" + (f" --prompts {args.prompts}"
           if args.prompts != 20_000 else "") + (f" --reps {args.reps}" if args.reps != 3 else "")
           + f" --write-md {md.name}")
    section = "\n".join([
        "## Generator", "",
        f"`{cmd}` - {args.prompts} prompts at concurrency {args.concurrency} against the fake "
        f"OpenRouter (separate process, {args.latency:g} s latency) on loopback; medians of "
        f"{args.reps} alternating repetitions ({args.httpx_reps} for the SDK on httpx); CPU = user+sys of the client process "
        f"(wait4 rusage). Machine: {os.cpu_count()} shared cores; "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}.", "", *table, ""])
    text = md.read_text(encoding="utf-8") if md.exists() else "# Benchmarks\n"
    start = text.find("## Generator")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    md.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
