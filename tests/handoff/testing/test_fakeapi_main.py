"""The fake OpenRouter run alone, as the benchmarks and the README run it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.fab import REPO


def test_the_fake_api_still_runs_alone() -> None:
    """`python -m handoff.testing.fakeapi` (the benchmarks and README use it) after its split."""
    out = subprocess.run([sys.executable, "-m", "handoff.testing.fakeapi", "--help"],
                         capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.startswith("usage: python -m handoff.testing.fakeapi")
    assert "The project's own fake OpenRouter" in out.stdout


def test_the_fake_alone_streams_with_its_flags(tmp_path: Path) -> None:
    """The streaming flags reach the StreamPlan: chunks of exactly 2 tokens, queued comments,
    a forced mid-stream error on the first stream; the stats endpoint counts them."""
    key_file = tmp_path / "key"
    key_file.write_text("sk-or-v1-fake-main-stream")
    proc = subprocess.Popen([sys.executable, "-m", "handoff.testing.fakeapi", "--key-file",
                             str(key_file), "--thinking", "field", "--reasoning-tokens", "40",
                             "--chunk-tokens", "2,2", "--queue-s", "20", "--comment-every-s",
                             "10", "--time-scale", "100", "--tokens-per-s", "1000",
                             "--stream-plan", '{"schedule": {"1": "error"}}', "--stall-s", "-1"],
                            stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "FAKEAPI_KEY": ""})
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().strip().split("=", 1)[1]

        async def main() -> tuple[list[bytes], list[bytes], dict[str, Any]]:
            headers = {"Authorization": "Bearer sk-or-v1-fake-main-stream"}
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
            async with aiohttp.ClientSession(headers=headers) as s:
                streams = []
                for _ in range(2):
                    async with s.post(base + "/chat/completions", json=body) as r:
                        streams.append((await r.read()).split(b"\n\n"))
                async with s.get(base.rsplit("/api", 1)[0] + "/_fake/stats") as r:
                    return streams[0], streams[1], await r.json()
        broken, whole, stats = asyncio.run(main())
    finally:
        proc.terminate()
        proc.wait(10)
    assert broken[:2] == [b": OPENROUTER PROCESSING"] * 2 and b'"finish_reason":"error"' in broken[-2]
    assert whole[-2:] == [b"data: [DONE]", b""]
    reasoning = [json.loads(e[6:])["choices"][0]["delta"]["reasoning"] for e in whole
                 if b'"reasoning"' in e]
    assert all(len(r.split()) == 2 for r in reasoning) and len(reasoning) == 20
    assert stats["streams_started"] == 2 and stats["streams_errored"] == 1
    assert stats["streams_completed"] == 1 and stats["tokens_billed"] > 40
