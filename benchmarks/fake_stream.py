"""Benchmark: what the fake OpenRouter's streaming costs its own process, at the seed's shape.

Thinking-size answers (~3,500 reasoning tokens, log-normal, chunks of 1-4 tokens: ~1,400
SSE events an answer) streamed to `--concurrency` clients at once, paced at `--tokens-per-s`
in the fake's time, `--time-scale` fake seconds a real one. Two servers, each in its own
process, read by the same bare aiohttp client (it counts events, parses nothing):
- `fake`: `python -m handoff.testing.fakeapi` (the answer built, then rendered as SSE);
- `bare`: the floor, an aiohttp handler writing one pre-rendered event of the same size as
  many times as the fake sends events, at the same pace and batching (writes every
  `--write-every-s`); it builds no answer and renders nothing.

Printed per server, medians over `--reps`: server CPU per event and per answer (from
/proc/<pid>/stat), its peak RSS, the share of the run's time with >= 95% of the concurrency
in flight (the client's view, until the last answer is requested), and the fake/bare ratios.

    .venv/bin/python benchmarks/fake_stream.py                      # 3000 answers, 2000 at once
    .venv/bin/python benchmarks/fake_stream.py --answers 600 --concurrency 200 --reps 1
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
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
KEY = "sk-or-v1-fake-stream-bench"

BARE_SERVER = r'''
import asyncio, math, random, sys
from aiohttp import web
rate, scale, every, mean, sigma = map(float, sys.argv[1:6])
EVENT = ('data: {"id":"gen-1234567890","object":"chat.completion.chunk","created":1796000000,'
         '"model":"moonshotai/kimi-k2.5","provider":"DeepInfra","choices":[{"index":0,'
         '"delta":{"reasoning":" r1234 r1235"},"finish_reason":null,'
         '"native_finish_reason":null}]}\n\n').encode()
rng = random.Random(1)
async def chat(request):
    await request.read()
    tokens = max(1, round(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)))
    events = max(1, round(tokens / 2.5))  # chunks of 1-4 tokens
    per = 2.5 / (rate * scale)  # real seconds between events
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    loop = asyncio.get_running_loop()
    t0, sent = loop.time(), 0
    while sent < events:
        due = min(events, int((loop.time() - t0) / per) + 1)
        await resp.write(EVENT * (due - sent))
        sent = due
        if sent < events:
            await asyncio.sleep(max(every, t0 + sent * per - loop.time()))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
app = web.Application()
app.router.add_post("/api/v1/chat/completions", chat)
async def main():
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    print(f"base_url=http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/api/v1",
          flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
'''


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) // 1024
    return 0


def start(kind: str, args: argparse.Namespace, tmp: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "FAKEAPI_KEY": KEY}
    if kind == "fake":
        argv = [sys.executable, "-m", "handoff.testing.fakeapi", "--thinking", "field",
                "--reasoning-tokens", str(args.reasoning_tokens), "--reasoning-sigma",
                str(args.reasoning_sigma), "--tokens-per-s", str(args.tokens_per_s),
                "--time-scale", str(args.time_scale), "--write-every-s",
                str(args.write_every_s), "--stream-seed", "1"]
    else:
        script = tmp / "bare_server.py"
        script.write_text(BARE_SERVER)
        argv = [sys.executable, str(script), str(args.tokens_per_s), str(args.time_scale),
                str(args.write_every_s), str(args.reasoning_tokens), str(args.reasoning_sigma)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip().split("=", 1)[1]
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # its exit stats
    return proc, url


async def drive(url: str, answers: int, concurrency: int) -> dict[str, Any]:
    """`answers` streams, `concurrency` at once; events counted; in flight sampled at 10 Hz."""
    sem = asyncio.Semaphore(concurrency)
    state = {"events": 0, "in_flight": 0, "started": 0}
    samples: list[int] = []

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        async with sem:
            state["started"] += 1
            state["in_flight"] += 1
            try:
                async with session.post(url + "/chat/completions", json={
                        "model": "moonshotai/kimi-k2.5", "stream": True,
                        "messages": [{"role": "user", "content": f"prompt {i}"}]}) as r:
                    assert r.status == 200, r.status
                    async for chunk in r.content.iter_any():
                        state["events"] += chunk.count(b"\n\n")
            finally:
                state["in_flight"] -= 1

    async def sample() -> None:
        while state["started"] < answers:
            await asyncio.sleep(0.1)
            samples.append(state["in_flight"])

    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"},
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.monotonic()
        sampler = asyncio.ensure_future(sample())
        await asyncio.gather(*(one(session, i) for i in range(answers)))
        sampler.cancel()
        wall = time.monotonic() - t0
    held = [s >= 0.95 * concurrency for s in samples[10:]]  # after the first second
    return {"wall_s": wall, "events": state["events"],
            "held": sum(held) / len(held) if held else 1.0}


def run_one(kind: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    proc, url = start(kind, args, tmp)
    try:
        c0 = cpu_s(proc.pid)
        out = asyncio.run(drive(url, args.answers, args.concurrency))
        cpu = cpu_s(proc.pid) - c0
        out.update(cpu_s=cpu, rss_mb=peak_rss_mb(proc.pid),
                   us_per_event=cpu / max(out["events"], 1) * 1e6,
                   ms_per_answer=cpu / args.answers * 1e3)
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=2000)
    parser.add_argument("--reasoning-tokens", type=int, default=3500)
    parser.add_argument("--reasoning-sigma", type=float, default=0.5)
    parser.add_argument("--tokens-per-s", type=float, default=40.0)
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--write-every-s", type=float, default=0.25)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, list[dict[str, Any]]] = {"fake": [], "bare": []}
    with tempfile.TemporaryDirectory(prefix="bench-fakestream-") as tmp:
        order = ["fake", "bare"]
        for rep in range(args.reps):
            for kind in order if rep % 2 == 0 else order[::-1]:  # alternate: load drifts
                r = run_one(kind, args, Path(tmp))
                rows[kind].append(r)
                print(f"rep {rep + 1} {kind}: " + json.dumps(
                    {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}),
                    flush=True)
    med = {kind: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for kind, rs in rows.items()}
    print(f"\n{args.answers} answers, {args.concurrency} in flight, "
          f"{args.reasoning_tokens} tokens (sigma {args.reasoning_sigma}), "
          f"{args.tokens_per_s} tok/s x{args.time_scale}, writes every {args.write_every_s} s; "
          f"medians of {args.reps}")
    print(f"{'server':6} {'events/ans':>10} {'us/event':>9} {'ms/answer':>10} {'cpu s':>7} "
          f"{'rss MB':>7} {'held>=95%':>9} {'wall s':>7}")
    for kind, m in med.items():
        print(f"{kind:6} {m['events'] / args.answers:10.0f} {m['us_per_event']:9.2f} "
              f"{m['ms_per_answer']:10.2f} {m['cpu_s']:7.1f} {m['rss_mb']:7.0f} "
              f"{m['held']:9.2f} {m['wall_s']:7.1f}")
    print(f"fake/bare: CPU per event {med['fake']['us_per_event'] / med['bare']['us_per_event']:.2f}x, "
          f"per answer {med['fake']['ms_per_answer'] / med['bare']['ms_per_answer']:.2f}x, "
          f"RSS {med['fake']['rss_mb'] / med['bare']['rss_mb']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
