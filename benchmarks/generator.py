"""Benchmark: `payload generate` side by side with its peers against the fake OpenRouter.

Every scenario runs each client as its own subprocess (CPU and peak RSS from `wait4`'s
rusage of exactly that child) against a fake API in its OWN process (its CPU is counted for
nobody), started fresh for every run so its counters and outage clock are that run's.

Clients:
- `payload`: `python -m payload generate` (also `payload+budget`: with an ample --max-cost);
- `sdk`: the official openai SDK (aiohttp transport; `sdk-httpx`: its default httpx one),
  `AsyncOpenAI` + a worker pool the size of the concurrency, with the SDK's DEFAULT retries
  (2, honouring Retry-After up to 60 s), exceptions recorded as failures: what users write;
- `bare`: a bare aiohttp loop (semaphore, POST, parse, write): the CPU floor, and with
  `--oracle` the loop that KNOWS the capacity (a semaphore of exactly K), retrying refusals.

Scenarios (`--scenarios`, default all):
- `floor`: fault-free, 0.2 s latency, 2000 in flight: client CPU per request vs the bare
  loop and the SDK, with and without a budget; peak RSS, and RSS at 10x the input;
- `capped`: 20k prompts, --concurrency 2000, 0.5 s answers, on the independent capped
  servers of benchmarks/capped.py (K=500 at once; 429 with and without Retry-After, 402
  in-flight budget, a cap halved from 6 s to 14 s): ideal 20 s (24 s for the changing
  cap); payload vs the exact-K oracle (it follows the changing cap too) vs the SDK, with
  per-second served rates (`--shapes`, `--sdk-reps`, `--skip-clients`);
- `capacity`: the same on the project's own fake (429 + Retry-After 1 beyond K);
- `outage`: the same with every request 503 for 30 s from 10 s in; recovery (time back
  to 90% of the full rate) and the burst (peak requests in the server, and arrivals, in
  the first second after the outage) from the fake's 100 ms timeline;
- `sporadic`: 2k prompts at 200 in flight, 0.2 s latency: fault-free, 5% 429 with
  Retry-After 1, 50% 429 without Retry-After (refused at the door, as a rate limiter does);
- `random`: independent random 429s (5% and 20%, with and without Retry-After 1) on a
  server answering as fast as its CPU allows (benchmarks/capped.py `random-ra`/`random`),
  each refusing run side by side with the same server refusing nothing (a shared machine's
  load drifts 2-3x within seconds: runs in turn would measure that); 12k prompts at 200 in
  flight, `--random-reps` (20), `--load N` busy loops beside it; exits 1 if any refusing
  run answered under 0.9x its clean run's requests per second until 0.8 x (1 - share)
  of the prompts were served, about when the last is first asked (not in the default set);
- `index`: the resume index of a synthetic 1 GB output (built in a fresh process).

    .venv/bin/python benchmarks/generator.py                         # everything, 3 reps
    .venv/bin/python benchmarks/generator.py --scenarios capped --cap-reps 3 --sdk-reps 1
    .venv/bin/python benchmarks/generator.py --scenarios capacity,outage --reps 1
    .venv/bin/python benchmarks/generator.py --scenarios random --random-reps 20 --load 2
    .venv/bin/python benchmarks/generator.py --write-md BENCHMARKS.md   # the `## Generator` section

Medians are quoted; ratios come from the same run. The machine's cores are shared: treat
wall-clock figures on a busy 2-core box as provisional.
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
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MODEL = "moonshotai/kimi-k2.5"

from benchmarks import report as report_md  # noqa: E402


# -- peer clients (each runs in its own process: `generator.py --client KIND ...`) -------------
def _record(rec: dict[str, Any], usage: Any, content: Any, finish: Any, model: Any,
            latency: float, attempts: int) -> str:
    return json.dumps({"id": rec["id"], "usage": usage, "response": content, "reasoning": None,
                       "finish_reason": finish, "provider": None, "model": model,
                       "latency_s": round(latency, 3), "attempts": attempts,
                       "messages": rec["messages"]}, ensure_ascii=False) + "\n"


async def _feed(inp: Path, queue: asyncio.Queue[Any], workers: int) -> None:
    with inp.open(encoding="utf-8") as src:
        for line in src:
            await queue.put(json.loads(line))
    for _ in range(workers):
        await queue.put(None)


async def sdk_client(inp: Path, out: Path, base_url: str, key: str, concurrency: int,
                     transport: str, retries: int | None) -> None:
    from openai import AsyncOpenAI, DefaultAioHttpClient, DefaultAsyncHttpxClient
    try:  # openai >= 3 ships its own httpx fork
        import httpx2 as httpx
    except ImportError:
        import httpx  # type: ignore[no-redef]

    factory = DefaultAioHttpClient if transport == "aiohttp" else DefaultAsyncHttpxClient
    http = factory(limits=httpx.Limits(max_connections=concurrency,
                                       max_keepalive_connections=concurrency),
                   timeout=httpx.Timeout(600.0))
    kwargs: dict[str, Any] = {} if retries is None else {"max_retries": retries}
    client = AsyncOpenAI(base_url=base_url, api_key=key, http_client=http, **kwargs)
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=concurrency)
    with out.open("w", encoding="utf-8") as fh, \
            out.with_suffix(".errors.jsonl").open("w", encoding="utf-8") as errs:
        async def worker() -> None:
            while (rec := await queue.get()) is not None:
                t0 = time.monotonic()
                try:
                    resp = await client.chat.completions.create(
                        model=MODEL, messages=rec["messages"])
                except Exception as exc:  # what a user's loop does: note it, go on
                    errs.write(json.dumps({"id": rec["id"], "error": type(exc).__name__})
                               + "\n")
                    continue
                choice = resp.choices[0]
                fh.write(_record(rec, resp.usage.model_dump() if resp.usage else None,
                                 choice.message.content, choice.finish_reason, resp.model,
                                 time.monotonic() - t0, 1))
                fh.flush()

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await _feed(inp, queue, len(workers))
        await asyncio.gather(*workers)
    await client.close()


class Gate:
    """At most `limit` at once; with `change` (start, end) the limit halves between those
    seconds after the first request, as the changing-cap server does: the oracle KNOWS K."""

    def __init__(self, limit: int, change: tuple[float, float] | None) -> None:
        self.limit, self.change = limit, change
        self.busy = 0
        self.t0: float | None = None
        self.cond = asyncio.Condition()

    def _limit(self) -> int:
        if self.change is None or self.t0 is None:
            return self.limit
        t = time.monotonic() - self.t0
        return self.limit // 2 if self.change[0] <= t < self.change[1] else self.limit

    async def _tick(self) -> None:  # wake waiters when the cap recovers
        assert self.change is not None
        await asyncio.sleep(self.change[1] + 0.001)
        async with self.cond:
            self.cond.notify_all()

    async def __aenter__(self) -> None:
        async with self.cond:
            if self.t0 is None:
                self.t0 = time.monotonic()
                if self.change is not None:
                    self._ticker = asyncio.ensure_future(self._tick())
            await self.cond.wait_for(lambda: self.busy < self._limit())
            self.busy += 1

    async def __aexit__(self, *exc: object) -> None:
        async with self.cond:
            self.busy -= 1
            self.cond.notify(1)


async def bare_client(inp: Path, out: Path, base_url: str, key: str, concurrency: int,
                      change: tuple[float, float] | None = None) -> None:
    """The floor: a semaphore-bounded aiohttp loop. Refusals (429/402/5xx, resets) are
    retried after their Retry-After (else 0.5 s): the oracle needs no cleverness, only K
    (and, on a changing cap, when it changes: `change`)."""
    import aiohttp
    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=concurrency)
    gate = Gate(concurrency, change)
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        with out.open("w", encoding="utf-8") as fh:
            async def worker() -> None:
                while (rec := await queue.get()) is not None:
                    body = json.dumps({"model": MODEL, "messages": rec["messages"]})
                    t0 = time.monotonic()
                    attempts = 0
                    while True:
                        attempts += 1
                        try:
                            async with gate, session.post(url, data=body,
                                                          headers=headers) as resp:
                                raw = await resp.read()
                                wait = float(resp.headers.get("Retry-After") or 0.5)
                                status = resp.status
                        except aiohttp.ClientError:
                            status, wait = 0, 0.5
                        if status == 200:
                            data = json.loads(raw)
                            choice = data["choices"][0]
                            fh.write(_record(rec, data.get("usage"),
                                             choice["message"]["content"],
                                             choice.get("finish_reason"), data.get("model"),
                                             time.monotonic() - t0, attempts))
                            fh.flush()
                            break
                        await asyncio.sleep(wait)

            workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
            await _feed(inp, queue, len(workers))
            await asyncio.gather(*workers)


# -- measurement -------------------------------------------------------------------------------
@dataclass
class Run:
    client: str
    wall_s: float
    cpu_s: float
    rss_mb: float
    rc: int
    lines: int = 0
    unique: int = 0
    failed: int = 0
    requests: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def measured(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float, int, str]:
    """(wall s, CPU s, peak RSS MB, exit code, stderr) of one client process."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: a chatty client never blocks
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
        err.seek(0)
        text = err.read().decode(errors="replace")
    return (wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
            os.waitstatus_to_exitcode(status), text)


def write_prompts(path: Path, n: int) -> list[int]:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": i, "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"Explain topic number {i} in one paragraph."}]})
                + "\n")
    return list(range(n))


class ServerProcess:
    """An answering server in its own process, for one run: started with `argv` (it prints
    `base_url=...` once it listens), its counters read from `stats_path` under that root."""

    def __init__(self, argv: list[str], what: str, stats_path: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *argv], cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("base_url="):
            raise SystemExit(f"{what} did not start: {line!r}")
        self.url = line.split("=", 1)[1]
        self.stats_path = stats_path

    def stats(self) -> dict[str, Any]:
        root = self.url.split("/api/v1")[0]
        with urllib.request.urlopen(root + self.stats_path, timeout=60) as resp:
            data: dict[str, Any] = json.loads(resp.read())
        return data

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Fake(ServerProcess):
    """The fake API in its own process, for one run."""

    def __init__(self, key_file: Path, args: list[str]) -> None:
        super().__init__(["-m", "handoff.testing.fakeapi", "--port", "0", "--key-file",
                          str(key_file), "--timeline", *args], "fake API", "/_fake/stats")


class CappedServer(ServerProcess):
    """benchmarks/capped.py in its own process, for one run (the same interface as Fake)."""

    def __init__(self, args: list[str]) -> None:
        super().__init__(["-m", "benchmarks.capped", "--port", "0", *args], "capped server",
                         "/_capped/stats")


def client_cmd(client: str, inp: Path, out: Path, url: str, key_file: Path,
               concurrency: int, oracle: int | None = None, max_cost: float | None = None,
               change: str | None = None) -> list[str]:
    if client.startswith("payload"):
        cmd = [sys.executable, "-m", "payload", "generate", "--input", str(inp), "--output",
               str(out), "--base-url", url, "--api-key-file", str(key_file), "--concurrency",
               str(concurrency), "--model", MODEL]
        if max_cost is not None:
            cmd += ["--max-cost", str(max_cost)]
        return cmd
    me = str(Path(__file__).resolve())
    if client == "oracle":
        return [sys.executable, me, "--client", "bare", str(inp), str(out), url, str(key_file),
                str(oracle), change or "-", "-"]
    if client == "bare":
        return [sys.executable, me, "--client", "bare", str(inp), str(out), url, str(key_file),
                str(concurrency), "-", "-"]
    transport = "httpx" if client == "sdk-httpx" else "aiohttp"
    retries = "0" if client.endswith("-noretry") else "default"
    return [sys.executable, me, "--client", "sdk", str(inp), str(out), url, str(key_file),
            str(concurrency), transport, retries]


def count_output(out: Path, ids: list[int]) -> tuple[int, int, int]:
    """(lines, distinct ids among them, failures recorded) of a client's output."""
    lines = 0
    seen: set[str] = set()
    if out.exists():
        with out.open(encoding="utf-8") as fh:
            for line in fh:
                lines += 1
                seen.add(str(json.loads(line)["id"]))
    failed = 0
    for errs in (out.with_suffix(".errors.jsonl"), out.with_name(out.stem + ".errors.jsonl")):
        if errs.exists():
            with errs.open(encoding="utf-8") as fh:
                failed = max(failed, sum(1 for _ in fh))
    assert seen <= {str(i) for i in ids}, "an id nobody asked for"
    return lines, len(seen), failed


def run_client(client: str, tmp: Path, key_file: Path, fake_args: list[str], n: int,
               concurrency: int, env: dict[str, str], oracle: int | None = None,
               max_cost: float | None = None, inp: Path | None = None,
               capped: list[str] | None = None, change: str | None = None
               ) -> tuple[Run, dict]:
    """One client against a fresh server: the fake API, or with `capped` (its argv) the
    independent capped server of benchmarks/capped.py."""
    if inp is None:
        inp = tmp / f"in-{n}.jsonl"
        if not inp.exists():
            write_prompts(inp, n)
    out = tmp / f"{client}-{secrets.token_hex(3)}.jsonl"
    fake = Fake(key_file, fake_args) if capped is None else CappedServer(capped)
    try:
        wall, cpu, rss, rc, err = measured(
            client_cmd(client, inp, out, fake.url, key_file, concurrency, oracle, max_cost,
                       change), env)
        stats = fake.stats()
    finally:
        fake.close()
    lines, unique, failed = count_output(out, list(range(n)))
    r = Run(client, wall, cpu, rss, rc, lines, unique, failed, int(stats["requests"]))
    if rc not in (0,) and client.startswith("payload"):
        print(f"  {client} exited {rc}: {err[-800:]}", file=sys.stderr)
    return r, stats


# -- timeline analysis (outage recovery) --------------------------------------------------------
def recovery(stats: dict[str, Any], full_rate: float, capacity: int) -> dict[str, float]:
    """From the fake's 100 ms timeline: seconds from the outage's end until a 1 s window
    runs at >= 90% of the full rate; peak requests in the server and arrivals in the first
    second after it."""
    windows = stats.get("outage_windows") or []
    if not windows:
        return {}
    end = windows[0][1]
    tl = {int(k): v for k, v in stats["timeline"].items()}
    b0 = int(end * 10)
    first = [tl.get(b, [0, 0, 0, 0]) for b in range(b0, b0 + 10)]
    back = None
    for start in range(b0, b0 + 600):
        ok = sum(tl.get(b, [0, 0, 0, 0])[1] for b in range(start, start + 10))
        if ok >= 0.9 * full_rate:
            back = (start + 10) / 10 - end
            break
    return {"back_s": back if back is not None else float("nan"),
            "peak_first_s": max(r[3] for r in first) / capacity,
            "arrivals_first_s": sum(r[0] for r in first) / capacity}


# -- scenarios ---------------------------------------------------------------------------------
def med(runs: list[Run], key: str) -> float:
    return statistics.median(getattr(r, key) if hasattr(r, key) else r.extra[key] for r in runs)


def scenario_floor(tmp: Path, key_file: Path, env: dict[str, str], args: argparse.Namespace
                   ) -> list[str]:
    n, conc = args.prompts, args.concurrency
    clients = ["payload", "payload+budget", "bare", "sdk-noretry"]
    runs: dict[str, list[Run]] = {c: [] for c in clients}
    for rep in range(args.reps):
        for c in clients if rep % 2 == 0 else clients[::-1]:
            r, _ = run_client(c, tmp, key_file, ["--latency", "0.2", *args.fake_fields], n,
                              conc, env,
                              max_cost=1e6 if c == "payload+budget" else None)
            assert r.unique == n == r.lines, f"{c}: {r.lines} lines, {r.unique} ids of {n}"
            runs[c].append(r)
            print(f"floor rep {rep} {c:15s} cpu {1000 * r.cpu_s / n:.3f} ms/req  rss "
                  f"{r.rss_mb:.0f} MB  wall {r.wall_s:.1f}s", flush=True)
    big_rss = None
    if not args.skip_big:
        r, _ = run_client("payload", tmp, key_file, ["--latency", "0.2"], n * args.big_factor,
                          conc, env)
        big_rss = r.rss_mb
        print(f"floor payload {n * args.big_factor} prompts: rss {big_rss:.0f} MB", flush=True)
    cpu = {c: 1000 * med(v, "cpu_s") / n for c, v in runs.items()}
    rss = {c: med(v, "rss_mb") for c, v in runs.items()}
    wall = {c: med(v, "wall_s") for c, v in runs.items()}
    lines = [
        f"### Fault-free floor\n\n{n} prompts, --concurrency {conc}, 0.2 s latency; medians of "
        f"{args.reps}; CPU = user+sys of the client process.\n",
        "| client | CPU ms / request | vs bare aiohttp loop | peak RSS MB | wall s |",
        "|---|---:|---:|---:|---:|"]
    names = {"payload": "payload generate", "payload+budget": "payload generate --max-cost",
             "bare": "bare aiohttp loop (floor)", "sdk-noretry": "openai SDK (aiohttp)"}
    for c in clients:
        lines.append(f"| {names[c]} | {cpu[c]:.3f} | {cpu[c] / cpu['bare']:.2f}x | "
                     f"{rss[c]:.0f} | {wall[c]:.1f} |")
    lines.append("")
    lines.append(f"Targets: payload CPU per request within 1.5x the bare loop, also with a "
                 f"budget: {cpu['payload'] / cpu['bare']:.2f}x and "
                 f"{cpu['payload+budget'] / cpu['bare']:.2f}x.")
    if big_rss is not None:
        lines.append(f"Peak RSS at {args.big_factor}x the input ({n * args.big_factor} "
                     f"prompts): {big_rss:.0f} MB, {big_rss / rss['payload']:.2f}x "
                     "(target <= 1.2x).")
    return [*lines, ""]


def scenario_capacity(tmp: Path, key_file: Path, env: dict[str, str], args: argparse.Namespace,
                      outage: bool) -> list[str]:
    n, conc, k, lat = args.cap_prompts, args.concurrency, args.capacity, 0.5
    ideal = n * lat / k
    fake_args = ["--latency", str(lat), "--capacity", str(k), "--capacity-status",
                 str(args.capacity_status), "--capacity-retry-after", "1"]
    if outage:
        fake_args += ["--outage-at", "10", "--outage-for", "30"]
        ideal += 30
    clients = ["payload", "sdk", "oracle"]
    runs: dict[str, list[Run]] = {c: [] for c in clients}
    for rep in range(args.cap_reps):
        for c in clients if rep % 2 == 0 else clients[::-1]:
            r, stats = run_client(c, tmp, key_file, fake_args, n, conc, env, oracle=k)
            if outage:
                r.extra.update(recovery(stats, k / lat, k))
            runs[c].append(r)
            print(f"{'outage' if outage else 'capacity'} rep {rep} {c:8s} wall {r.wall_s:.1f}s "
                  f"({r.wall_s / ideal:.2f}x ideal) requests {r.requests / n:.2f}x prompts, "
                  f"{r.unique}/{n} ids, {r.lines - r.unique} dup, {r.failed} failed"
                  + (f", back in {r.extra.get('back_s', 0):.1f}s, first-second peak "
                     f"{r.extra.get('peak_first_s', 0):.2f}x K" if outage else ""), flush=True)
    title = (f"### Capacity{' + 30 s outage' if outage else ''}\n\n{n} prompts, --concurrency "
             f"{conc}, the provider serves at most K={k} at once ({args.capacity_status} with "
             f"Retry-After 1 beyond), {lat} s latency"
             + (", every request 503 from 10 s to 40 s after the first" if outage else "")
             + f": ideal {ideal:.0f} s. Medians of {args.cap_reps}.\n")
    head = ("| client | wall s | x ideal | requests / prompts | ids once | duplicates | failed |"
            + (" back to 90% rate | peak in server, 1st s | arrivals, 1st s |" if outage else ""))
    lines = [title, head, "|---" * (head.count("|") - 1) + "|"]
    names = {"payload": "payload generate", "sdk": "openai SDK, default retries, 2000 wide",
             "oracle": f"semaphore of exactly K={k} (oracle)"}
    for c in clients:
        v = runs[c]
        row = (f"| {names[c]} | {med(v, 'wall_s'):.1f} | {med(v, 'wall_s') / ideal:.2f}x | "
               f"{med(v, 'requests') / n:.2f}x | {min(r.unique for r in v)}/{n} | "
               f"{max(r.lines - r.unique for r in v)} | {max(r.failed for r in v)} |")
        if outage:
            row += (f" {med(v, 'back_s'):.1f} s | {med(v, 'peak_first_s'):.2f}x K | "
                    f"{med(v, 'arrivals_first_s'):.2f}x K |")
        lines.append(row)
    return [*lines, ""]


CAPPED_SHAPES = {
    "429-ra": "429 with Retry-After: 1",
    "429": "429 without Retry-After",
    "402-ra": "402 in-flight budget with Retry-After: 1",
    "changing": "429 with Retry-After: 1, K halved from 6 s to 14 s",
}


def capped_ideal(n: int, lat: float, k: int, change: tuple[float, float] | None) -> float:
    """Seconds to serve n answers of `lat` s at the cap (halved during `change`)."""
    work, t, dt = n * lat, 0.0, 0.001
    while work > 0:
        half = change is not None and change[0] <= t < change[1]
        work -= (k // 2 if half else k) * dt
        t += dt
    return t


def served_rates(stats: dict[str, Any], k: int, lat: float,
                 change: tuple[float, float] | None) -> list[float]:
    """Per whole second from the first request: answers served as a share of what the cap
    allowed that second (K / latency; half of it while the cap is halved)."""
    tl = {int(b): v for b, v in stats["timeline"].items()}
    if not tl:
        return []
    rates = []
    for sec in range(max(tl) // 10 + 1):
        served = sum(tl.get(b, [0, 0, 0, 0])[1] for b in range(sec * 10, sec * 10 + 10))
        half = change is not None and change[0] <= sec < change[1]
        rates.append(served / ((k // 2 if half else k) / lat))
    return rates


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def scenario_capped(tmp: Path, key_file: Path, env: dict[str, str], args: argparse.Namespace
                    ) -> list[str]:
    """payload vs the exact-K oracle vs the SDK on benchmarks/capped.py, shape by shape."""
    n, conc, k, lat = args.cap_prompts, args.concurrency, args.capacity, 0.5
    shapes = args.shapes.split(",")
    clients = [c for c in ("payload", "oracle", "sdk") if c not in args.skip_clients.split(",")]
    lines = [f"### Capacity\n\n{n} prompts, --concurrency {conc}, 0.5 s answers, on "
             f"benchmarks/capped.py (an independent server that counts the requests it is "
             f"answering and refuses beyond K={k} at once: the providers' documented "
             f"answers, not the limiter's model), in its own process. Medians of "
             f"{args.cap_reps} (the SDK: {min(args.sdk_reps, args.cap_reps)}); per-second "
             f"served = answers per whole second after the "
             f"first 2 s and before the last 2, as a share of K / latency.\n",
             "| shape | client | wall s | x ideal | x oracle | requests / prompts | "
             "ids once | dup | failed | served/s p10 | p50 | min |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for shape in shapes:
        change = (6.0, 14.0) if shape == "changing" else None
        ideal = capped_ideal(n, lat, k, change)
        server = ["--shape", shape, "--capacity", str(k), "--latency", str(lat)]
        runs: dict[str, list[Run]] = {c: [] for c in clients}
        for rep in range(args.cap_reps):
            for c in clients if rep % 2 == 0 else clients[::-1]:
                if c == "sdk" and rep >= args.sdk_reps:
                    continue
                r, stats = run_client(c, tmp, key_file, [], n, conc, env, oracle=k,
                                      capped=server,
                                      change=None if change is None else
                                      f"{change[0]},{change[1] + 0.02}")
                rates = served_rates(stats, k, lat, change)
                body = rates[2:-2] if len(rates) > 5 else rates
                r.extra.update(p10=pct(body, 0.1), p50=pct(body, 0.5),
                               low=min(body) if body else float("nan"))
                runs[c].append(r)
                series = " ".join(f"{x:.2f}" for x in rates)
                print(f"capped {shape:8s} rep {rep} {c:8s} wall {r.wall_s:.1f}s "
                      f"({r.wall_s / ideal:.2f}x ideal {ideal:.1f}) requests "
                      f"{r.requests / n:.3f}x, {r.unique}/{n} ids, {r.lines - r.unique} dup, "
                      f"{r.failed} failed, rc {r.rc}; served/s p10 {r.extra['p10']:.2f} "
                      f"p50 {r.extra['p50']:.2f} min {r.extra['low']:.2f}\n    per s: {series}",
                      flush=True)
        oracle_wall = med(runs["oracle"], "wall_s") if "oracle" in runs else float("nan")
        names = {"payload": "payload generate", "oracle": "semaphore of exactly K (oracle)",
                 "sdk": "openai SDK, default retries"}
        for c in clients:
            v = runs[c]
            w = med(v, "wall_s")
            lines.append(
                f"| {CAPPED_SHAPES[shape]} | {names[c]} | {w:.1f} | {w / ideal:.2f}x | "
                f"{w / oracle_wall:.2f}x | {med(v, 'requests') / n:.3f}x | "
                f"{min(r.unique for r in v)}/{n} | {max(r.lines - r.unique for r in v)} | "
                f"{max(r.failed for r in v)} | {med(v, 'p10'):.2f} | {med(v, 'p50'):.2f} | "
                f"{med(v, 'low'):.2f} |")
    lines.append("")
    lines.append("Ideal: " + "; ".join(
        f"{s} {capped_ideal(n, lat, k, (6.0, 14.0) if s == 'changing' else None):.1f} s"
        for s in shapes) + ".")
    return [*lines, ""]


RANDOM_CASES = [("5% 429, Retry-After 1", "random-ra", 0.05),
                ("20% 429, Retry-After 1", "random-ra", 0.20),
                ("5% 429, no Retry-After", "random", 0.05),
                ("20% 429, no Retry-After", "random", 0.20)]


def body_rate(stats: dict[str, Any], n: int, upto: float = 0.8) -> tuple[float, float, float]:
    """From the server's 100 ms timeline: (requests answered per second, successes per
    second, seconds) from the first arrival until `upto` of the prompts were served. The
    run's tail is left out: the prompts refused in the last Retry-After before the queue
    ran dry wait it out with nothing else to send, which any client that honours it pays
    (at 20% refused, Retry-After 1 and ~1000 answers/s, 200 prompts: a tenth of a
    2000-prompt run, so 90% would sit in it). A refusal costs a CPU-bound server about as
    much as an answer, so the requests it answered measure a client keeping it busy."""
    tl = {int(k): v for k, v in stats["timeline"].items()}
    served = answered = 0
    for b in range(0, max(tl) + 1):
        row = tl.get(b, [0, 0, 0, 0])
        served += row[1]
        answered += row[1] + row[2]
        if served >= upto * n:
            t = (b + 1) / 10
            return answered / t, served / t, t
    return float("nan"), float("nan"), float("nan")


def scenario_random(tmp: Path, key_file: Path, env: dict[str, str], args: argparse.Namespace
                    ) -> tuple[list[str], bool]:
    """Independent random 429s on a server answering as fast as its CPU allows
    (benchmarks/capped.py, shapes random-ra / random / clean). Each refusing run goes at
    the same time as a clean one (each its own server and client process): on a shared
    machine whose load drifts by 2-3x within seconds, runs in turn measure the drift, runs
    side by side share it. Ratio: requests answered per second over the run's body,
    refusing / clean; and an A/A pair (clean beside clean) per rep, the noise floor.
    Returns the section and whether every refusing run held 0.9x."""
    from concurrent.futures import ThreadPoolExecutor

    n, conc = args.random_prompts, args.random_concurrency
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"])
            for _ in range(args.load)]
    cases = [*RANDOM_CASES, ("A/A: clean beside clean (noise floor)", "clean", 0.0)]
    ratios: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    success: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    clean_rates: list[float] = []
    clean = ["--shape", "clean", "--latency", "0"]

    def one(server: list[str], upto: float) -> tuple[Run, tuple[float, float, float]]:
        r, stats = run_client("payload", tmp, key_file, [], n, conc, env, capped=server)
        return r, body_rate(stats, n, upto)

    try:
        with ThreadPoolExecutor(2) as pool:
            for rep in range(args.random_reps):
                for label, shape, share in cases:
                    server = ["--shape", shape, "--latency", "0", "--refuse-share", str(share),
                              "--seed", str(rep + 1)]
                    # Both runs of a pair read to the same mark, 0.8 x (1 - share) of the
                    # prompts served: with a share s refused, serving 1 - s of them takes
                    # n requests, about when the last prompt is first asked; past that the
                    # queue is dry and the run is the Retry-After tail (at 20%, 80% served
                    # sat on that edge whatever n: 0.89x on a run at 0.94-0.98x before it).
                    upto = 0.8 * (1.0 - share)
                    f_clean = pool.submit(one, clean, upto)
                    f_case = pool.submit(one, server, upto)
                    (rc_, (c_rate, c_ok, _)), (r, (rate, ok, t90)) = (f_clean.result(),
                                                                       f_case.result())
                    clean_rates.append(c_rate)
                    ratios[label].append(rate / c_rate)
                    success[label].append(ok / c_ok)
                    print(f"random rep {rep} {label:24s} {rate:.0f} req/s beside clean "
                          f"{c_rate:.0f}: {rate / c_rate:.2f}x (successes {ok / c_ok:.2f}x); "
                          f"to {upto:.0%} in {t90:.1f}s, wall {r.wall_s:.1f}s (clean "
                          f"{rc_.wall_s:.1f}s), {r.unique}/{n} ids, rc {r.rc}", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    held = all(min(ratios[label]) >= 0.9 for label, _, _ in RANDOM_CASES)
    load = (f", {args.load} busy loops (`while 1: pass`) beside it" if args.load
            else ", no busy loops of ours (other sessions share the machine)")
    lines = [f"### Random refusals{' (loaded)' if args.load else ''}\n\n{n} prompts, "
             f"--concurrency {conc}, on benchmarks/capped.py answering as fast as its CPU "
             f"allows (latency 0) with independent random 429s{load}. Each refusing run "
             f"goes side by side with a clean one (its own server and client), "
             f"{args.random_reps} reps. Ratio: requests answered per second until "
             f"0.8 x (1 - share) of the prompts were served (both runs of a pair: about "
             f"when the last prompt is first asked, the Retry-After tail left out), "
             f"refusing / clean (clean median "
             f"{statistics.median(clean_rates):.0f}/s); the A/A row pairs two clean runs.\n",
             "| case | ratio min | median | reps >= 0.9x | successes/s vs clean, median |",
             "|---|---:|---:|---:|---:|"]
    for label, _, _ in cases:
        v = ratios[label]
        lines.append(f"| {label} | {min(v):.2f}x | {statistics.median(v):.2f}x | "
                     f"{sum(x >= 0.9 for x in v)}/{len(v)} | "
                     f"{statistics.median(success[label]):.2f}x |")
    return [*lines, ""], held


def scenario_sporadic(tmp: Path, key_file: Path, env: dict[str, str], args: argparse.Namespace
                      ) -> list[str]:
    n, conc = args.sporadic_prompts, args.sporadic_concurrency
    cases = [("fault-free", []),
             ("5% 429, Retry-After 1", ["--faults", json.dumps(
                 {"rates": {"429": 0.05}, "seed": 1, "retry_after_s": 1}), "--fast-faults"]),
             ("50% 429, no Retry-After", ["--faults", json.dumps(
                 {"rates": {"429_bare": 0.5}, "seed": 1}), "--fast-faults"])]
    clients = ["payload", "sdk"]
    table: dict[tuple[str, str], list[Run]] = {}
    for rep in range(args.reps):
        for label, extra in cases:
            for c in clients if rep % 2 == 0 else clients[::-1]:
                r, _ = run_client(c, tmp, key_file, ["--latency", "0.2", *extra], n, conc, env)
                table.setdefault((label, c), []).append(r)
                print(f"sporadic rep {rep} {label:24s} {c:8s} wall {r.wall_s:.2f}s requests "
                      f"{r.requests / n:.2f}x, {r.unique}/{n} ids, {r.failed} failed",
                      flush=True)
    base = {c: med(table[("fault-free", c)], "wall_s") for c in clients}
    lines = [f"### Sporadic throttling\n\n{n} prompts at {conc} in flight, 0.2 s latency, 429s "
             f"answered at the door; medians of {args.reps}. The SDK runs with its default "
             "retries (2): what it cannot do is lost.\n",
             "| case | payload wall s | x its fault-free | SDK wall s | x its fault-free | "
             "payload / SDK | payload ids | SDK ids (failed) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, _ in cases:
        p, s = table[(label, "payload")], table[(label, "sdk")]
        pw, sw = med(p, "wall_s"), med(s, "wall_s")
        lines.append(f"| {label} | {pw:.2f} | {pw / base['payload']:.2f}x | {sw:.2f} | "
                     f"{sw / base['sdk']:.2f}x | {pw / sw:.2f}x | {min(r.unique for r in p)}/{n}"
                     f" | {min(r.unique for r in s)}/{n} ({max(r.failed for r in s)}) |")
    return [*lines, ""]


def make_big_output(path: Path, gigabytes: float) -> int:
    """A synthetic output file shaped like real records (~8 KB: prompt, reasoning, answer),
    in the payload's key order (the breakdown fields before `response`)."""
    sys.path.insert(0, str(REPO))
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
                "finish_reason": "stop" if n % 7 else "length", "provider": "DeepInfra",
                "response": filler[: 3000 + n % 500], "reasoning": filler[:2400],
                "native_finish_reason": "stop", "model": "m", "generation_id": f"gen-{n}",
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


def scenario_index(tmp: Path, env: dict[str, str], args: argparse.Namespace) -> list[str]:
    big_out = tmp / "huge.jsonl"
    n = make_big_output(big_out, args.index_gb)
    size_gb = big_out.stat().st_size / (1 << 30)
    times = []
    for _ in range(3):
        res = subprocess.run([sys.executable, "-c", INDEX_SNIPPET, str(big_out),
                              str(tmp / "none.errors.jsonl")], cwd=REPO, env=env,
                             capture_output=True, text=True, check=True)
        secs, count = res.stdout.split()
        assert int(count) == n
        times.append(float(secs))
    print(f"resume index {size_gb:.2f} GB: {statistics.median(times):.2f}s", flush=True)
    return [f"### Resume index\n\n{size_gb:.2f} GB synthetic output ({n} records of ~7 KB), "
            f"`load_index` in a fresh process: {statistics.median(times):.2f} s median "
            f"(runs {', '.join(f'{t:.2f}' for t in times)}; target <= 3 s).", ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="floor,capped,outage,sporadic,index")
    ap.add_argument("--prompts", type=int, default=20_000, help="floor scenario")
    ap.add_argument("--new-fields", dest="fake_fields", action="store_const",
                    const=["--token-ids", "--thinking", "field"], default=[],
                    help="floor scenario: the fake answers as a thinking model with sampled "
                         "token ids (reasoning, generation id, native finish reason, "
                         "token_ids: every field the payload now keeps)")
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--big-factor", type=int, default=10)
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--cap-prompts", type=int, default=20_000)
    ap.add_argument("--capacity", type=int, default=500)
    ap.add_argument("--capacity-status", type=int, default=429, choices=(429, 402))
    ap.add_argument("--cap-reps", type=int, default=3)
    ap.add_argument("--shapes", default="429-ra,429,402-ra,changing",
                    help="capped scenario: the server shapes (benchmarks/capped.py)")
    ap.add_argument("--sdk-reps", type=int, default=3,
                    help="capped scenario: reps of the SDK (slow; its figure is a peer's)")
    ap.add_argument("--skip-clients", default="",
                    help="capped scenario: clients to leave out (payload, oracle, sdk)")
    ap.add_argument("--random-prompts", type=int, default=12_000,
                    help="random scenario: prompts per run (at ~3500 requests/s, 12k make a "
                    "body of ~3 s: at 3k the noise between two runs was the ratio's size)")
    ap.add_argument("--random-concurrency", type=int, default=200)
    ap.add_argument("--random-reps", type=int, default=20,
                    help="random scenario: reps (each the clean server and four refusing)")
    ap.add_argument("--load", type=int, default=0,
                    help="random scenario: busy loops (`while 1: pass`) beside it")
    ap.add_argument("--sporadic-prompts", type=int, default=2000)
    ap.add_argument("--sporadic-concurrency", type=int, default=200)
    ap.add_argument("--index-gb", type=float, default=1.0)
    ap.add_argument("--write-md", type=Path, help="replace the '## Generator' section")
    ap.add_argument("--client", nargs=8, help=argparse.SUPPRESS,
                    metavar=("KIND", "IN", "OUT", "URL", "KEYFILE", "N", "TRANSPORT", "RETRIES"))
    args = ap.parse_args()
    if args.client:
        kind, inp, out, url, keyf, n, transport, retries = args.client
        key = Path(keyf).read_text().strip()
        if kind == "bare":
            change = (None if transport == "-" else
                      tuple(float(x) for x in transport.split(",")))
            asyncio.run(bare_client(Path(inp), Path(out), url, key, int(n),
                                    change))  # type: ignore[arg-type]
        else:
            asyncio.run(sdk_client(Path(inp), Path(out), url, key, int(n), transport,
                                   None if retries == "default" else int(retries)))
        return 0

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OPENROUTER_API_KEY", None)
    chosen = args.scenarios.split(",")
    sections: list[str] = []
    failed = False  # a scenario with a pass mark missed it (`random`): exit 1
    started = time.time()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-gen-") as tmp_s:
        tmp = Path(tmp_s)
        key_file = tmp / "key"
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, ("sk-or-v1-" + secrets.token_hex(32)).encode())
        os.close(fd)
        if "floor" in chosen:
            sections += scenario_floor(tmp, key_file, env, args)
        if "capped" in chosen:
            sections += scenario_capped(tmp, key_file, env, args)
        if "capacity" in chosen:
            sections += scenario_capacity(tmp, key_file, env, args, outage=False)
        if "outage" in chosen:
            sections += scenario_capacity(tmp, key_file, env, args, outage=True)
        if "sporadic" in chosen:
            sections += scenario_sporadic(tmp, key_file, env, args)
        if "random" in chosen:
            section, held = scenario_random(tmp, key_file, env, args)
            sections += section
            failed = failed or not held
        if "index" in chosen and args.index_gb > 0:
            sections += scenario_index(tmp, env, args)
    cmd = "python benchmarks/generator.py " + " ".join(
        a for a in sys.argv[1:] if not a.startswith("--write-md") and a != str(args.write_md))
    header = (f"`{cmd.strip()}`; {os.cpu_count()} shared cores, load average "
              f"{load0:.1f} at start, {os.getloadavg()[0]:.1f} at end; "
              f"{time.strftime('%Y-%m-%d', time.gmtime(started))}; "
              f"{(time.time() - started) / 60:.0f} min.\n")
    text = "\n".join([header, *sections, NOTES])
    print()
    report_md.publish("Generator", text, args.write_md is not None,
                      args.write_md or REPO / "BENCHMARKS.md")
    return 1 if failed else 0


NOTES = """### Reading these figures

- Provisional: the 2-core machine is shared (load average in the header); wall-clock
  ratios move by 10-20% between runs, CPU per request much less.
- "x ideal" includes each client's process start (Python, imports, the input survey:
  ~0.5-1 s). The oracle, a semaphore of exactly K, shows what a client that knows the
  capacity reaches on this machine; `payload generate` finds K from the 429s alone, and its
  slow start (32 in flight, then x16 per round trip) costs about a round trip against it.
- The SDK's "failed" ids are prompts its default 2 retries could not get through (each an
  exception a user's loop must catch and redo); `payload generate` records none.
- "back to 90% rate": seconds from the outage's end until a second runs at 90% of
  K / latency; "peak in server" and "arrivals" in the first second after it, as a
  multiple of K (target: no burst above 1.5x).
- Sporadic throttling at 2k prompts: most of the 5% case's cost is its tail, the last
  prompts throttled waiting the second the server asked for (some twice), which no
  client that honours Retry-After avoids.
- Capacity targets (issue 23: wall within 1.05x the oracle's, <= 1.08x the prompts in
  requests): read them off the table above. Where the gap goes on a busy machine: slow
  start's first round trip at 32 in flight (~0.5 s of the cap's capacity, the price of a
  run whose every answer is an error sending a few dozen requests), the step past K (512
  at K=500, read on its first refusals), and the probes for a cap that rose.
- The same rules on a noise-free virtual-time model (tests/payload/generate/limiter_sim.py
  and test_limiter_model.py) meet the targets on every shape; the model has no answers
  sitting unread, which is where the benchmark's gap is.
"""


if __name__ == "__main__":
    sys.exit(main())
