"""benchmarks/stream.py runs end to end at tiny counts (every client, the report), its lean
server streams the very answer it would send whole, and "held" reads a timeline as the
report says."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def stream_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stream_bench", REPO / "benchmarks" / "stream.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_held_counts_from_first_reaching_the_target_until_the_last_request() -> None:
    m = stream_bench()
    timeline = [(0.0, 10), (0.1, 50), (0.2, 96), (0.3, 100), (0.4, 90), (0.5, 99), (0.6, 30)]
    share, ramp = m.held(timeline, 100, until=0.5)
    assert ramp == 0.2 and share == pytest.approx(3 / 4)  # 96, 100, 99 of 96, 100, 90, 99
    assert m.held([(0.0, 5)], 100, until=1.0) == (0.0, None)


def test_the_server_streams_the_answer_it_sends_whole() -> None:
    """Same prompt, streamed and not: the same text, reasoning, finish and usage; ~1 event
    per 2.5 tokens; the SSE shape OpenRouter's (a comment first, usage chunk, [DONE])."""
    import aiohttp

    m = stream_bench()
    server = m.StreamServer(["--time-scale", "200", "--tokens-median", "300"])

    async def ask(stream: bool) -> tuple[bytes, str]:
        body = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "x"}]}
        async with aiohttp.ClientSession() as s, \
                s.post(server.url + "/chat/completions", json=body) as resp:
            return await resp.read(), resp.headers["Content-Type"]

    try:
        raw, ctype = asyncio.run(ask(True))
        whole, wtype = asyncio.run(ask(False))
        stats = server.stats()
    finally:
        server.close()
    assert ctype == "text/event-stream" and wtype == "application/json"
    text = raw.decode()
    assert text.startswith(": OPENROUTER PROCESSING\n\n") and text.endswith("data: [DONE]\n\n")
    chunks = [json.loads(line[6:]) for line in text.splitlines()
              if line.startswith("data: {")]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                      if c["choices"])
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning") or "" for c in chunks
                        if c["choices"])
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    answer = json.loads(whole)
    message = answer["choices"][0]["message"]
    assert (content, reasoning, finish) == (message["content"], message["reasoning"],
                                            answer["choices"][0]["finish_reason"])
    assert chunks[-1]["usage"] == answer["usage"] and chunks[-1]["choices"] == []
    tokens = answer["usage"]["completion_tokens"]
    assert tokens / 4 <= len(chunks) - 2 <= tokens  # chunks of 1-4 tokens
    assert stats["answered"] == 2 and stats["events"] == len(chunks) - 2


def test_the_benchmark_runs_every_client_and_writes_its_section(tmp_path: Path) -> None:
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\n## Generator\n\nkeep me\n")
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "stream.py"), "--answers", "6",
         "--concurrency", "3", "--reps", "1", "--sdk-answers", "4", "--time-scale", "100",
         "--server-arg=--tokens-median=60", "--write-md", str(md)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for client, n in (("payload", 6), ("bare", 6), ("sdk", 4)):
        line = next(x for x in out.splitlines() if x.startswith(f"rep 0 {client} "))
        assert f"answers {n}/{n}" in line, out
    text = md.read_text()
    assert "keep me" in text and "## Streamed answers at 2000 in flight (issue 33)" in text
    for row in ("| payload generate", "| bare aiohttp SSE loop", "| openai SDK"):
        assert row in text
    assert "Targets (payload): CPU per answer ≤ 1.5× the bare loop" in text
