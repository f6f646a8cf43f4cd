"""`generate` against a thinking model (docs/generator.md, "Thinking answers and turns"; issue 20): cut
answers are done, not re-billed; reasoning lands in its field; provenance and the status
breakdown; timeouts asked again at most --max-timeouts; input fields carried as `meta`.

Real subprocess runs against the fake OpenRouter in its thinking modes.
"""

from __future__ import annotations

import json

import pytest

from handoff.testing.fakeapi import FaultPlan
from payload.records import derive_id, errors_path
from tests.payload.helpers import (
    assert_exactly_once,
    assert_paired,
    gen_args,
    read_jsonl,
    run_payload,
    status_of,
    write_prompts,
)

pytestmark = pytest.mark.timeout(120)


def asked_once_each(fake, done: list[dict]) -> None:
    """Every prompt was sent exactly once (requests counted by the fake, answered or not)."""
    assert all(fake.stats.requests_by_prompt[derive_id(r["messages"])] == 1 for r in done)
    assert fake.stats.requests == len(done)


def test_an_answer_cut_with_empty_content_is_requested_once(fake_factory, key_file, tmp_path):
    """48 reasoning tokens, --max-tokens 16: every answer is all reasoning, cut, with empty
    content. It used to be retried (and billed) up to 6 times as `empty_content`."""
    fake = fake_factory(thinking="field", reasoning_tokens=48)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 40)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--max-tokens", "16"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    done, failed = assert_exactly_once(ids, out)
    assert not failed
    asked_once_each(fake, done)
    assert all(r["finish_reason"] == "length" and r["response"] == "" and r["attempts"] == 1
               and r["reasoning"].startswith("r0 r1") and r["native_finish_reason"] ==
               "max_tokens" and r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 16
               for r in done)
    st = status_of(out)
    assert (st["cut"], st["by_finish_reason"], st["retries"]) == (40, {"length": 40}, 0)
    assert st["cost"] == pytest.approx(40 * 0.0001)  # billed once each


def test_the_plain_length_empty_answer_is_not_retried_either(fake_factory, key_file, tmp_path):
    fake = fake_factory(faults=FaultPlan(rates={"length_empty": 1.0}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 20)
    proc = run_payload(*gen_args(fake, key_file, inp, out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    done, _ = assert_exactly_once(ids, out)
    asked_once_each(fake, done)
    assert status_of(out)["cut"] == 20


def test_think_markers_in_content_are_split_or_refused(fake_factory, key_file, tmp_path):
    fake = fake_factory(thinking="tags", reasoning_tokens=8)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 30)
    proc = run_payload(*gen_args(fake, key_file, inp, out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    done, _ = assert_exactly_once(ids, out)
    assert_paired(done)  # the answer alone in `response`
    assert all(r["reasoning"] == "r0 r1 r2 r3 r4 r5 r6 r7" and "<think>" not in r["response"]
               for r in done)
    assert status_of(out)["think_split"] == 30
    # Refused instead: the same permanent error for every answer stops the run early, and
    # nothing is recorded as failed (a rerun with `split` does them).
    out2 = tmp_path / "out2.jsonl"
    proc = run_payload(*gen_args(fake, key_file, inp, out2, "--think-in-content", "refuse"))
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "think_in_content" in proc.stderr
    assert not read_jsonl(out2) and not read_jsonl(errors_path(out2))


def test_provenance_meta_and_a_breakdown_cumulative_across_resume(fake_factory, key_file,
                                                                  tmp_path):
    """Generation ids (from the header when the body has none), native_finish_reason, the
    input's other fields under `meta`, and answers by provider and finish reason in the
    status, counted again from the files on resume."""
    fake = fake_factory(providers=["DeepInfra", "Together"], generation_header=True,
                        body_id=False, thinking="field", reasoning_tokens=4)
    first, whole, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "out.jsonl"
    with whole.open("w") as fh:
        for i in range(60):
            fh.write(json.dumps({"id": i, "source": f"set{i % 3}", "kind": "chat",
                                 "prompt": f"question {i}"}) + "\n")
    lines = whole.read_text().splitlines(keepends=True)
    first.write_text("".join(lines[:25]))
    # 25 answers, then the other 35 on resume: the status counts all 60.
    assert run_payload(*gen_args(fake, key_file, first, out)).returncode == 0
    proc = run_payload(*gen_args(fake, key_file, whole, out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    done, _ = assert_exactly_once([str(i) for i in range(60)], out)
    assert all(r["meta"] == {"source": f"set{r['id'] % 3}", "kind": "chat"} for r in done)
    assert all(r["generation_id"].startswith("gen-h-") for r in done)
    assert len({r["generation_id"] for r in done}) == 60
    assert all(r["native_finish_reason"] == "stop" for r in done)
    want: dict[str, int] = {}
    for r in done:
        want[r["provider"]] = want.get(r["provider"], 0) + 1
    assert set(want) == {"DeepInfra", "Together"}
    st = status_of(out)
    assert st["by_provider"] == want and st["by_finish_reason"] == {"stop": 60}
    assert st["done"] == 60


def test_a_timeout_is_asked_again_at_most_max_timeouts(fake_factory, key_file, tmp_path):
    """Every request hangs: each prompt is sent 1 + --max-timeouts times, then recorded as
    failed (each abandoned request may have been billed in full)."""
    fake = fake_factory(faults=FaultPlan(rates={"hang": 1.0}, hang_s=30))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 4)
    args = ("--request-timeout", "0.5", "--max-failed", "100%", "--concurrency", "4")
    proc = run_payload(*gen_args(fake, key_file, inp, out, *args))
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, failed = assert_exactly_once(ids, out)
    assert fake.stats.requests == 8
    assert all(n == 2 for n in fake.stats.requests_by_prompt.values())
    assert all(f["error"]["type"] == "timeout" and f["attempts"] == 2 and
               "2 timeouts (--max-timeouts 1" in f["error"]["message"] for f in failed)
    st = status_of(out)
    assert (st["timeouts"], st["failed"], st["errors_by_kind"]) == (8, 4, {"timeout": 8})
    out0 = tmp_path / "out0.jsonl"
    before = fake.stats.requests
    assert run_payload(*gen_args(fake, key_file, inp, out0, *args, "--max-timeouts",
                                 "0")).returncode == 0
    assert fake.stats.requests - before == 4


def test_a_model_that_is_not_author_slug_says_the_check_is_skipped(fake_factory, key_file,
                                                                  tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 3)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--model", "kimi-k2.5"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "model 'kimi-k2.5' is not author/slug" in proc.stderr
    assert "provider filter and the prices are not checked" in proc.stderr
    assert fake.stats.endpoint_calls == 0


def test_smoke_passes_on_a_thinking_model_whose_short_answer_is_all_reasoning(fake_factory,
                                                                             key_file):
    fake = fake_factory(thinking="field", reasoning_tokens=200)
    proc = run_payload("smoke", "--base-url", fake.base_url, "--api-key-file", str(key_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "completion 64 (reasoning 64, content 0)" in proc.stdout
    assert "finish:    length (cut by --max-tokens)" in proc.stdout
    assert "reasoning: 'r0 r1" in proc.stdout and "smoke: OK" in proc.stdout
    assert fake.stats.requests == 1
