"""`generate` streaming (docs/generator.md, "Streaming"; issue 33) against the fake
OpenRouter's streams: the records of streamed and non-streamed runs of the same answers are
the same bytes; an answer longer than the old 600 s wall is recorded whole (scaled time); a
stall, a mid-stream error and a cut stream are retried, never recorded in part.

Scaled time: the fake streams `time_scale` fake seconds per real one, and the client's
timeouts are given divided by the same factor.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from handoff.testing.fakeapi.streams import StreamPlan
from payload.records import derive_id
from tests.payload.helpers import (
    assert_exactly_once,
    gen_args,
    run_payload,
    status_of,
    write_prompts,
)

pytestmark = pytest.mark.timeout(180)

# When and how fast: measures of the run, not of the answer.
TIMES = re.compile(rb',"(latency_s|answered_at)":[0-9.e+-]+')


def records(out: Path, *, attempts: bool = True) -> dict[str, bytes]:
    """Each output line by id, its latency and answered_at removed, and its attempts count
    too unless `attempts`."""
    got: dict[str, bytes] = {}
    for line in out.read_bytes().splitlines():
        m = re.search(rb'^\{"id":("?[^,]*"?),', line)
        assert m is not None, line[:200]
        line = TIMES.sub(b"", line)
        if not attempts:
            line = re.sub(rb',"attempts":\d+', b"", line)
        got[m.group(1).decode()] = line
    return got


def scaled(scale: float, *, idle: float = 120, first: float = 600, total: float = 3600
           ) -> list[str]:
    return ["--idle-timeout", f"{idle / scale:g}", "--first-token-timeout", f"{first / scale:g}",
            "--request-timeout", f"{total / scale:g}"]


def two_runs(fake, key_file, tmp_path: Path, n: int, *extra: str
             ) -> tuple[list[str], Path, Path]:
    """The same prompts once with --stream off, once streamed (the default)."""
    inp = tmp_path / "in.jsonl"
    ids = write_prompts(inp, n)
    plain, streamed = tmp_path / "plain.jsonl", tmp_path / "streamed.jsonl"
    proc = run_payload(*gen_args(fake, key_file, inp, plain, "--stream", "off", *extra))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert fake.stats.streams_started == 0
    proc = run_payload(*gen_args(fake, key_file, inp, streamed, *extra), timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ids, plain, streamed


def test_streamed_and_plain_records_are_the_same_bytes(fake_factory, key_file, tmp_path):
    """A thinking model with a log-normal length per prompt, token ids, cost, provider,
    native finish reasons, some answers cut by max_tokens: every record identical."""
    fake = fake_factory(thinking="field", reasoning_tokens=200, reasoning_sigma=1.0,
                        stable_ids=True, token_ids=True, record_bodies=True,
                        providers=["DeepInfra", "Moonshot AI"],
                        stream=StreamPlan(chunk_tokens=(1, 4), tokens_per_s=50, time_scale=40,
                                          queue_s=2.0, comment_every_s=0.5, seed=3))
    ids, plain, streamed = two_runs(fake, key_file, tmp_path, 40, "--max-tokens", "300",
                                    *scaled(40))
    assert fake.stats.streams_completed == 40 == fake.stats.streams_started
    a, b = records(plain), records(streamed)
    assert sorted(a) == sorted(b) == sorted(ids)
    assert all(a[i] == b[i] for i in a), next(f"{a[i]!r}\n{b[i]!r}" for i in a if a[i] != b[i])
    assert b'"finish_reason":"length"' in b"".join(a.values())  # some were cut
    assert b'"response_token_ids":[' in b"".join(a.values())
    bodies = fake.stats.bodies
    assert all("stream" not in x for x in bodies[:40])
    assert all(x["stream"] is True and x["stream_options"] == {"include_usage": True}
               for x in bodies[40:])
    st = status_of(streamed)
    assert (st["done"], st["retries"], st["errors_by_kind"]) == (40, 0, {})


def test_an_answer_longer_than_the_old_wall_is_recorded_whole(fake_factory, key_file,
                                                              tmp_path):
    """3,000 reasoning tokens at 4 tokens/s: about 760 s, past the old 600 s
    --request-timeout; scaled 1:500 it takes 1.5 s under a 1.2 s first-token timeout and a
    0.24 s idle timeout, and is recorded whole, once, the same as the plain answer."""
    scale = 500
    fake = fake_factory(thinking="field", reasoning_tokens=3000, stable_ids=True,
                        stream=StreamPlan(tokens_per_s=4, time_scale=scale, seed=1))
    ids, plain, streamed = two_runs(fake, key_file, tmp_path, 3, *scaled(scale))
    assert records(plain) == records(streamed)
    st = status_of(streamed)
    assert (st["done"], st["retries"], st["timeouts"]) == (3, 0, 0)
    latencies = [r["latency_s"] for r in assert_exactly_once(ids, streamed)[0]]
    assert min(latencies) > 600 / scale
    assert fake.stats.streams_completed == 3


@pytest.mark.parametrize(("trouble", "kind"), [("stall", "idle_timeout"),
                                               ("error", "bad_gateway"),
                                               ("cut", "stream_cut")])
def test_a_broken_stream_is_retried_and_never_recorded_in_part(fake_factory, key_file,
                                                               tmp_path, trouble, kind):
    """Every prompt's first stream breaks part-way (a stall with no end, a mid-stream error
    event, a cut connection): each is asked again, recorded once, whole: the same record as
    the plain run's but for its attempts; the error kind is counted in the status."""
    fake = fake_factory(thinking="field", reasoning_tokens=120, stable_ids=True,
                        stream=StreamPlan(tokens_per_s=100, time_scale=100, seed=5,
                                          first_attempt=trouble, stall_s=None))
    n = 12
    ids, plain, streamed = two_runs(fake, key_file, tmp_path, n, *scaled(100), "--max-attempts",
                                    "3")
    assert records(plain, attempts=False) == records(streamed, attempts=False)
    done, failed = assert_exactly_once(ids, streamed)
    assert not failed
    log: dict[str, list[str]] = {}
    for r in fake.stats.stream_log:
        log.setdefault(r.prompt, []).append(r.outcome)
    # (the fake may draw the trouble's moment past a short answer's last chunk: that stream
    # completes; every other prompt's first stream broke; a stalled one the client closed
    # is "cancelled" once the fake has looked, every 0.25 s, "" until then)
    want_first = {"stall": ("cancelled", ""), "error": ("error",), "cut": ("cut",)}[trouble]
    broke = [r for r in done if log[derive_id(r["messages"])][0] in want_first
             and log[derive_id(r["messages"])][1:] == ["completed"]]
    whole = [r for r in done if log[derive_id(r["messages"])] == ["completed"]]
    assert len(broke) + len(whole) == n and len(broke) >= n - 2, log
    assert all(r["attempts"] == 2 for r in broke) and all(r["attempts"] == 1 for r in whole)
    st = status_of(streamed)
    assert st["errors_by_kind"] == {kind: len(broke)}, st["errors_by_kind"]
    assert st["retries"] == len(broke)


class RefusesStreaming:
    """A loopback OpenAI-compatible server that refuses the streaming fields (400, as
    OpenAI refuses an argument it does not know) and answers plain requests."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading

        self.streamed = self.plain = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                answer: dict[str, Any]
                if "stream_options" in body:
                    server.streamed += 1
                    status, answer = 400, {"error": {
                        "message": "Unrecognized request argument supplied: stream_options",
                        "type": "invalid_request_error", "code": None}}
                else:
                    server.plain += 1
                    status, answer = 200, {
                        "id": "x", "model": body["model"], "choices": [{
                            "index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "plain answer"}}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                  "total_tokens": 5}}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: object) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_server_that_refuses_streaming(key_file, tmp_path, mode):
    """`auto` stops streaming to it (said once) and every prompt is answered; `on` keeps
    asking: a permanent error on every prompt, which the systematic-error stop ends early."""
    server = RefusesStreaming()
    try:
        inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
        ids = write_prompts(inp, 30)
        proc = run_payload("generate", "--input", str(inp), "--output", str(out),
                           "--base-url", server.base, "--api-key-file", str(key_file),
                           "--no-preflight", "--concurrency", "4", "--stream", mode,
                           "--backoff-base", "0.02", "--status-every", "0.2")
    finally:
        server.close()
    if mode == "auto":
        assert proc.returncode == 0, proc.stderr[-2000:]
        done, failed = assert_exactly_once(ids, out)
        assert not failed and all(r["response"] == "plain answer" for r in done)
        assert proc.stderr.count("refused a streamed request") == 1
        assert server.streamed <= 4 and server.plain == 30
    else:
        assert proc.returncode == 3, proc.stderr[-2000:]
        assert "stream_options" in proc.stderr and server.plain == 0


def test_queue_comments_past_the_first_token_timeout_are_retried(fake_factory, key_file,
                                                                 tmp_path):
    """Queued streams send `: OPENROUTER PROCESSING` every 0.1 s, well inside the idle
    timeout, for a log-normal time (mean 1 s): the ones still queued at the 1.5 s
    first-token timeout are closed and asked again; every prompt is recorded once, whole."""
    fake = fake_factory(thinking="field", reasoning_tokens=20, stable_ids=True,
                        stream=StreamPlan(queue_s=1.0, queue_sigma=1.0, comment_every_s=0.1,
                                          tokens_per_s=1000, seed=11))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 40)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--first-token-timeout", "1.5",
                                 "--idle-timeout", "0.5", "--max-attempts", "10"), timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    done, failed = assert_exactly_once(ids, out)
    assert not failed
    # (not "completed": "cancelled", or "" where the fake has not yet seen the close)
    given_up = [r for r in fake.stats.stream_log if r.outcome != "completed"]
    assert given_up and all(r.tokens_billed == 0 and r.outcome in ("cancelled", "")
                            for r in given_up)  # closed while queued
    st = status_of(out)
    assert st["errors_by_kind"] == {"first_token_timeout": len(given_up)}, st["errors_by_kind"]
    assert sum(r["attempts"] for r in done) == 40 + len(given_up)


def test_a_stream_still_answering_is_no_stall(fake_factory, key_file, tmp_path):
    """The run's stall watch stops a run that answered only errors for --outage-timeout; a
    stream receiving its answer is alive: one at a time, each prompt's first stream ends in
    an error event, then its answer streams for 2 s, past a 1 s --outage-timeout."""
    fake = fake_factory(thinking="field", reasoning_tokens=2000, stable_ids=True,
                        stream=StreamPlan(tokens_per_s=1000, first_attempt="error", seed=2))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 2)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "1",
                                 "--outage-timeout", "1", "--idle-timeout", "0.5"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    done, failed = assert_exactly_once(ids, out)
    assert not failed and min(r["latency_s"] for r in done) > 1.5
    assert status_of(out)["errors_by_kind"] == {"bad_gateway": 2}


def test_slow_start_grows_on_first_tokens_not_on_whole_answers(fake_factory, key_file,
                                                               tmp_path):
    """Answers of ~4 s each, 200 prompts at --concurrency 200: the window grows on each
    stream's first data event (limiter.began), so all 200 are streaming long before the
    first answer ends; grown on whole answers only, 32 would stream until then."""
    import subprocess
    import time

    from tests.payload.helpers import payload_cmd, payload_env
    fake = fake_factory(thinking="field", reasoning_tokens=400,
                        stream=StreamPlan(tokens_per_s=10, time_scale=10, seed=3))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 200)
    proc = subprocess.Popen(payload_cmd(*gen_args(fake, key_file, inp, out, "--concurrency",
                                                  "200", *scaled(10))),
                            env=payload_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    most_before_an_end = 0
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if fake.stats.streams_completed == 0:
            most_before_an_end = max(most_before_an_end, fake.stats.streams_started)
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert most_before_an_end >= 190, most_before_an_end
    assert_exactly_once(ids, out)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_a_timeout_that_could_never_fire_is_refused(key_file, tmp_path, value):
    """nan and inf compare false to every deadline: refused at the command line (exit 2),
    before the input is read or anything is sent."""
    inp = tmp_path / "in.jsonl"
    write_prompts(inp, 1)
    for flag in ("--idle-timeout", "--first-token-timeout", "--request-timeout"):
        proc = run_payload("generate", "--input", str(inp), "--output", str(tmp_path / "o.jsonl"),
                           "--base-url", "http://127.0.0.1:9/api/v1", "--api-key-file",
                           str(key_file), flag, value)
        assert proc.returncode == 2 and f"argument {flag}: must be > 0" in proc.stderr, \
            proc.stderr
