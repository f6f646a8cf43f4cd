"""`generate` against a real third-party server: vLLM's OpenAI-compatible server (CPU)
serving a tiny model with a real byte-level BPE tokenizer and a real chat template, on
127.0.0.1 only. The run is killed with -9 mid-way and resumed (every prompt once, with
the server's own `usage`), then `extract` runs over that output.

Needs the vLLM venv (scripts/vllm-venv, which scripts/test builds); skips without it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
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


def wire_answer(request: dict, data: bytes) -> dict:
    """A chat answer as it crossed the wire: the JSON body, or a stream's chunks read here
    (not by the generator's reader): the sampled ids of every chunk in order, the usage of
    the last chunk that carried one."""
    if request.get("stream") is not True:
        return json.loads(data)
    ids: list[int] = []
    usage = None
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in block.split(b"\n"):
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                ids += choice.get("token_ids") or []
    return {"choices": [{"token_ids": ids}], "usage": usage}


class RecordingProxy:
    """A loopback HTTP relay between the generator and the vLLM server that keeps every
    chat answer's body exactly as the server sent it: what the server sampled
    (`choices[0].token_ids`, or a stream's per-chunk `token_ids`) is read from the wire,
    not from what the generator stored. A stream is relayed whole once it ended."""

    def __init__(self, upstream: str) -> None:
        import http.server
        import threading

        self.upstream = upstream.rstrip("/")
        self.answers: list[tuple[dict, dict]] = []  # (request body, response body)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path[len("/v1"):] if self.path.startswith("/v1") else self.path
                req = urllib.request.Request(
                    proxy.upstream + path, data=body, method="POST",
                    headers={"Content-Type": "application/json",
                             "Authorization": self.headers.get("Authorization", "")})
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        status, data = r.status, r.read()
                        ctype = r.headers.get("Content-Type", "application/json")
                except urllib.error.HTTPError as exc:
                    status, data, ctype = exc.code, exc.read(), "application/json"
                if status == 200:
                    asked = json.loads(body)
                    proxy.answers.append((asked, wire_answer(asked, data)))
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_supervised_ids_are_the_ids_the_real_server_sampled(vllm_server: tuple[str, Path],
                                                            tmp_path: Path) -> None:
    """Token fidelity against a real server (issue 19): `generate --token-ids auto` asks
    vLLM for `return_token_ids`, and the extractor (HF backend) supervises exactly the ids
    the server's answers carried, byte for byte as they crossed the wire: no
    re-tokenization of the text, whatever the BPE would have split otherwise."""
    base, model = vllm_server
    proxy = RecordingProxy(base)
    try:
        key = write_private(tmp_path / "key", "sk-local-not-a-secret")
        inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        ids = write_prompts(inp, 12)
        args = gen_args(proxy.base, key, inp, out)
        args[args.index("--max-tokens") + 1] = "40"
        proc = run_payload(*args, "--token-ids", "auto", timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        proxy.close()
    done, failed = assert_exactly_once(ids, out)
    # One answer per prompt, or more where the client gave up on a slow one (its request
    # timeout, on a loaded CPU) and asked again: the server answered both, and what is stored
    # must be exactly one of the samples it sent for that prompt.
    assert not failed and len(done) == 12 and len(proxy.answers) >= 12
    sampled: dict[str, list[list[int]]] = {}
    for request, answer in proxy.answers:
        assert request.get("return_token_ids") is True, request  # auto asked for them
        choice = answer["choices"][0]
        assert isinstance(choice.get("token_ids"), list) and choice["token_ids"], answer
        assert len(choice["token_ids"]) == answer["usage"]["completion_tokens"]
        sampled.setdefault(request["messages"][-1]["content"], []).append(choice["token_ids"])
    for r in done:
        assert r["response_token_ids"] in sampled[r["messages"][-1]["content"]], r["id"]

    from tests.payload.extract.helpers import load_sample, manifest, run_extract, stats

    feats = tmp_path / "features"
    assert run_extract(out, model, feats, "--max-length", "1000", "--layers", "2,3,6") == 0
    s = stats(feats)
    assert s["written"] == 12 and s["retokenized_mismatch"] == 0, s
    by_id = {str(r["id"]): list(r["response_token_ids"]) for r in done}  # each one sampled
    assert s["supervised_from_token_ids"] == sum(map(len, by_id.values())), s
    for e in manifest(feats):
        f = load_sample(feats, e["file"])
        got = [i for i, m in zip(f["input_ids"].tolist(), f["loss_mask"].tolist(), strict=True)
               if m]
        assert got == by_id[str(e["id"])], e["id"]


# When, how fast, and vLLM's fresh id per request: measures of the run, not of the answer.
RUN_FIELDS = re.compile(rb',"(latency_s|answered_at|generation_id)":("[^"]*"|[0-9.e+-]+)')


def test_streamed_and_plain_records_are_the_same_on_vllm(vllm_server: tuple[str, Path],
                                                         tmp_path: Path) -> None:
    """Issue 33: the same prompts asked plain (--stream off) and streamed (the default),
    greedy and one at a time so that vLLM samples the same answers: the records are the
    same bytes, the sampled token ids (per chunk when streamed) and the usage included."""
    base, _ = vllm_server
    key = write_private(tmp_path / "key", "sk-local-not-a-secret")
    inp = tmp_path / "in.jsonl"
    ids = write_prompts(inp, 8)
    lines: dict[str, dict[str, bytes]] = {}
    for mode in ("off", "on"):
        out = tmp_path / f"stream-{mode}.jsonl"
        args = gen_args(base, key, inp, out)
        args[args.index("--temperature") + 1] = "0"
        args[args.index("--concurrency") + 1] = "1"
        proc = run_payload(*args, "--stream", mode, "--token-ids", "on", timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        done, failed = assert_exactly_once(ids, out)
        assert not failed
        assert all(len(r["response_token_ids"]) == r["usage"]["completion_tokens"] > 0
                   for r in done)
        lines[mode] = {str(r["id"]): RUN_FIELDS.sub(b"", raw) for r, raw in
                       zip(done, out.read_bytes().splitlines(), strict=True)}
    assert lines["off"] == lines["on"]
