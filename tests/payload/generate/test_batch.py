"""`generate --mode batch|auto` against the fake OpenRouter's Batch API (a real HTTP server):
submit, partial errors, an expired batch, the budget, kill -9 mid-poll and in the window
between the provider's answer and the ledger, SIGTERM and `payload batches --cancel`
cancelling, auto mode on a server without the API, and records equal to a synchronous
run's for the same answers."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from handoff.testing.fakeapi import BatchPlan
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

FAST = ("--batch-poll", "0.05", "--batch-poll-max", "0.2")
TIMING = {"latency_s", "answered_at"}  # what may differ between two runs of the same answers


def batch_args(fake: Any, key_file: Path, inp: Path, out: Path, *extra: str) -> list[str]:
    return gen_args(fake, key_file, inp, out, "--mode", "batch", *FAST, *extra)


def ledger_of(out: Path) -> dict[str, Any]:
    return json.loads(out.with_name(out.name.replace(".jsonl", ".batches.json")).read_text())


def wait_until(ready: Any, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        assert proc.poll() is None, "the run ended before the point the test waits for"
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


def start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(payload_cmd(*args), cwd=REPO, env=payload_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def once_each(fake: Any, records: list[dict[str, Any]]) -> None:
    """The provider answered (and charged) each recorded prompt exactly once."""
    for r in records:
        assert fake.stats.successes_by_prompt[derive_id(r["messages"])] == 1, r["id"]


# -- the happy path, and the records ---------------------------------------------------------

@pytest.mark.parametrize("thinking", [None, "field"])
def test_batch_records_equal_the_synchronous_ones(fake_factory, key_file, tmp_path, thinking):
    """The same answers make the same records, field by field: only the timing differs, and
    the cost is the batch price (half)."""
    inp = tmp_path / "in.jsonl"
    with inp.open("w") as fh:
        for i in range(23):
            rec: dict[str, Any] = {"id": i if i % 2 else f"s{i}", "source": "seed",
                                   "messages": [{"role": "user", "content": f"q {i}"}]}
            if i % 5 == 0:  # ShareGPT, with the assistant turn that is regenerated
                rec = {"id": i, "conversations": [{"from": "human", "value": f"q {i}"},
                                                  {"from": "gpt", "value": "old"}]}
            fh.write(json.dumps(rec) + "\n")
    kw: dict[str, Any] = {"stable_ids": True, "thinking": thinking, "providers": ["A", "B"]}
    sync_fake, batch_fake = fake_factory(**kw), fake_factory(**kw)
    sync_out, batch_out = tmp_path / "sync.jsonl", tmp_path / "batch.jsonl"
    r = run_payload(*gen_args(sync_fake, key_file, inp, sync_out, "--max-tokens", "64"))
    assert r.returncode == 0, r.stderr
    r = run_payload(*batch_args(batch_fake, key_file, inp, batch_out, "--max-tokens", "64",
                                "--batch-requests", "7"))
    assert r.returncode == 0, r.stderr
    assert batch_fake.batches.stats.created == 4  # 23 requests, 7 a batch
    assert batch_fake.stats.requests == 0  # not one synchronous request
    sync = {str(x["id"]): x for x in read_jsonl(sync_out)}
    batch = {str(x["id"]): x for x in read_jsonl(batch_out)}
    assert sorted(sync) == sorted(batch) and len(sync) == 23
    for key, s in sync.items():
        b = batch[key]
        assert list(b) == list(s), key  # the same fields, in the same order
        assert b["usage"].pop("cost") == pytest.approx(s["usage"].pop("cost") / 2)
        for name in s:
            if name not in TIMING:
                assert b[name] == s[name], (key, name)
    assert_paired(list(batch.values()))
    assert all(x["attempts"] == 1 for x in batch.values())
    st = status_of(batch_out)
    assert (st["state"], st["done"], st["failed"], st["in_flight"]) == ("finished", 23, 0, 0)
    assert st["cost"] == pytest.approx(23 * 0.0001 / 2)
    assert st["batches"]["by_state"] == {"completed": 4} and st["batches"]["live"] == 0
    ledger = ledger_of(batch_out)
    assert [b["step"] for b in ledger["batches"]] == ["done"] * 4
    assert [b["requests"] for b in ledger["batches"]] == [7, 7, 7, 2]


def test_lines_carry_the_record_id_and_the_synchronous_body(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 5)
    r = run_payload(*batch_args(fake, key_file, inp, out, "--temperature", "1", "--seed", "3",
                                "--provider", '{"only": ["deepinfra"]}'))
    assert r.returncode == 0, r.stderr
    (uploaded,) = [f for f in fake.batches.files.values() if f.purpose == "batch"]
    lines = [json.loads(x) for x in uploaded.data.splitlines()]
    assert [x["custom_id"] for x in lines] == ids
    for x in lines:
        assert (x["method"], x["url"]) == ("POST", "/v1/chat/completions")
        body = x["body"]
        assert (body["temperature"], body["seed"], body["provider"]) == (
            1.0, 3, {"only": ["deepinfra"]})
        assert "stream" not in body and "return_token_ids" not in body
    (batch,) = fake.batches.batches.values()
    assert batch.metadata and batch.metadata["handoff"].endswith("-00000")
    assert uploaded.filename.startswith("handoff-") and uploaded.filename.endswith("-00000.jsonl")
    # The key is in no file the run left (ledger, ids, records, status), log or upload.
    key = key_file.read_text()
    assert key not in r.stderr + r.stdout and key.encode() not in uploaded.data
    for path in tmp_path.rglob("*"):
        if path.is_file() and path != key_file:
            assert key.encode() not in path.read_bytes(), path


def test_partial_errors_go_to_the_errors_file_retryable_ones_asked_again(
        fake_factory, key_file, tmp_path):
    fake = fake_factory(batches=BatchPlan(line_errors={"2": 400, "4": 503}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 8)
    r = run_payload(*batch_args(fake, key_file, inp, out, "--max-attempts", "3",
                                "--max-failed", "2"))
    assert r.returncode == 0, r.stderr
    done, failed = assert_exactly_once(ids, out)
    by_id = {str(f["id"]): f for f in failed}
    assert set(by_id) == {"2", "4"}
    assert by_id["2"]["error"] == {"status": 400, "type": "bad_request",
                                   "message": "Invalid request parameters"}
    assert by_id["2"]["attempts"] == 1
    # A 503 line is retryable: asked again in later batches, given up after --max-attempts.
    assert by_id["4"]["attempts"] == 3
    assert by_id["4"]["error"]["message"].startswith("gave up after 3 attempts")
    assert fake.batches.stats.created == 3
    once_each(fake, done)
    st = status_of(out)
    assert (st["done"], st["failed"]) == (6, 2)
    assert st["errors_by_kind"] == {"bad_request": 1, "unavailable": 3}


def test_an_expired_batch_has_its_unfinished_lines_asked_again(fake_factory, key_file,
                                                               tmp_path):
    fake = fake_factory(batches=BatchPlan(expire={1: 3}))  # the first batch answers 3, expires
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 10)
    r = run_payload(*batch_args(fake, key_file, inp, out))
    assert r.returncode == 0, r.stderr
    assert "expired: 3 answered, 0 errors, 3 recorded, 7 asked again later" in r.stderr
    done, failed = assert_exactly_once(ids, out)
    assert not failed
    once_each(fake, done)
    first, second = fake.batches.batches.values()
    assert (first.status, second.status) == ("expired", "completed")
    assert second.counts["total"] == 7
    assert all(x["attempts"] == (2 if int(x["id"]) >= 3 else 1) for x in done)
    assert [b["status"] for b in ledger_of(out)["batches"]] == ["expired", "completed"]


def test_a_request_larger_than_a_batch_is_a_permanent_failure(fake_factory, key_file,
                                                              tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    with inp.open("w") as fh:
        for i in range(4):
            fh.write(json.dumps({"id": i, "prompt": "x" * (5000 if i == 1 else 10)}) + "\n")
    r = run_payload(*batch_args(fake, key_file, inp, out, "--batch-bytes", "1000",
                                "--batch-requests", "2", "--max-failed", "1"))
    assert r.returncode == 0, r.stderr
    _, failed = assert_exactly_once(["0", "1", "2", "3"], out)
    assert [f["error"]["type"] for f in failed] == ["request_too_large"]
    assert fake.batches.stats.created == 2  # 0 and 2 together, then 3


# -- the budget -------------------------------------------------------------------------------

def test_budget_is_checked_before_submitting_at_the_batch_price(fake_factory, key_file,
                                                                tmp_path):
    """Each request is expected at half the endpoint's $0.0001: a $0.0003 budget submits one
    batch of 6 (not 3), records their cost from the results, and stops there (exit 3)."""
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 12)
    r = run_payload(*batch_args(fake, key_file, inp, out, "--max-cost", "0.0003"))
    assert r.returncode == 3, r.stderr
    assert "budget $0.0003 reached" in r.stderr
    assert fake.batches.stats.created == 1
    (batch,) = fake.batches.batches.values()
    assert batch.counts["total"] == 6
    st = status_of(out)
    assert (st["state"], st["stop_reason"], st["done"]) == ("stopped", "budget", 6)
    assert st["cost"] == pytest.approx(0.0003)
    # Raising the budget goes on from there; nothing is asked twice.
    r = run_payload(*batch_args(fake, key_file, inp, out, "--max-cost", "1"))
    assert r.returncode == 0, r.stderr
    once_each(fake, read_jsonl(out))
    assert len(read_jsonl(out)) == 12


def test_a_budget_that_fits_no_request_submits_nothing(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 5)
    r = run_payload(*batch_args(fake, key_file, inp, out, "--max-cost", "0.00001"))
    assert r.returncode == 3, r.stderr
    assert "budget $1e-05 reached" in r.stderr
    assert (fake.batches.stats.uploads, fake.batches.stats.created) == (0, 0)
    assert status_of(out)["stop_reason"] == "budget"


def test_out_of_credit_waits_for_the_live_batches_then_stops_resumable(fake_factory,
                                                                     key_file, tmp_path):
    """A 402 on submitting: nothing more is submitted, the batches already at the provider
    are waited for and recorded, exit 3; once credit is back the rest goes, once each."""
    fake = fake_factory(batches=BatchPlan(run_s=0.3, refuse_status=402, refuse_after=1))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 12)
    args = batch_args(fake, key_file, inp, out, "--batch-requests", "5")
    r = run_payload(*args)
    assert r.returncode == 3, r.stderr
    assert "out of credit or key limit reached" in r.stderr
    assert fake.batches.stats.created == 1
    assert len(read_jsonl(out)) == 5  # the batch at the provider was waited for, recorded
    st = status_of(out)
    assert (st["state"], st["stop_reason"], st["batches"]["live"]) == ("stopped", "credit", 0)
    assert st["batches"]["unsent"] == 1 and st["batches"]["by_state"]["uploaded"] == 1
    fake.batches.plan.refuse_status = None
    r = run_payload(*args)
    assert r.returncode == 0, r.stderr
    done, _ = assert_exactly_once(ids, out)
    once_each(fake, done)


def test_auto_falls_back_when_the_provider_refuses_the_batch(fake_factory, key_file, tmp_path):
    fake = fake_factory(batches=BatchPlan(refuse_status=400))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 5)
    r = run_payload(*gen_args(fake, key_file, inp, out, "--mode", "auto", *FAST))
    assert r.returncode == 0, r.stderr
    assert "the provider refused the batch" in r.stderr and "synchronously" in r.stderr
    assert_exactly_once(ids, out)
    assert fake.stats.requests == 5
    # --mode batch stops instead, quoting the provider (the prompts are not recorded failed).
    out2 = tmp_path / "b.jsonl"
    r = run_payload(*batch_args(fake, key_file, inp, out2))
    assert r.returncode == 3 and "refused a batch call" in r.stderr
    assert not read_jsonl(out2) and not read_jsonl(errors_path(out2))
    assert ledger_of(out2)["batches"][0]["step"] == "done"  # abandoned: asked again next time


# -- kill -9, resume, never twice -------------------------------------------------------------

def test_kill9_mid_poll_then_resume_reattaches_never_resubmits(fake_factory, key_file,
                                                               tmp_path):
    fake = fake_factory(batches=BatchPlan(run_s=1.5))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 20)
    args = batch_args(fake, key_file, inp, out, "--batch-requests", "6")
    proc = start(args)
    wait_until(lambda: fake.batches.stats.created == 4 and fake.batches.stats.polls >= 4, proc)
    proc.kill()  # SIGKILL while polling
    proc.wait()
    ledger = ledger_of(out)
    assert [b["step"] for b in ledger["batches"]] == ["submitted"] * 4
    assert not read_jsonl(out)
    r = run_payload(*args)
    assert r.returncode == 0, r.stderr
    assert "re-attaching to 4 live batch(es)" in r.stderr
    done, _ = assert_exactly_once(ids, out)
    assert fake.batches.stats.created == 4
    assert set(fake.batches.stats.submissions_by_file.values()) == {1}
    once_each(fake, done)
    assert status_of(out)["done"] == 20


def test_kill9_after_the_provider_made_the_batch_before_the_ledger_knew(fake_factory,
                                                                       key_file, tmp_path):
    """The crash window: the provider holds the batch, its answer never reached the ledger
    (the run was killed while POST /batches was answering). The next run finds it by its
    input file and re-attaches: the fake saw one submission of those requests, not two."""
    fake = fake_factory(batches=BatchPlan(create_delay_s=30))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 9)
    args = batch_args(fake, key_file, inp, out)
    proc = start(args)
    wait_until(lambda: fake.batches.stats.created == 1, proc)
    proc.kill()
    proc.wait()
    (entry,) = ledger_of(out)["batches"]
    assert entry["step"] == "uploaded" and entry["batch_id"] is None and entry["file_id"]
    fake.batches.plan.create_delay_s = 0
    r = run_payload(*args)
    assert r.returncode == 0, r.stderr
    assert "found batch_" in r.stderr and "not submitted again" in r.stderr
    done, _ = assert_exactly_once(ids, out)
    assert fake.batches.stats.created == 1
    assert fake.batches.stats.submissions_by_file == {entry["file_id"]: 1}
    assert fake.batches.stats.uploads == 1
    once_each(fake, done)


def test_kill9_before_the_upload_is_known_finds_the_file(fake_factory, key_file, tmp_path):
    """A prepared entry (the kill came before the ledger learnt the file's id) looks for its
    upload by name first; the batch is still submitted exactly once."""
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 4)
    args = batch_args(fake, key_file, inp, out)
    r = run_payload(*args)
    assert r.returncode == 0
    # Make the ledger look like the kill came right after POST /files answered.
    path = out.with_name("out.batches.json")
    ledger = ledger_of(out)
    ledger["batches"][0].update(step="prepared", file_id=None, batch_id=None, status=None)
    path.write_text(json.dumps(ledger))
    for p in (out, errors_path(out)):
        p.write_text("")
    fake.batches.batches.clear()  # the provider never got the batch (only the file)
    r = run_payload(*args)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(ids, out)
    assert fake.batches.stats.uploads == 1  # found by name, not uploaded again
    assert fake.batches.stats.file_lists >= 1


# -- stopping ---------------------------------------------------------------------------------

def test_sigterm_cancels_the_live_batches_and_records_what_they_answered(fake_factory,
                                                                        key_file, tmp_path):
    fake = fake_factory(batches=BatchPlan(run_s=0, line_s=0.5))  # 10 s a batch
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 40)
    args = batch_args(fake, key_file, inp, out, "--batch-requests", "20")
    proc = start(args)
    wait_until(lambda: sum(b.counts["completed"] for b in fake.batches.batches.values()) >= 6,
               proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err.decode()[-2000:]
    assert fake.batches.stats.cancels == 2
    assert {b.status for b in fake.batches.batches.values()} == {"cancelled"}
    answered = sum(b.counts["completed"] for b in fake.batches.batches.values())
    assert 6 <= answered < 40
    assert len(read_jsonl(out)) == answered  # everything they answered is recorded
    st = status_of(out)
    assert (st["state"], st["stop_reason"]) == ("stopped", "signal")
    assert st["batches"]["by_state"] == {"cancelled": 2} and st["batches"]["live"] == 0
    # A relaunch asks the rest, once.
    fake.batches.plan.line_s = 0
    r = run_payload(*args)
    assert r.returncode == 0, r.stderr
    done, _ = assert_exactly_once(ids, out)
    once_each(fake, done)


def test_payload_batches_cancel_after_a_kill(fake_factory, key_file, tmp_path):
    """What `fab stop` runs for a job whose process is gone: the live batches are cancelled;
    the next run records what they answered and asks the rest."""
    fake = fake_factory(batches=BatchPlan(run_s=0, line_s=0.5))  # 7.5 s a batch
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 30)
    args = batch_args(fake, key_file, inp, out, "--batch-requests", "15")
    proc = start(args)
    wait_until(lambda: fake.batches.stats.created == 2 and fake.batches.stats.polls >= 2, proc)
    proc.kill()
    proc.wait()
    # A synchronous run now would ask the live batches' prompts again: refused.
    r = run_payload(*gen_args(fake, key_file, inp, out))
    assert r.returncode == 2 and "may still be live at the provider" in r.stderr
    cancel = ["batches", "--batches-file", str(out.with_name("out.batches.json")),
              "--base-url", fake.base_url, "--api-key-file", str(key_file)]
    r = run_payload(*cancel, "--cancel", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["cancelled"] == 2 and summary["batches"] == 2
    assert fake.batches.stats.cancels == 2
    r = run_payload(*cancel, "--cancel", "--json")  # again: nothing left to cancel
    assert json.loads(r.stdout)["cancelled"] == 0 and fake.batches.stats.cancels == 2
    fake.batches.plan.line_s = 0
    r = run_payload(*args)
    assert r.returncode == 0, r.stderr
    assert "was cancelled" in r.stderr
    done, _ = assert_exactly_once(ids, out)
    once_each(fake, done)


def test_a_second_run_on_the_same_batches_is_refused(fake_factory, key_file, tmp_path):
    fake = fake_factory(batches=BatchPlan(run_s=5))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 3)
    args = batch_args(fake, key_file, inp, out)
    proc = start(args)
    try:
        wait_until(lambda: fake.batches.stats.created == 1, proc)
        r = run_payload(*args)
        assert r.returncode == 2 and "another process holds the batches" in r.stderr
    finally:
        proc.kill()
        proc.wait()


# -- modes ------------------------------------------------------------------------------------

def test_auto_on_a_server_without_a_batch_api_runs_synchronously(fake_factory, key_file,
                                                                 tmp_path):
    fake = fake_factory(batches=BatchPlan(enabled=False))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 6)
    r = run_payload(*gen_args(fake, key_file, inp, out, "--mode", "auto", *FAST))
    assert r.returncode == 0, r.stderr
    assert "has no usable Batch API (GET /batches: 404" in r.stderr
    assert "running synchronously" in r.stderr
    assert_exactly_once(ids, out)
    assert fake.stats.requests == 6 and fake.batches.stats.created == 0
    # --mode batch there is a usage error that names the way out.
    r = run_payload(*batch_args(fake, key_file, inp, tmp_path / "b.jsonl"))
    assert r.returncode == 2 and "--mode batch" in r.stderr and "use --mode sync" in r.stderr


def test_auto_batches_where_the_server_has_the_api(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 6)
    r = run_payload(*gen_args(fake, key_file, inp, out, "--mode", "auto", *FAST))
    assert r.returncode == 0, r.stderr
    assert_exactly_once(ids, out)
    assert fake.stats.requests == 0 and fake.batches.stats.created == 1


def test_a_batch_that_fails_validation(fake_factory, key_file, tmp_path):
    """batch mode stops (exit 3) quoting the provider; auto mode runs synchronously."""
    fake = fake_factory(batches=BatchPlan(fail_message="model does not support batch"))
    inp = tmp_path / "in.jsonl"
    ids = write_prompts(inp, 4)
    out = tmp_path / "b.jsonl"
    r = run_payload(*batch_args(fake, key_file, inp, out))
    assert r.returncode == 3 and "model does not support batch" in r.stderr
    assert not read_jsonl(out) and not read_jsonl(errors_path(out))
    assert status_of(out)["stop_reason"] == "batch_failed"
    out = tmp_path / "a.jsonl"
    r = run_payload(*gen_args(fake, key_file, inp, out, "--mode", "auto", *FAST))
    assert r.returncode == 0, r.stderr
    assert "running the rest synchronously" in r.stderr
    assert_exactly_once(ids, out)


def test_turns_all_cannot_batch(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 2)
    r = run_payload(*batch_args(fake, key_file, inp, out, "--turns", "all"))
    assert r.returncode == 2 and "cannot regenerate --turns all" in r.stderr
    r = run_payload(*gen_args(fake, key_file, inp, out, "--mode", "auto", "--turns", "all"))
    assert r.returncode == 0 and "running synchronously" in r.stderr
    assert fake.batches.stats.created == 0


def test_mode_is_not_taken_for_model(fake_factory, key_file, tmp_path):
    """argparse's prefix matching took `--mode batch` for `--model batch` (issue 35)."""
    fake = fake_factory(known_models={"moonshotai/kimi-k2.5"})
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 2)
    r = run_payload(*gen_args(fake, key_file, inp, out, "--mod", "batch"))
    assert r.returncode == 2 and "unrecognized arguments: --mod" in r.stderr
    r = run_payload(*gen_args(fake, key_file, inp, out, "--mode", "batch", *FAST))
    assert r.returncode == 0, r.stderr
    assert {x["model"] for x in read_jsonl(out)} == {"moonshotai/kimi-k2.5"}
