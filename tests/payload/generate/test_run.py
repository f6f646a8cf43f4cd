"""`python -m payload generate` end to end: a real subprocess against the fake OpenRouter.

Each test states the contract it proves (docs/generator.md, docs/records.md; issue 2)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest

from handoff.testing.fakeapi import RETRYABLE_FAULTS, FaultPlan
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
    write_prompts,
)

pytestmark = pytest.mark.timeout(120)


def test_answers_every_prompt_once_paired_and_reports_bad_lines(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 300, extra_lines={10: "{not json", 200: '{"id": 5000}'})
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "50"))
    assert proc.returncode == 0, proc.stderr
    # Bad lines: reported with their line numbers (11 and 202 in the file), then skipped.
    assert "line 11: bad record skipped" in proc.stderr
    assert "line 202: bad record skipped" in proc.stderr
    done, failed = assert_exactly_once(ids, out)
    assert not failed
    assert_paired(done)
    # No prompt was paid for twice.
    assert all(fake.stats.successes_by_prompt[derive_id(r["messages"])] == 1 for r in done)
    r = done[0]
    assert list(r)[:2] == ["id", "usage"]
    assert isinstance(r["id"], int)  # an id keeps its JSON type
    assert r["usage"]["cost"] == pytest.approx(0.0001)
    assert {"response", "reasoning", "finish_reason", "provider", "model", "latency_s",
            "attempts", "messages"} <= set(r)
    st = status_of(out)
    assert st["state"] == "finished"
    assert (st["done"], st["failed"], st["total"], st["bad_lines"]) == (300, 0, 300, 2)
    assert st["cost"] == pytest.approx(300 * 0.0001)
    assert fake.stats.peak_concurrency <= 50


def test_exactly_once_under_fault_mix_and_repeated_kill9(fake_factory, key_file, tmp_path):
    """30% of requests fail (every retryable kind, plus hangs and permanent 400s); the client
    is killed with SIGKILL four times mid-run; resumes still end with each id exactly once."""
    rates = {k: 0.25 / len(RETRYABLE_FAULTS) for k in RETRYABLE_FAULTS}
    rates.update({"hang": 0.01, "400": 0.04})
    fake = fake_factory(faults=FaultPlan(rates=rates, seed=7, retry_after_s=0.05, hang_s=30),
                        latency_s=0.01)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 1500)
    # Hangs time out: asked again as often as any retryable error here (the default
    # --max-timeouts 1 would fail a prompt hung twice; that rule has its own test).
    args = gen_args(fake, key_file, inp, out, "--concurrency", "100", "--request-timeout", "1",
                    "--max-attempts", "30", "--max-failed", "10%", "--max-timeouts", "30")
    rng = random.Random(3)
    for round_no in range(1, 5):
        proc = subprocess.Popen(payload_cmd(*args), cwd=REPO, env=payload_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Kill mid-run: once this round has written more answers (at a jittered point).
        goal = round_no * 250 + rng.randint(0, 100)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= goal:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.kill()  # SIGKILL: no cleanup at all
        proc.wait()
    kills_left_partial = len(read_jsonl(out)) < 1500
    final = run_payload(*args, timeout=100)
    assert final.returncode == 0, final.stderr[-2000:]
    done, failed = assert_exactly_once(ids, out)
    assert kills_left_partial
    assert_paired(done)
    assert failed and all(f["error"]["status"] == 400 and f["attempts"] >= 1 for f in failed)
    # Every recorded answer really came from the API (a kill between answer and write may
    # make a prompt be asked twice; the files still hold it once).
    assert all(fake.stats.successes_by_prompt[derive_id(r["messages"])] >= 1 for r in done)
    st = status_of(out)
    assert (st["state"], st["done"], st["failed"]) == ("finished", len(done), len(failed))


def test_401_stops_at_once_exit_3_and_resumes(fake_factory, key_file, tmp_path):
    fake = fake_factory(api_key="sk-or-v1-" + "0" * 64)  # accepts a different key
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 500)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "20"))
    assert proc.returncode == 3
    assert "API key was refused" in proc.stderr
    assert fake.stats.requests <= 20  # no retry storm: at most one wave in flight
    st = status_of(out)
    assert st["state"] == "stopped" and "refused" in st["last_error"]
    fake.api_key = key_file.read_text()
    again = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "20"))
    assert again.returncode == 0, again.stderr
    assert_exactly_once(ids, out)


def test_402_key_limit_drains_and_is_resumable(fake_factory, key_file, tmp_path):
    fake = fake_factory(cost_per_request=0.001, credit_limit=0.0505)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 200)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "10"))
    assert proc.returncode == 3, proc.stderr
    assert "out of credit or key limit" in proc.stderr
    done = read_jsonl(out)
    # Every answer the API gave (and charged) was written; nothing was recorded as failed.
    assert len(done) == fake.stats.successes == 50
    assert not read_jsonl(errors_path(out))
    st = status_of(out)
    assert (st["state"], st["done"]) == ("stopped", 50)
    fake.credit_limit = None
    again = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "10"))
    assert again.returncode == 0, again.stderr
    assert_exactly_once(ids, out)
    st = status_of(out)  # cumulative across the resumed run
    assert (st["done"], st["cost"]) == (200, pytest.approx(0.2))


def test_402_with_retry_after_is_a_backoff_not_a_stop(fake_factory, key_file, tmp_path):
    fake = fake_factory(faults=FaultPlan(schedule={i: "402_inflight" for i in range(1, 40)},
                                         retry_after_s=0.1))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 100)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "20"))
    assert proc.returncode == 0, proc.stderr
    assert fake.stats.faults["402_inflight"] == 39
    assert_exactly_once(ids, out)
    assert status_of(out)["errors_by_kind"]["inflight_limited"] == 39


def test_budget_stops_at_the_expected_cost_exit_3_then_resumes(fake_factory, key_file,
                                                               tmp_path):
    # The fake's endpoint list prices a request at $0.001, and every answer costs that: the
    # expectation is exact, so the run stops with no overshoot at all.
    fake = fake_factory(cost_per_request=0.001)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 100)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "30",
                                 "--max-cost", "0.0205"))
    assert proc.returncode == 3, proc.stderr
    assert "budget $0.0205 reached" in proc.stderr
    assert fake.stats.total_cost <= 0.0205
    assert fake.stats.requests == 20
    st = status_of(out)
    assert (st["state"], st["done"]) == ("stopped", 20)
    again = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "30",
                                  "--max-cost", "1"))
    assert again.returncode == 0, again.stderr
    assert_exactly_once(ids, out)
    assert status_of(out)["cost"] == pytest.approx(0.1)


def test_budget_without_known_prices_uses_the_conservative_default(fake_factory, key_file,
                                                                  tmp_path):
    fake = fake_factory(cost_per_request=0.001, serve_endpoints=False)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 50)
    # Default bound: $40/M completion tokens x 100 max_tokens + $10/M per prompt char ~ $0.0053.
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--max-cost", "0.02",
                                 "--max-tokens", "100"))
    assert proc.returncode == 3
    assert "endpoint list not served" in proc.stderr
    assert 0 < fake.stats.total_cost <= 0.02


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_drains_in_flight_stops_and_resumes(fake_factory, key_file, tmp_path, sig):
    fake = fake_factory(latency_s=0.5)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 400)
    args = gen_args(fake, key_file, inp, out, "--concurrency", "40")
    proc = subprocess.Popen(payload_cmd(*args), cwd=REPO, env=payload_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    status = out.with_name("out.status.json")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until some answers are written (slow CI starts)
        time.sleep(0.2)
        if status.exists() and json.loads(status.read_text() or "{}").get("done", 0) >= 40:
            break
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    assert f"{sig.name}: stopping" in err
    done = read_jsonl(out)
    st = status_of(out)
    assert st["state"] == "stopped" and st["in_flight"] == 0
    assert 0 < len(done) < 400
    # In-flight requests were drained and written: everything the API answered is on disk.
    assert len(done) == fake.stats.successes == st["done"]
    again = run_payload(*args)
    assert again.returncode == 0, again.stderr
    assert_exactly_once(ids, out)


def test_permanent_errors_recorded_and_retry_failed(fake_factory, key_file, tmp_path):
    fake = fake_factory(faults=FaultPlan(schedule={1: "400", 2: "403", 3: "404"}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 30)
    args = gen_args(fake, key_file, inp, out, "--concurrency", "1")
    proc = run_payload(*args)
    # 3 of 30 failed: more than the default --max-failed 1%, so the run says so (exit 1).
    assert proc.returncode == 1, proc.stderr
    assert "3 of 30 ids failed, more than --max-failed 1%" in proc.stderr
    assert "--retry-failed" in proc.stderr
    st = status_of(out)
    assert (st["state"], st["exit_code"], st["failed"], st["max_failed"]) == (
        "finished", 1, 3, 0)
    _, failed = assert_exactly_once(ids, out)
    assert sorted((f["error"]["status"], f["error"]["type"]) for f in failed) == [
        (400, "bad_request"), (403, "forbidden"), (404, "not_found")]
    assert all(f["attempts"] == 1 and f["error"]["message"] for f in failed)
    assert list(failed[0]) == ["id", "error", "attempts", "answered_at"]
    assert all(abs(f["answered_at"] - time.time()) < 600 for f in failed)
    # Rerun without --retry-failed: nothing to do (a count of 3 failures is allowed: exit 0).
    # With it: the three are asked again.
    requests = fake.stats.requests
    assert run_payload(*args, "--max-failed", "3").returncode == 0
    assert fake.stats.requests == requests
    again = run_payload(*args, "--retry-failed")
    assert again.returncode == 0, again.stderr
    done, failed = assert_exactly_once(ids, out)
    assert not failed and len(done) == 30
    assert status_of(out)["failed"] == 0


def test_retryable_errors_give_up_after_max_attempts(fake_factory, key_file, tmp_path):
    fake = fake_factory(faults=FaultPlan(rates={"502": 1.0}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 3)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--max-attempts", "3"))
    assert proc.returncode == 1, proc.stderr  # every id failed: more than --max-failed
    _, failed = assert_exactly_once(ids, out)
    assert fake.stats.requests == 9  # 9 failures in all: too few to be an outage
    assert all(f["attempts"] == 3 and "gave up after 3 attempts" in f["error"]["message"]
               and f["error"]["status"] == 502 for f in failed)


def test_torn_last_line_is_truncated_before_appending(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 20)
    assert run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "5")).returncode == 0
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:10]) + lines[10][:25])  # a write cut by kill -9
    proc = run_payload(*gen_args(fake, key_file, inp, out))
    assert proc.returncode == 0, proc.stderr
    assert "torn last line" in proc.stderr
    assert_exactly_once(ids, out)


def test_shard_union_equals_input(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    inp = tmp_path / "in.jsonl"
    ids = write_prompts(inp, 300)
    got: list[str] = []
    for i in range(3):
        out = tmp_path / f"out{i}.jsonl"
        proc = run_payload(*gen_args(fake, key_file, inp, out, "--shard", f"{i}/3"))
        assert proc.returncode == 0, proc.stderr
        part = [str(r["id"]) for r in read_jsonl(out)]
        assert 50 < len(part) < 150  # a real split, not one shard taking all
        assert status_of(out)["total"] == len(part)
        got += part
    assert sorted(got) == sorted(ids) and len(got) == len(set(got))


def test_bad_usage_exits_2(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    out = tmp_path / "out.jsonl"
    missing = run_payload(*gen_args(fake, key_file, tmp_path / "nope.jsonl", out))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    proc = run_payload(*gen_args(fake, key_file, empty, out))
    assert proc.returncode == 2 and "is empty" in proc.stderr
    inp = tmp_path / "in.jsonl"
    write_prompts(inp, 3)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_payload(*gen_args(fake, key_file, inp, blocker / "out.jsonl"))
    assert proc.returncode == 2 and "cannot write" in proc.stderr
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--shard", "3/3"))
    assert proc.returncode == 2 and "0-based" in proc.stderr
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--provider", "[1]"))
    assert proc.returncode == 2 and "JSON object" in proc.stderr
    assert fake.stats.requests == 0


def test_preflight_refuses_a_filter_that_leaves_no_endpoint(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 5)
    flt = '{"quantizations": ["fp16"], "ignore": ["fireworks"]}'
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--provider", flt))
    assert proc.returncode == 2
    assert "leaves no endpoint" in proc.stderr and '"fp16"' in proc.stderr
    assert fake.stats.endpoint_calls == 1 and fake.stats.requests == 0
    # The default filter (int4, not fireworks/baseten) leaves DeepInfra and Together.
    assert run_payload(*gen_args(fake, key_file, inp, out)).returncode == 0


def test_preflight_skipped_where_the_list_is_not_served(fake_factory, key_file, tmp_path):
    fake = fake_factory(serve_endpoints=False)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 5)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--provider",
                                 '{"only": ["nobody"]}'))
    assert proc.returncode == 0, proc.stderr
    assert "check skipped" in proc.stderr


def test_concurrency_fits_the_open_file_limit(fake_factory, key_file, tmp_path):
    """With `ulimit -n 512` a 2000-connection run lowers its concurrency and says so, instead
    of failing connects with EMFILE."""
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))

    fake = fake_factory(latency_s=0.05)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 1500)
    proc = subprocess.run(payload_cmd(*gen_args(fake, key_file, inp, out)), cwd=REPO,
                          env=payload_env(), text=True, capture_output=True, timeout=90,
                          preexec_fn=low_limit)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--concurrency lowered from 2000" in proc.stderr
    _, failed = assert_exactly_once(ids, out)
    assert not failed and fake.stats.peak_concurrency <= 256
