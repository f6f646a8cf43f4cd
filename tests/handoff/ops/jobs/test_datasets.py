"""Datasets before a launch: `--input` expansion (repeats, quoted globs), the local check by
the payload's rules (bad lines with reasons, non-UTF-8, repeated ids, old answers), the
refusals that come before any host (an all-bad file, two files for one job, `--job` with
several inputs), the estimate and what the smoke test records for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handoff.config import state
from handoff.errors import UsageError
from handoff.ops.jobs import datasets, estimate, launch, smoke
from handoff.ops.jobs.datasets import check_file, expand
from tests.support.workstation import Workstation


def write(path: Path, *records: object, raw: bytes = b"") -> Path:
    with path.open("wb") as fh:
        for rec in records:
            fh.write((rec if isinstance(rec, str) else json.dumps(rec)).encode() + b"\n")
        fh.write(raw)
    return path


def test_check_file_counts_by_the_payloads_rules(tmp_path: Path) -> None:
    path = write(tmp_path / "B3.jsonl",
                 {"id": 1, "messages": [{"role": "user", "content": "abcd" * 10}]},
                 {"id": 2, "conversations": [{"from": "human", "value": "q" * 8},
                                             {"from": "gpt", "value": "old answer" * 4}]},
                 {"id": 3, "prompt": "plain"},
                 {"id": 1, "prompt": "the same id again"},
                 {"id": 4, "text": "wrong shape"},
                 "not json",
                 "",
                 raw=b'{"id": 5, "prompt": "caf\xe9"}\n')
    check, sha = check_file(path)
    import hashlib

    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (check.lines, check.valid, check.duplicates, check.prompts, check.bad) == (7, 4, 1, 3, 3)
    assert [s["line"] for s in check.samples] == [5, 6, 8]  # the blank line 7 is no line at all
    reasons = [s["reason"] for s in check.samples]
    assert reasons[0].startswith("no 'messages', 'conversations' or 'prompt' field")
    assert reasons[1].startswith("not JSON")
    assert reasons[2] == "not valid UTF-8 (byte 0xe9 at byte 25 of the line)"
    assert check.prompt_chars == 40 + 8 + 5  # the prompts (distinct ids), not the old answer
    assert (check.answers, check.answer_chars) == (1, 40)
    assert "3 bad lines (line 5: no 'messages'" in check.bad_summary()


def test_expand_takes_repeats_and_quoted_globs(tmp_path: Path) -> None:
    for name in ("B4.jsonl", "B3.jsonl", "C1.jsonl"):
        write(tmp_path / name, {"prompt": name})
    assert [p.name for p in expand([str(tmp_path / "B*.jsonl")])] == ["B3.jsonl", "B4.jsonl"]
    assert [p.name for p in expand([str(tmp_path / "C1.jsonl"), str(tmp_path / "B*.jsonl"),
                                    str(tmp_path / "B3.jsonl")])] == ["C1.jsonl", "B3.jsonl", "B4.jsonl"]
    with pytest.raises(UsageError, match="matches no file"):
        expand([str(tmp_path / "X*.jsonl")])
    with pytest.raises(UsageError, match="no such file"):
        expand([str(tmp_path / "none.jsonl")])


def test_refusals_before_any_host(ws: Workstation, tmp_path: Path) -> None:
    targets = ws.targets("a,b")
    bad = write(tmp_path / "bad.jsonl", {"id": 1, "text": "x"}, "nope")
    with pytest.raises(UsageError, match=r"has no valid record: 2 bad lines \(line 1: no 'messages'.*Nothing was launched"):
        launch.load_datasets(targets, [str(bad)], None)
    empty = write(tmp_path / "empty.jsonl", "")
    with pytest.raises(UsageError, match="is empty"):
        launch.load_datasets(targets, [str(empty)], None)
    (tmp_path / "v2").mkdir()
    one = write(tmp_path / "B3.jsonl", {"prompt": "a"})
    two = write(tmp_path / "v2" / "B3.jsonl", {"prompt": "b"})
    with pytest.raises(UsageError, match="would both be job 'B3'"):
        launch.load_datasets(targets, [str(one), str(two)], None)
    write(tmp_path / "B4.jsonl", {"prompt": "c"})
    with pytest.raises(UsageError, match="--job names one job, but the inputs are 2 files"):
        launch.load_datasets(targets, [str(tmp_path / "B*.jsonl")], "x")
    [ds] = launch.load_datasets(targets, [str(one)], "mine")  # --job with one input names it
    assert ds.job == "mine" and ds.check.prompts == 1
    with pytest.raises(UsageError, match="plain folder name"):
        launch.load_datasets(targets, [str(write(tmp_path / ".hidden.jsonl", {"prompt": "a"}))], None)


def test_smoke_figures_are_parsed_and_recorded(ws: Workstation) -> None:
    fields = smoke.parse(
        "latency:   0.80 s\ntokens:    prompt 10, completion 40\ncost:      $0.000125\n"
        "prices:    prompt $0.6000/M, completion $2.5000/M, request $0.000000\n")
    got = smoke.measured(fields)
    assert got == {"latency_s": 0.8, "prompt_tokens": 10, "completion_tokens": 40, "cost": 0.000125,
                   "prices": {"prompt": 0.6e-6, "completion": 2.5e-6, "request": 0.0}}
    unknown = smoke.measured(smoke.parse("latency:   0.8 s\ntokens:    prompt 1, completion 2\n"
                                         "cost:      unknown\nprices:    unknown (no list)\n"))
    assert unknown == {"latency_s": 0.8, "prompt_tokens": 1, "completion_tokens": 2, "cost": None}
    assert smoke.measured(smoke.parse("smoke: FAILED\n")) is None
    state.save_smoke("http://x/api/v1/", "m/a", got)
    assert state.load_smoke("http://x/api/v1", "m/a") == {**got, "time": pytest.approx(state.load_smoke("http://x/api/v1", "m/a")["time"])}  # type: ignore[index]
    assert state.load_smoke("http://x/api/v1", "m/other") is None


def test_smoke_figures_no_answer_has_are_never_recorded_or_read(ws: Workstation) -> None:
    """Issue 31, finding 10: `latency: 1e308`, `prompt 1e999` (infinity), a negative cost:
    refused when saved; an entry already in smoke.json (an older version wrote it) is
    ignored when read, with a warning, never a crash of the launch that reads it."""
    huge = smoke.measured(smoke.parse("latency: 1e308 s\ntokens: prompt 12, completion 5\n"))
    infinite = smoke.measured(smoke.parse("latency: 0.5 s\ntokens: prompt 1e999, completion 5\n"))
    assert huge is not None and infinite is not None  # parsed, never an OverflowError
    for bad in (huge, infinite, {"latency_s": 0.5, "prompt_tokens": 1, "completion_tokens": 2,
                                 "cost": -1.0}):
        assert state.smoke_problem(bad) is not None
        with pytest.raises(ValueError):
            state.save_smoke("http://x/api/v1", "m/a", bad)
    assert not (state.state_dir() / "smoke.json").exists()
    (state.ensure_state_dir() / "smoke.json").write_text(
        '{"http://x/api/v1 m/a": {"latency_s": 1e308, "prompt_tokens": 1, "completion_tokens": 2}}')
    said: list[str] = []
    assert state.load_smoke("http://x/api/v1", "m/a", warn=said.append) is None
    assert said and "ignored" in said[0] and "latency_s" in said[0]
    assert estimate.Basis.of("http://x/api/v1", "m/a").describe().startswith("cost and time unknown")


def test_estimate_from_old_answers_and_the_smoke_test(ws: Workstation, tmp_path: Path) -> None:
    path = write(tmp_path / "B3.jsonl", *[
        {"id": i, "conversations": [{"from": "human", "value": "q" * 400},
                                    {"from": "gpt", "value": "a" * 4000}]} for i in range(1000)])
    [ds] = datasets.load([path], ["B3"])
    assert estimate.Basis.of("http://x/api/v1", "m/a").describe().startswith("cost and time unknown")
    row = estimate.estimate(ds, estimate.Basis(), hosts=2, concurrency=100, max_tokens=None)
    assert (row.prompts, row.prompt_tokens, row.answer_tokens, row.answer_source) == \
        (1000, 100_000, 1_000_000, "old answers")
    assert row.cost is None and row.seconds is None
    # prices: $1/M prompt, $2/M answer tokens; 1000 answer tokens take 10 s (100 tok/s)
    priced = estimate.Basis(prices=(1e-6, 2e-6, 0.0), speed=100.0, smoke_at=1.0, model="m/a")
    row = estimate.estimate(ds, priced, hosts=2, concurrency=100, max_tokens=None)
    assert row.cost == pytest.approx(0.1 + 2.0)
    assert row.seconds == pytest.approx(5 * 10.0)  # 1000 prompts / (2 hosts x 100) = 5 waves
    capped = estimate.estimate(ds, priced, hosts=2, concurrency=100, max_tokens=100)
    assert capped.answer_tokens == 100_000 and capped.seconds == pytest.approx(5.0)
    measured = estimate.Basis(per_token=1e-6, speed=100.0, smoke_at=1.0, model="m/a")
    assert estimate.estimate(ds, measured, 2, 100, None).cost == pytest.approx(1.1)
    bare = write(tmp_path / "B4.jsonl", {"prompt": "q" * 40})
    [plain] = datasets.load([bare], ["B4"])
    assert estimate.estimate(plain, priced, 1, 10, None).answer_source == "unknown"
    assert estimate.estimate(plain, priced, 1, 10, 50).answer_source == "at most --max-tokens"


def test_launch_prints_the_estimate_and_the_budget_split(ws: Workstation, tmp_path: Path,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    from handoff.cli import commands

    state.save_smoke("http://127.0.0.1:9/api/v1", "moonshotai/kimi-k2.5",
                     {"latency_s": 1.0, "prompt_tokens": 10, "completion_tokens": 100, "cost": 0.0011,
                      "prices": {"prompt": 1e-6, "completion": 1e-5, "request": 0.0}})
    for name in ("B3", "B4"):
        write(tmp_path / f"{name}.jsonl", *[{"id": i, "prompt": "x" * 40} for i in range(10)])
    rc = commands.launch("a,b", None, local_input=[str(tmp_path / "B*.jsonl")], remote_input=None,
                         flags={"max_cost": 3.0, "max_tokens": 100}, dry_run=True)
    out = capfd.readouterr().out
    assert rc == 0 and "dry run" in out
    assert "estimate: 2 dataset(s) over 2 host(s)" in out and "endpoint prices $1.00/M prompt" in out
    assert "budget: $3 for each of the 2 jobs (--max-cost), split over 2 hosts: $1.5 per host" in out
    assert "--max-cost 1.5" in out and "start job B3" in out and "start job B4" in out


def test_an_estimate_over_the_budget_is_a_warning_with_the_budgets_eta(tmp_path: Path) -> None:
    """No warning came when the estimate exceeded --max-cost, and the ETA ignored the budget
    (issue 22 #13): the warning says how far the budget goes, and when it runs out."""
    path = write(tmp_path / "B3.jsonl", *[
        {"id": i, "conversations": [{"from": "human", "value": "q" * 400},
                                    {"from": "gpt", "value": "a" * 4000}]} for i in range(1000)])
    [ds] = datasets.load([path], ["B3"])
    priced = estimate.Basis(prices=(1e-6, 2e-6, 0.0), speed=100.0, smoke_at=1.0, model="m/a")
    row = estimate.estimate(ds, priced, hosts=2, concurrency=100, max_tokens=None)  # $2.10, 50 s
    assert estimate.budget_warnings([row], None) == [] and estimate.budget_warnings([row], 5.0) == []
    [warning] = estimate.budget_warnings([row], 1.05)
    assert "B3: the estimate ~$2.10 exceeds the budget $1.05 (--max-cost)" in warning
    assert "about 50% of its 1000 prompts answered, after ~25s" in warning, warning
def test_estimate_counts_reasoning_at_the_smoke_tests_ratio(ws: Workstation, tmp_path: Path) -> None:
    """Issue 20: the smoke test's `completion N (reasoning R, content C)` is recorded; the
    estimate scales the old answers by it, and says when it cannot."""
    fields = smoke.parse("latency:   2.0 s\ntokens:    prompt 12, completion 64 (reasoning 48, "
                         "content 16)\ncost:      $0.000100\nfinish:    stop\n")
    got = smoke.measured(fields)
    assert got is not None and (got["reasoning_tokens"], got["content_tokens"], got["cut"]) == (48, 16, False)
    assert smoke.tokens_cell(fields["tokens"]) == "prompt 12, reasoning 48, content 16"
    state.save_smoke("http://r/api/v1", "m/think", got)
    basis = estimate.Basis.of("http://r/api/v1", "m/think")
    assert basis.reasoning_ratio == 3.0
    path = write(tmp_path / "B5.jsonl", *[
        {"id": i, "conversations": [{"from": "human", "value": "q" * 40},
                                    {"from": "gpt", "value": "a" * 400}]} for i in range(10)])
    [ds] = datasets.load([path], ["B5"])
    row = estimate.estimate(ds, basis, hosts=1, concurrency=10, max_tokens=None)
    assert row.answer_tokens == pytest.approx(10 * 100 * 4) and row.answer_source == "old answers + reasoning"
    assert "reasoning counted at 3.00 tokens per answer token" in basis.reasoning_text()
    # all reasoning (cut at 64): no ratio, and the estimate says so
    cut = smoke.measured(smoke.parse("latency:   2.0 s\ntokens:    prompt 12, completion 64 "
                                     "(reasoning 64, content 0)\nfinish:    length (cut by --max-tokens)\n"))
    assert cut is not None and cut["cut"] is True
    state.save_smoke("http://r/api/v1", "m/cut", cut)
    basis = estimate.Basis.of("http://r/api/v1", "m/cut")
    assert basis.reasoning_ratio is None
    assert estimate.estimate(ds, basis, 1, 10, None).answer_tokens == pytest.approx(1000)
    assert "NOT counted" in basis.reasoning_text() and "all reasoning" in basis.reasoning_text()
    old = estimate.Basis.of("http://r/api/v1", "m/none")
    assert "no smoke test recorded" in old.reasoning_text()
    table = estimate.table([estimate.estimate(ds, basis, 1, 10, None)], basis, 1, 10)
    assert "NOT counted" in str(table.caption)
