"""`generate` against a real third-party server: vLLM's OpenAI-compatible server (CPU)
serving a tiny model with a real byte-level BPE tokenizer and a real chat template, on
127.0.0.1 only. The run is killed with -9 mid-way and resumed (every prompt once, with
the server's own `usage`), then `extract` runs over that output.

Needs the vLLM venv (scripts/vllm-venv, which scripts/test builds); skips without it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.payload.helpers import (
    REPO,
    assert_exactly_once,
    payload_cmd,
    payload_env,
    read_jsonl,
    run_payload,
    write_private,
    write_prompts,
)
from tests.vllm_support import build_chat_model, engine_env, needs_vllm

pytestmark = pytest.mark.timeout(900)
SERVED = "test/tiny-llama"  # author/slug, as OpenRouter names models
N_PROMPTS = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(base_url, model dir) of a live vLLM server; its whole process group ends after."""
    vpy = needs_vllm()
    model = build_chat_model(tmp_path_factory.mktemp("served-llama"))
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [str(vpy), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
             "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
             "--enforce-eager", "--max-model-len", "1024", "--dtype", "float32"],
            env=engine_env(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 400
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{base}/models", timeout=2) as r:
                    if SERVED in r.read().decode():
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "vLLM server not ready: " + log.read_text()[-2000:]
            time.sleep(1)
        yield base, model
    finally:
        with_group = os.getpgid(proc.pid) if proc.poll() is None else proc.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(with_group, sig)
            except ProcessLookupError:
                break
            time.sleep(3)
        proc.wait(timeout=30)


def gen_args(base: str, key: Path, inp: Path, out: Path) -> list[str]:
    return ["generate", "--input", str(inp), "--output", str(out), "--base-url", base,
            "--api-key-file", str(key), "--model", SERVED, "--max-tokens", "24",
            "--temperature", "0.8", "--concurrency", "4", "--no-preflight",
            "--request-timeout", "60"]


def test_generate_kill_9_resume_then_extract(vllm_server: tuple[str, Path],
                                             tmp_path: Path) -> None:
    base, model = vllm_server
    key = write_private(tmp_path / "key", "sk-local-not-a-secret")
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, N_PROMPTS)
    proc = subprocess.Popen(payload_cmd(*gen_args(base, key, inp, out)), cwd=REPO,
                            env=payload_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and len(out.read_text().splitlines()) >= 8):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no answers from the vLLM server"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    first = len(read_jsonl(out))
    assert first < N_PROMPTS, "the run finished before the kill: nothing to resume"
    rerun = run_payload(*gen_args(base, key, inp, out), timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    done, failed = assert_exactly_once(ids, out)
    assert not failed
    for r in done:
        u = r["usage"]
        assert u["prompt_tokens"] > 0 and 0 < u["completion_tokens"] <= 24, r
        assert isinstance(r["response"], str)
    assert "sk-local-not-a-secret" not in rerun.stderr + out.read_text()

    # extract over the server's output, with the model it served
    from tests.payload.extract.helpers import run_extract, stats

    feats = tmp_path / "features"
    code = run_extract(out, model, feats, "--max-length", "1000", "--layers", "2,3,6")
    s = stats(feats)
    assert code == 0, s
    assert s["written"] == N_PROMPTS, s
    assert s["failed_boundary"] == s["failed_nonfinite"] == 0, s
    assert len((feats / "manifest.jsonl").read_text().splitlines()) == N_PROMPTS
    assert json.loads((feats / "meta.json").read_text())["hidden_size"] == 256
