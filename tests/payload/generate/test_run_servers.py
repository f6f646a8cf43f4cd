"""`generate` against real-server trouble (docs/generator.md, "How requests are paced"
and "Error taxonomy"; issue 13): outages, systematic errors, capacity limits, throttling and answer shapes.

Each test runs the real payload as a subprocess against the project's fake OpenRouter over
real HTTP on loopback, in the mode that stands in for the trouble.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from handoff.testing.fakeapi import FaultPlan
from payload.records import derive_id, errors_path
from tests.payload.helpers import (
    REPO,
    assert_exactly_once,
    assert_paired,
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


def no_paid_twice(fake, done: list[dict], out=None) -> None:
    """No prompt's answer was paid for twice (no duplicate success at the server)."""
    twice = [r for r in done if fake.stats.successes_by_prompt[derive_id(r["messages"])] != 1]
    why = (status_of(out)["errors_by_kind"] if out is not None else None)  # timeouts? resets?
    assert all(fake.stats.successes_by_prompt[derive_id(r["messages"])] == 1 for r in done), (
        f"{len(twice)} paid twice, e.g. attempts {[r['attempts'] for r in twice[:5]]}; "
        f"errors by kind: {why}")


# -- outages -------------------------------------------------------------------------------------
@pytest.mark.serial  # peak concurrency >= 1500: run alone (scripts/test's serial pass)
@pytest.mark.parametrize("kind", ["503", "refuse"])
def test_outage_at_2000_in_flight_costs_no_id(fake_factory, key_file, tmp_path, kind):
    """Issue 13 case 1: the server fails as a whole mid-run with 2000 requests in flight (a
    503 storm, or the port closed: connection refused). The default 6 attempts with a fast
    backoff would fail every id within a second; the breaker pauses dispatch instead, and
    the run ends with every id done, exit 0. (8 s here; the 35 s of the issue is the
    opt-in test below: the breaker does not count time, so the length changes nothing.)"""
    import threading

    # 2 s answers: 2000 in flight is then 1000 requests a second, which a loaded 2-core CI
    # (client and fake on the same cores) still serves; at 0.8 s it needed 2500 a second, and
    # the peak stopped at ~1600 whatever the ramp.
    fake = fake_factory(latency_s=2.0, outage_kind=kind)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 10000)

    # The outage begins once slow start has opened the window wide, not at a fixed second: on
    # a loaded CI the ramp to 2000 took longer than 4.5 s, and the storm hit 1452 in flight.
    def outage_when_wide() -> None:
        deadline = time.monotonic() + 60
        while fake.stats.peak_concurrency < 1500 and time.monotonic() < deadline:
            time.sleep(0.02)
        fake.start_outage(8.0, kind)

    watcher = threading.Thread(target=outage_when_wide, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "2000"),
                       timeout=150)
    watcher.join(5)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.monotonic() - t0 > 8.0  # it really waited the outage out
    done, failed = assert_exactly_once(ids, out)
    assert not failed
    assert_paired(done)
    no_paid_twice(fake, done, out)
    assert fake.stats.peak_concurrency >= 1500  # slow start had opened the window wide
    assert fake.stats.outage_windows, "the outage never began"
    assert "dispatch paused, one probe at a time" in proc.stderr
    assert "outage over after" in proc.stderr
    st = status_of(out)
    assert (st["state"], st["exit_code"], st["failed"]) == ("finished", 0, 0)
    assert st["outages"] >= 1
    if kind == "503":
        # One storm of refusals when it starts, then one probe at a time: not a retry storm.
        assert fake.stats.outage_refusals < 2 * 2000 + 100


@pytest.mark.serial  # wall time < 20 s at 2000 in flight: run alone (scripts/test's serial pass)
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("HANDOFF_SLOW_TESTS"),
                    reason="a 35 s outage: set HANDOFF_SLOW_TESTS=1")
@pytest.mark.timeout(300)
def test_outage_of_35s_at_2000_in_flight_costs_no_id(fake_factory, key_file, tmp_path):
    """The issue's exact case: killed and back after 35 s, 2000 in flight, 0 failed, exit 0."""
    fake = fake_factory(latency_s=0.5, outage_at_s=3.5, outage_for_s=35.0,
                        outage_kind="refuse")
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 10000)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "2000"),
                       timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, failed = assert_exactly_once(ids, out)
    assert not failed


def test_outage_longer_than_the_timeout_stops_resumably(fake_factory, key_file, tmp_path):
    fake = fake_factory(latency_s=0.1, outage_at_s=0.5, outage_for_s=25.0)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 3000)
    args = gen_args(fake, key_file, inp, out, "--concurrency", "500", "--outage-timeout", "3")
    t0 = time.monotonic()
    proc = run_payload(*args, timeout=60)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 20
    assert "--outage-timeout 3s" in proc.stderr
    st = status_of(out)
    assert (st["state"], st["stop_reason"], st["exit_code"]) == ("stopped", "outage", 3)
    assert st["failed"] == 0 and not read_jsonl(errors_path(out))
    fake._outage_until = 0.0  # the server is back
    again = run_payload(*args, timeout=60)
    assert again.returncode == 0, again.stderr[-3000:]
    assert_exactly_once(ids, out)


def test_connection_refused_from_the_start_is_an_outage(key_file, tmp_path):
    """Nothing listens at all (a wrong port, a server not up yet): the run pauses and stops
    after --outage-timeout with exit 3, recording no id as failed."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 100)
    proc = run_payload("generate", "--input", str(inp), "--output", str(out), "--base-url",
                       f"http://127.0.0.1:{port}/api/v1", "--api-key-file", str(key_file),
                       "--backoff-base", "0.02", "--outage-timeout", "3", timeout=60)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert not read_jsonl(errors_path(out))
    assert status_of(out)["stop_reason"] == "outage"


# -- systematic errors ---------------------------------------------------------------------------
def test_every_answer_400_invalid_model_stops_early_quoting_the_server(fake_factory, key_file,
                                                                      tmp_path):
    """Issue 13 case 2: a wrong model name. At 2000 concurrency the run sends a few dozen
    requests (slow start), stops with exit 3 quoting the server's message, and records no
    id as failed, so the rerun after the fix does every id."""
    fake = fake_factory(known_models={"moonshotai/kimi-k2.5"})
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 2000)
    args = gen_args(fake, key_file, inp, out, "--concurrency", "2000")
    proc = run_payload(*args, "--model", "moonshotai/kimi-k2.6")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert fake.stats.requests <= 48
    assert "Invalid model name passed in model=moonshotai/kimi-k2.6" in proc.stderr
    assert "Nothing was recorded as failed" in proc.stderr
    assert not read_jsonl(errors_path(out)) and not read_jsonl(out)
    st = status_of(out)
    assert (st["state"], st["stop_reason"], st["failed"]) == ("stopped", "systematic_error", 0)
    assert "Invalid model name" in st["last_error"]
    again = run_payload(*args, "--model", "moonshotai/kimi-k2.5")
    assert again.returncode == 0, again.stderr[-2000:]
    done, failed = assert_exactly_once(ids, out)
    assert not failed and len(done) == 2000


def test_a_run_of_identical_errors_mid_run_stops(fake_factory, key_file, tmp_path):
    """The model is withdrawn mid-run: after a run of identical permanent errors the run
    stops (exit 3); none of them is recorded, every answer before is kept."""
    fake = fake_factory(latency_s=0.05)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 4000)
    args = gen_args(fake, key_file, inp, out, "--concurrency", "200")
    proc = subprocess.Popen(payload_cmd(*args), cwd=REPO, env=payload_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while fake.stats.successes < 500 and time.monotonic() < deadline:
        time.sleep(0.02)
    fake.known_models = {"someone/else"}
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err[-2000:]
    assert "a run of 64 answers were all the same error" in err
    assert not read_jsonl(errors_path(out))
    done = read_jsonl(out)
    assert len(done) == fake.stats.successes >= 500
    fake.known_models = None
    assert run_payload(*args).returncode == 0
    assert_exactly_once(ids, out)


def test_streaming_only_server_stops_early(fake_factory, key_file, tmp_path):
    """Issue 13 case 6: an SSE body to a plain request (--stream off) is the permanent
    `streaming_only`, systematic here: a few dozen requests, not every prompt six times."""
    fake = fake_factory(stream_only=True)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 1000)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "2000",
                                 "--stream", "off"))
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "streaming_only" in proc.stderr and "event stream" in proc.stderr
    assert fake.stats.requests <= 48
    assert not read_jsonl(errors_path(out))


def test_streaming_only_server_is_answered_when_streaming(fake_factory, key_file, tmp_path):
    """The same server with streaming on (the default): every prompt answered once."""
    fake = fake_factory(stream_only=True)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 50)
    proc = run_payload(*gen_args(fake, key_file, inp, out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, failed = assert_exactly_once(ids, out)
    assert not failed and fake.stats.streams_completed == 50 == fake.stats.requests


def test_different_permanent_errors_are_recorded_not_systematic(fake_factory, key_file,
                                                                tmp_path):
    """Per-prompt failures (each its own message) are written, as before."""
    fake = fake_factory(faults=FaultPlan(schedule={i: "400" if i % 2 else "422_detail"
                                                   for i in range(1, 7)}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 40)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "1",
                                 "--max-failed", "10"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, failed = assert_exactly_once(ids, out)
    assert len(failed) == 6
    # A FastAPI-style {"detail": [...]} error keeps its message (it used to read "None").
    assert {f["error"]["message"] for f in failed} == {"Invalid request parameters",
                                                       "field required"}


# -- max-failed ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("limit", "code"), [("1%", 1), ("5", 1), ("6", 0), ("10%", 0)])
def test_max_failed_count_or_share(fake_factory, key_file, tmp_path, limit, code):
    fake = fake_factory(faults=FaultPlan(schedule={i: "403" for i in range(2, 14, 2)}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 60)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "1",
                                 "--max-failed", limit))
    assert proc.returncode == code, proc.stderr[-2000:]
    st = status_of(out)
    assert (st["state"], st["failed"], st["exit_code"]) == ("finished", 6, code)
    if code:
        assert "6 of 60 ids failed" in proc.stderr


def test_max_failed_rejects_nonsense(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 3)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--max-failed", "lots"))
    assert proc.returncode == 2 and "a count (e.g. 50) or a percentage" in proc.stderr


# -- capacity and throttling ---------------------------------------------------------------------
@pytest.mark.serial  # few refusals: the pacing needs the CPU: run alone (scripts/test's serial pass)
@pytest.mark.parametrize("status", [429, 402])
def test_capacity_limit_exactly_once_with_few_refusals(fake_factory, key_file, tmp_path,
                                                       status):
    """Issue 12: a provider that serves K at once and refuses the rest (429, or 402 with
    Retry-After as OpenRouter's in-flight budget does). Every id exactly once, none paid
    twice, and the window finds K instead of hammering (CI bound; the benchmark measures)."""
    # 0.3 s answers: the feedback loop is several round trips long even when a loaded CPU
    # delays the client by a few hundred ms (at 0.1 s, refusals read a round trip late
    # let slow start overshoot to the full 1000: 3 runs in 18 failed the bound under load).
    fake = fake_factory(latency_s=0.3, capacity=60, capacity_status=status,
                        capacity_retry_after=0.5)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 2000)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "1000"),
                       timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    done, failed = assert_exactly_once(ids, out)
    assert not failed
    no_paid_twice(fake, done, out)
    assert fake.stats.capacity_refusals < 0.5 * 2000, fake.stats.capacity_refusals
    assert all(r["attempts"] >= 1 for r in done)


def test_kill9_and_resume_under_capacity_and_outage(fake_factory, key_file, tmp_path):
    """Exactly once survives SIGKILL mid-run while the server is capped and then down."""
    fake = fake_factory(latency_s=0.05, capacity=100, capacity_retry_after=0.3)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 3000)
    args = gen_args(fake, key_file, inp, out, "--concurrency", "500")
    for goal, outage in ((600, False), (1500, True)):
        proc = subprocess.Popen(payload_cmd(*args), cwd=REPO, env=payload_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= goal:
                break
            time.sleep(0.02)
        if outage:
            fake.start_outage(2.0, "reset")
            time.sleep(1.0)
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.kill()
        proc.wait()
    while time.monotonic() < fake._outage_until:  # the server is back before the final run
        time.sleep(0.05)
    final = run_payload(*args, timeout=120)
    assert final.returncode == 0, final.stderr[-2000:]
    done, failed = assert_exactly_once(ids, out)
    assert not failed
    assert_paired(done)


def test_sporadic_429_with_and_without_retry_after(fake_factory, key_file, tmp_path):
    """Throttled answers spend no attempt: with --max-attempts 2 and a 40% share of 429s
    (half with Retry-After, half without) every id still ends done."""
    fake = fake_factory(latency_s=0.02, faults=FaultPlan(
        rates={"429": 0.2, "429_bare": 0.2}, seed=5, retry_after_s=0.1), fast_faults=True)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 1500)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "200",
                                 "--max-attempts", "2"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    done, failed = assert_exactly_once(ids, out)
    assert not failed
    assert max(r["attempts"] for r in done) >= 3  # retried past --max-attempts: not charged
    assert status_of(out)["errors_by_kind"]["rate_limited"] == fake.stats.faults["429"] + \
        fake.stats.faults["429_bare"]


def test_retry_after_of_a_day_does_not_park_the_run(fake_factory, key_file, tmp_path):
    """Issue 13 case 7: `Retry-After: 86400` is honoured per request, capped (300 s: unit
    test), and only that prompt waits; the rest finish, and a stop does not wait for it."""
    fake = fake_factory(faults=FaultPlan(schedule={1: "429_huge"}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 50)
    args = gen_args(fake, key_file, inp, out, "--concurrency", "10")
    proc = subprocess.Popen(payload_cmd(*args), cwd=REPO, env=payload_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and fake.stats.successes < 49:
        time.sleep(0.05)
    assert fake.stats.successes == 49
    st = wait_for_status(out, lambda st: st.get("done") == 49)  # the next status tick
    assert (st["state"], st["done"], st["in_flight"]) == ("running", 49, 0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 3, err[-2000:]
    assert not read_jsonl(errors_path(out))  # the waiting id is still to do, not failed


def test_insufficient_quota_429_stops_like_402(fake_factory, key_file, tmp_path):
    fake = fake_factory(faults=FaultPlan(schedule={3: "429_quota"}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 100)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "1"))
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "out of credit or key limit" in proc.stderr and "insufficient_quota" in proc.stderr
    assert fake.stats.requests == 3
    assert status_of(out)["stop_reason"] == "credit"


def test_409_is_retried(fake_factory, key_file, tmp_path):
    fake = fake_factory(faults=FaultPlan(schedule={1: "409", 2: "409"}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 5)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "1"))
    assert proc.returncode == 0, proc.stderr
    done, failed = assert_exactly_once(ids, out)
    # Two 409s cost two more attempts (to one prompt or two: a backoff frees the slot).
    assert not failed and sum(r["attempts"] for r in done) == 7
    assert status_of(out)["errors_by_kind"] == {"conflict": 2}


# -- shapes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["error_null", "content_parts"])
def test_answer_shapes_of_other_servers_are_answers(fake_factory, key_file, tmp_path, shape):
    """Issue 13 cases 3 and 8: `"error": null` beside a valid choice, and content as a list
    of text parts (joined), are answers on the first attempt."""
    fake = fake_factory(**{shape: True})
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 30)
    proc = run_payload(*gen_args(fake, key_file, inp, out))
    assert proc.returncode == 0, proc.stderr
    done, failed = assert_exactly_once(ids, out)
    assert not failed and all(r["attempts"] == 1 for r in done)
    assert_paired(done)
    assert fake.stats.requests == 30


def test_provider_object_only_for_openrouter_or_when_given(fake_factory, key_file, tmp_path):
    """Issue 13 case 8: OpenAI's API rejects unknown fields. The default routing object goes
    to openrouter.ai only (unit test); an explicit --provider goes anywhere."""
    fake = fake_factory(record_bodies=True)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 3)
    assert run_payload(*gen_args(fake, key_file, inp, out)).returncode == 0
    assert all("provider" not in b for b in fake.stats.bodies)
    given = '{"only": ["deepinfra"]}'
    assert run_payload(*gen_args(fake, key_file, inp, tmp_path / "o2.jsonl", "--provider",
                                 given)).returncode == 0
    assert [b.get("provider") for b in fake.stats.bodies[3:]] == [json.loads(given)] * 3
