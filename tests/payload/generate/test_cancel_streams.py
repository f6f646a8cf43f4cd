"""Cancellation stops the bill, observed at the fake (issue 33, "Done when"): streamed answers
long enough that only a stop ends them, and the fake's count of the completion tokens it
wrote ("billed") and when. Closing a stream aborts its connection; the fake sees it at its
next write (at most `write_every_s`, 0.02 s, apart) or within 0.25 s while it waits, and
bills nothing after that.

The bound every test states: nothing billed 0.5 s after the moment the payload closed the
streams, where a stream left open bills `tokens_per_s` (200 here) every second, each.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from handoff.testing.fakeapi import FakeOpenRouter
from handoff.testing.fakeapi.streams import StreamPlan
from payload.records import derive_id, errors_path
from tests.payload.helpers import (
    REPO,
    assert_exactly_once,
    gen_args,
    payload_cmd,
    payload_env,
    read_jsonl,
    run_payload,
    status_of,
    wait_for_status,
    write_prompts,
)

pytestmark = pytest.mark.timeout(180)

RATE = 200.0  # tokens per second per stream, at the fake
SLACK_S = 0.5  # the fake sees a closed connection within 0.25 s; the rest is a loaded machine


def _slow(fake_factory, **kwargs) -> FakeOpenRouter:
    return fake_factory(stream=StreamPlan(tokens_per_s=RATE, seed=1), **kwargs)


def _fast(fake: FakeOpenRouter) -> None:
    """The next run's answers: short and quick (only exactly-once is asked of it)."""
    fake.thinking, fake.completion_tokens = None, 32
    fake.streamer.plan = StreamPlan(tokens_per_s=100_000.0)


def _cancelled(fake: FakeOpenRouter) -> list:
    return [r for r in fake.stats.stream_log if r.outcome == "cancelled"]


def _wait_seen(fake: FakeOpenRouter, n: int, timeout: float = 5.0) -> None:
    """Until the fake has seen `n` streams closed by the client."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and fake.stats.streams_cancelled_by_client < n:
        time.sleep(0.05)


def _start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(payload_cmd(*args), cwd=REPO, env=payload_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("drain", [0.0, 1.0])
def test_sigterm_closes_the_streams_after_the_drain_and_the_bill_stops(fake_factory, key_file,
                                                                      tmp_path, drain):
    fake = _slow(fake_factory, completion_tokens=20_000)  # 100 s a stream: only a stop ends it
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 40)
    args = gen_args(fake, key_file, inp, out, "--stream", "on", "--concurrency", "20",
                    "--drain-timeout", f"{drain:g}")
    proc = _start(args)
    wait_for_status(out, lambda st: st.get("in_flight", 0) >= 20)
    deadline = time.monotonic() + 10
    while fake.stats.tokens_billed_after(time.monotonic() - 0.5) < 20 * RATE * 0.25:
        assert time.monotonic() < deadline, "the streams never got going"
        time.sleep(0.1)
    t_stop = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert time.monotonic() - t_stop < drain + 10
    _wait_seen(fake, 20)
    st = status_of(out)
    assert (st["state"], st["stop_reason"], st["done"], st["in_flight"]) == (
        "stopped", "signal", 0, 0)
    assert st["cancelled"] == 20 and "cancelled 20" in err.strip().splitlines()[-1]
    assert fake.stats.streams_cancelled_by_client == 20 and len(_cancelled(fake)) == 20
    # During the drain the streams went on (and were billed); after it, nothing was.
    closed_at = t_stop + drain
    assert fake.stats.tokens_billed_after(closed_at + SLACK_S) == 0
    assert all(r.ended is not None and r.ended <= closed_at + SLACK_S for r in _cancelled(fake))
    if drain:
        assert fake.stats.tokens_billed_after(t_stop + 0.1) > 0  # drained, not closed at once
    assert not read_jsonl(out) and not read_jsonl(errors_path(out))
    _fast(fake)
    again = run_payload(*args)
    assert again.returncode == 0, again.stderr
    done, failed = assert_exactly_once(ids, out)
    assert len(done) == 40 and not failed
    assert status_of(out)["cancelled"] == 20


def _lengths(fake: FakeOpenRouter, inp: Path) -> list[int]:
    """Each prompt's reasoning length at the fake (log-normal, fixed per prompt), in order."""
    import json
    return [fake._reasoning_length(json.loads(line)["messages"])
            for line in inp.read_text().splitlines()]


def test_budget_reached_closes_every_stream_at_once(fake_factory, key_file, tmp_path):
    # Thinking answers of log-normal length (mean 20000 tokens); the first 20 go out at once
    # (priced at nothing) and the first to end ($0.001) reaches the $0.0005 budget while the
    # 19 others stream on.
    fake = _slow(fake_factory, thinking="field", reasoning_tokens=20_000, reasoning_sigma=1.5,
                 cost_per_request=0.001)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 30)
    first = sorted(_lengths(fake, inp)[:20])
    assert first[1] - first[0] > 1.0 * RATE  # the second ends over 1 s after the first
    args = gen_args(fake, key_file, inp, out, "--stream", "on", "--concurrency", "20",
                    "--drain-timeout", "60", "--prices", "0,0,0.0000001",
                    "--max-cost", "0.0005")
    proc = run_payload(*args, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "the 19 requests in flight are closed" in proc.stderr
    _wait_seen(fake, 19)
    st = status_of(out)
    assert (st["stop_reason"], st["done"], st["cancelled"], st["in_flight"]) == (
        "budget", 1, 19, 0)
    completed = [r for r in fake.stats.stream_log if r.outcome == "completed"]
    assert len(completed) == 1 and len(_cancelled(fake)) == 19
    reached_at = completed[0].ended
    assert reached_at is not None
    # Closed at once: not one token more 0.5 s after the answer that reached the budget.
    assert fake.stats.tokens_billed_after(reached_at + SLACK_S) == 0
    assert all(r.ended is not None and r.ended <= reached_at + SLACK_S
               and r.tokens_billed < r.tokens_total for r in _cancelled(fake))
    _fast(fake)
    again = run_payload(*args[:-1], "1")
    assert again.returncode == 0, again.stderr
    done, _ = assert_exactly_once(ids, out)
    assert len(done) == 30 and status_of(out)["cancelled"] == 19


def test_402_closes_every_stream_at_once(fake_factory, key_file, tmp_path):
    # The key's credit fits four streams (charged when they start); the fifth request is
    # refused 402 while the four stream on (100 s each).
    fake = _slow(fake_factory, completion_tokens=20_000, cost_per_request=0.001,
                 credit_limit=0.0045)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 10)
    args = gen_args(fake, key_file, inp, out, "--stream", "on", "--concurrency", "5",
                    "--drain-timeout", "60")
    t0 = time.monotonic()
    proc = run_payload(*args, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert time.monotonic() - t0 < 20  # neither the 100 s streams nor the 60 s drain
    assert "out of credit or key limit reached" in proc.stderr
    _wait_seen(fake, 4)
    st = status_of(out)
    assert (st["stop_reason"], st["done"], st["cancelled"]) == ("credit", 0, 4)
    assert len(_cancelled(fake)) == 4
    last_start = max(r.started for r in fake.stats.stream_log)
    assert fake.stats.tokens_billed_after(last_start + 1.0 + SLACK_S) == 0
    fake.credit_limit = None
    _fast(fake)
    again = run_payload(*args)
    assert again.returncode == 0, again.stderr
    assert len(assert_exactly_once(ids, out)[0]) == 10


def test_kill_9_mid_stream_then_resume_answers_every_id_exactly_once(fake_factory, key_file,
                                                                    tmp_path):
    # Log-normal thinking answers at 400 tokens/s: some end within seconds, most stream on.
    fake = fake_factory(stream=StreamPlan(tokens_per_s=2 * RATE, seed=2), thinking="field",
                        reasoning_tokens=20_000, reasoning_sigma=1.5)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 60)
    args = gen_args(fake, key_file, inp, out, "--stream", "on", "--concurrency", "20")
    proc = _start(args)
    wait_for_status(out, lambda st: st.get("done", 0) >= 3 and st.get("in_flight", 0) >= 15)
    proc.kill()  # SIGKILL: no drain, no close, no final status; the kernel drops the sockets
    proc.communicate(timeout=30)
    t_kill = time.monotonic()
    _wait_seen(fake, 15)
    assert fake.stats.tokens_billed_after(t_kill + SLACK_S) == 0
    recorded = {str(r["id"]) for r in read_jsonl(out)}
    assert 3 <= len(recorded) < 60
    cut_off = {r.prompt for r in _cancelled(fake)}
    _fast(fake)
    again = run_payload(*args)
    assert again.returncode == 0, again.stderr
    done, failed = assert_exactly_once(ids, out)
    assert len(done) == 60 and not failed
    # Each stream the kill cut was asked again (a kill leaves no count: the status's
    # `cancelled` is only what a stop closed).
    asked = fake.stats.requests_by_prompt
    assert cut_off and all(asked[p] >= 2 for p in cut_off)
    assert all(asked[derive_id(r["messages"])] == 1 for r in done
               if str(r["id"]) in recorded)
