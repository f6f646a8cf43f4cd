"""Streamed answers, client CPU: the payload's streamed attempt (payload/generate/streaming.py:
the spec-compliant SSE reader, the assembly, the watchdog's deadlines) against a bare aiohttp
SSE loop (`async for line in resp.content`, json.loads of every `data:` line, nothing else),
a floor (`readany`, split at LF, json.loads), the openai SDK's streaming client, and the
payload's plain attempt (one JSON body), on the same fake server in the same run.

The fake OpenRouter runs in a subprocess (its CPU is not counted) and streams thinking-size
answers: `--tokens` reasoning tokens in chunks of 1-4 tokens (about tokens/2.5 SSE events an
answer), at a scaled rate so the run takes seconds. Each repetition runs every client in a
rotating order over `--answers` answers at `--concurrency`; the figure is this process's
CPU seconds (user + system) per 1,000 answers, median over the repetitions.

    .venv/bin/python benchmarks/stream_client.py --answers 400 --concurrency 100 --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from benchmarks import report as report_md  # noqa: E402
from payload.generate import client, streaming  # noqa: E402
from payload.generate.client import Kind  # noqa: E402

KEY = "sk-or-v1-" + "0" * 64
Client = Callable[[aiohttp.ClientSession, str, int], Awaitable[int]]


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def body(i: int, stream: bool) -> bytes:
    messages = [{"role": "user", "content": f"question number {i}"}]
    return json.dumps(client.build_body(messages, model="moonshotai/kimi-k2.5", provider=None,
                                        max_tokens=None, temperature=None, top_p=None,
                                        reasoning=None, stream=stream)).encode()


HEADERS = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


async def payload_streamed(session: aiohttp.ClientSession, url: str, i: int,
                           dog: streaming.Watchdog) -> int:
    o = await streaming.attempt(session, url, body(i, True), HEADERS, dog)
    assert o.kind is Kind.OK, (o.type, o.message)
    return len(o.result["reasoning"] or "")


async def payload_plain(session: aiohttp.ClientSession, url: str, i: int) -> int:
    o = await client.attempt(session, url, body(i, False), HEADERS,
                             aiohttp.ClientTimeout(total=600))
    assert o.kind is Kind.OK, (o.type, o.message)
    return len(o.result["reasoning"] or "")


async def bare_sse(session: aiohttp.ClientSession, url: str, i: int) -> int:
    """The least a client can do: read lines, decode every data line's JSON."""
    n = 0
    async with session.post(url, data=body(i, True), headers=HEADERS) as resp:
        async for line in resp.content:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                chunk = json.loads(line[6:])
                n += 1 if chunk else 0
    return n


async def bare_chunks(session: aiohttp.ClientSession, url: str, i: int) -> int:
    """A floor: whatever arrived, split at LF, json.loads of every data line (LF only, no
    comments, no multi-line events: not the standard)."""
    n, buf = 0, b""
    async with session.post(url, data=body(i, True), headers=HEADERS) as resp:
        while chunk := await resp.content.readany():
            *lines, buf = (buf + chunk).split(b"\n")
            for line in lines:
                if line.startswith(b"data: {"):
                    json.loads(line[6:])
                    n += 1
    return n


async def openai_sdk(oc: object, i: int) -> int:
    """The openai SDK's streaming client (httpx), joining the reasoning and content."""
    stream = await oc.chat.completions.create(  # type: ignore[attr-defined]
        model="moonshotai/kimi-k2.5", messages=[{"role": "user",
                                                 "content": f"question number {i}"}],
        stream=True, stream_options={"include_usage": True})
    parts: list[str] = []
    async for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            parts.append(delta.content or (delta.model_extra or {}).get("reasoning") or "")
    return len("".join(parts))


async def run_one(kind: str, url: str, answers: int, concurrency: int) -> float:
    """CPU seconds of this process for `answers` answers by `kind`."""
    dog = streaming.Watchdog(streaming.Timeouts())
    conn = aiohttp.TCPConnector(limit=concurrency)
    sem = asyncio.Semaphore(concurrency)
    oc = None
    if kind == "openai SDK streaming":
        import openai  # its own default connection pool (1,000 connections)
        oc = openai.AsyncOpenAI(base_url=url.rsplit("/chat/completions", 1)[0], api_key=KEY,
                                max_retries=0, timeout=600)
    async with aiohttp.ClientSession(connector=conn) as session:
        async def one(i: int) -> None:
            async with sem:
                if kind == "payload streamed":
                    await payload_streamed(session, url, i, dog)
                elif kind == "payload plain":
                    await payload_plain(session, url, i)
                elif kind == "bare readany loop":
                    await bare_chunks(session, url, i)
                elif kind == "openai SDK streaming":
                    await openai_sdk(oc, i)
                else:
                    await bare_sse(session, url, i)
        t0 = cpu()
        await asyncio.gather(*(one(i) for i in range(answers)))
        spent = cpu() - t0
    if oc is not None:
        await oc.close()  # in this loop, not at its exit
    return spent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=3500, help="reasoning tokens an answer")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--write", action="store_true", help="record the section in BENCHMARKS.md")
    args = ap.parse_args(argv)
    kinds = ["payload streamed", "bare aiohttp SSE loop", "bare readany loop",
             "openai SDK streaming", "payload plain"]
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        key = Path(tmp) / "key"
        key.write_text(KEY)
        key.chmod(0o600)
        fake = subprocess.Popen(
            [sys.executable, "-m", "handoff.testing.fakeapi", "--port", str(port),
             "--key-file", str(key), "--thinking", "field", "--reasoning-tokens",
             str(args.tokens), "--chunk-tokens", "1,4", "--tokens-per-s", "40",
             "--time-scale", "2000", "--stream-seed", "1"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or fake.poll() is not None:
                        raise SystemExit("the fake did not start") from None
                    time.sleep(0.1)
            url = f"http://127.0.0.1:{port}/api/v1/chat/completions"
            got: dict[str, list[float]] = {k: [] for k in kinds}
            for rep in range(args.reps):
                for k in kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]:
                    s = asyncio.run(run_one(k, url, args.answers, args.concurrency))
                    got[k].append(1000 * s / args.answers)
        finally:
            fake.terminate()
            fake.wait(timeout=10)
    med = {k: statistics.median(v) for k, v in got.items()}
    bare = med["bare aiohttp SSE loop"]
    lines = [
        "Client CPU per 1,000 streamed answers (benchmarks/stream_client.py; the fake in its",
        f"own process): {args.tokens} reasoning tokens an answer in chunks of 1-4 (about "
        f"{args.tokens * 10 // 25} events),",
        f"{args.answers} answers at concurrency {args.concurrency}, median of {args.reps} "
        f"rotating repetitions; load {report_md.load()}.",
        "",
        "    .venv/bin/python benchmarks/stream_client.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "",
        "| client | CPU s / 1,000 answers (median) | × bare SSE loop |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {med[k]:.2f} | {med[k] / bare:.2f} |" for k in kinds]
    report_md.publish("Streamed answers: client CPU (issue 33)", "\n".join(lines), args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
