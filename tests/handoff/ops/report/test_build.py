"""`fab report` without a browser: the summary's figures against the records, the fallbacks of
an older payload's run (no answered_at, no metrics.jsonl), hostile records escaped, the
per-host copies counted once, the extractor's view, and the command's exit codes."""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from pathlib import Path

import pytest

from handoff import console
from handoff.cli import commands
from handoff.ops.report import build, page
from handoff.testing.fakerun import FakeRun
from payload.extract.metrics import Metrics


@pytest.fixture(autouse=True)
def fresh_console(monkeypatch: pytest.MonkeyPatch):
    """Consoles bound to the captured stdout/stderr, one line per message."""
    monkeypatch.setenv("COLUMNS", "400")
    console._console = console._err_console = None
    yield
    console._console = console._err_console = None


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def summary_of(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="handoff-summary">(.*?)</script>', html, re.S)
    assert m, "no handoff-summary block"
    return json.loads(m.group(1))


def expected(dest: Path, job: str) -> dict:
    """The figures computed here from the merged output.jsonl and output.errors.jsonl."""
    out = records(dest / job / "output.jsonl")
    err = records(dest / job / "output.errors.jsonl")
    lat = [r["latency_s"] for r in out]
    q = statistics.quantiles(lat, n=100, method="inclusive")
    ends = [r["answered_at"] for r in out + err if "answered_at" in r]
    starts = [r["answered_at"] - r["latency_s"] for r in out if "answered_at" in r]
    return {"samples": len(out), "failed": len(err),
            "cut": sum(r["finish_reason"] == "length" for r in out),
            "cost_usd": sum(r["usage"]["cost"] for r in out),
            "prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in out),
            "completion_tokens": sum(r["usage"]["completion_tokens"] for r in out),
            "reasoning_tokens": sum(r["usage"]["completion_tokens_details"]["reasoning_tokens"]
                                    for r in out),
            "latency_s": {"p50": q[49], "p90": q[89], "p99": q[98]},
            "wall_s": max(ends) - min(starts) if ends else None}


def check_figures(got: dict, want: dict) -> None:
    for key in ("samples", "failed", "cut", "prompt_tokens", "completion_tokens", "reasoning_tokens"):
        assert got[key] == want[key], key
    assert math.isclose(got["cost_usd"], want["cost_usd"], abs_tol=1e-6)
    for q in ("p50", "p90", "p99"):
        assert math.isclose(got["latency_s"][q], want["latency_s"][q], abs_tol=1e-3), q
    if want["wall_s"] is not None:
        assert math.isclose(got["wall_s"], want["wall_s"], abs_tol=1e-2)


def test_summary_equals_the_records(tmp_path: Path) -> None:
    FakeRun(samples=600, failure_share=0.05, max_tokens=6000, time_scale=0.1,
            cancelled=4).write(tmp_path)
    built = build.build(tmp_path)
    assert built.run == tmp_path / "report.html" and built.jobs == {
        "prompts": tmp_path / "prompts" / "report.html"}
    html = built.jobs["prompts"].read_text()
    got = summary_of(html)
    want = expected(tmp_path, "prompts")
    check_figures(got, want)
    assert got["cut"] > 0 and got["failed"] > 0
    assert got["cancelled"] == 12  # 4 on each host's last metrics line
    assert 'data-k="cancelled">12' in html
    assert set(got["hosts"]) == {"gen-1", "gen-2", "gen-3"} and got["timeline"] == "answered_at"
    # the run's page sums its jobs (one here)
    check_figures(summary_of(built.run.read_text()), want)
    # every plot a generator job has, and nothing said missing
    for key in ("throughput", "cost", "latency", "tokens", "errors", "mix", "hosts"):
        assert f'id="fig-{key}"' in html, key
    assert "not drawn" not in html
    assert html.count("<svg") >= 7 and 'data-k="cost_usd"' in html
    shown = re.search(r'data-k="cost_usd">([^ <]+)', html)
    assert shown and shown.group(1) == page.money(got["cost_usd"])  # the card shows the figure
    # self-contained: no fetch of anything, a policy that forbids one
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert "default-src 'none'" in html


def test_an_older_payload_run_without_answered_at_or_metrics(tmp_path: Path) -> None:
    FakeRun(samples=200, answered_at=False, metrics=False).write(tmp_path)
    html = build.build(tmp_path).jobs["prompts"].read_text()
    got = summary_of(html)
    check_figures(got, {**expected(tmp_path, "prompts"), "wall_s": None})
    assert got["timeline"] == "status" and got["wall_s"] > 0  # from status.json's times
    assert "Throughput over time: not drawn: no timeline" in html
    assert "answers, in file order" in html  # the cost still drawn, against the answers


def test_metrics_alone_give_the_timeline(tmp_path: Path) -> None:
    FakeRun(samples=300, answered_at=False, metrics=True, time_scale=0.1).write(tmp_path)
    html = build.build(tmp_path).jobs["prompts"].read_text()
    assert summary_of(html)["timeline"] == "metrics"
    assert 'id="fig-throughput"' in html and "From the hosts&#x27; metrics.jsonl" in html


def test_hostile_records_are_text(tmp_path: Path) -> None:
    FakeRun(samples=30, hosts=("gen-1",)).write(tmp_path)
    evil = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
    out = tmp_path / "prompts" / "output.jsonl"
    recs = records(out)
    recs[0].update(response=evil, provider=evil, reasoning=evil)
    recs[0]["messages"][-1]["content"] = evil
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    html = build.build(tmp_path, sample_size=100).jobs["prompts"].read_text()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in html  # shown, as text
    block = html.split('id="handoff-summary">', 1)[1].split("</script>", 1)[0]
    assert "<" not in block  # nothing in the JSON can end its script element
    assert json.loads(block)["providers"]


def test_per_host_copies_without_a_merge_count_each_id_once(tmp_path: Path) -> None:
    FakeRun(samples=120, hosts=("a", "b")).write(tmp_path)
    want = expected(tmp_path, "prompts")
    for name in ("output.jsonl", "output.errors.jsonl"):
        (tmp_path / "prompts" / name).unlink()
    # a second copy of a's answers on b (a job relaunched over other hosts)
    a, b = tmp_path / "a" / "prompts" / "output.jsonl", tmp_path / "b" / "prompts" / "output.jsonl"
    b.write_text(b.read_text() + a.read_text().splitlines(keepends=True)[0])
    got = summary_of(build.build(tmp_path).jobs["prompts"].read_text())
    check_figures(got, want)


def test_an_extractor_job(tmp_path: Path) -> None:
    entries = [{"id": f"s{i}", "file": f"samples/{i}.safetensors", "num_tokens": 100 + i,
                "num_supervised": 40 + i} for i in range(40)]
    for h, host in enumerate(("gpu-1", "gpu-2")):
        job = tmp_path / host / "extractor"
        features = job / "features"
        features.mkdir(parents=True)
        mine = entries[h::2]
        (features / "manifest.jsonl").write_text("".join(json.dumps(e) + "\n" for e in mine))
        (features / "meta.json").write_text(json.dumps({"format": "speculators", "layers": [2, 16, 29],
                                                        "dtype": "bfloat16"}))
        (features / f"mismatches.shard{h}.jsonl").write_text(json.dumps(
            {"id": "s1", "turn": 0, "supervised": 41, "completion_tokens": 40, "action": "kept"}) + "\n")
        (job / "job.json").write_text(json.dumps({"job": "extractor", "role": "extractor",
                                                  "shard": f"{h}/2", "shard_hosts": ["gpu-1", "gpu-2"]}))
        status = {"state": "finished", "done": len(mine), "failed": 0, "total": len(mine),
                  "tokens_written": sum(e["num_tokens"] for e in mine), "bytes_written": 10 ** 6,
                  "supervised_written": sum(e["num_supervised"] for e in mine),
                  "started": time.time() - 30, "updated": time.time(), "format": "speculators"}
        (job / "status.json").write_text(json.dumps(status))
        m = Metrics(job / "metrics.jsonl", 5.0, time.time() - 30, "launch")
        m.tick({**status, "state": "running", "done": len(mine) // 2}, final=True)
        m.tick(status, final=True)
    html = build.build(tmp_path).jobs["extractor"].read_text()
    got = summary_of(html)
    assert got["kind"] == "extractor" and got["samples"] == 40 and got["failed"] == 0
    assert got["tokens"] == sum(e["num_tokens"] for e in entries)
    assert got["supervised_tokens"] == sum(e["num_supervised"] for e in entries)
    assert got["mismatches"] == 2 and got["meta"]["format"] == "speculators"
    for key in ("extract", "spans", "hosts"):
        assert f'id="fig-{key}"' in html, key
    assert "Re-tokenization mismatches" in html


def test_the_command(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert commands.report(dest=str(tmp_path / "missing")) == 2
    assert "fab fetch --dest" in capfd.readouterr().err
    (tmp_path / "empty").mkdir()
    assert commands.report(dest=str(tmp_path / "empty")) == 1
    assert "no fetched job" in capfd.readouterr().err
    FakeRun(samples=50).write(tmp_path / "r")
    assert commands.report(dest=str(tmp_path / "r"), job="prompt") == 2
    assert "did you mean 'prompts'" in capfd.readouterr().err
    assert commands.report(dest=str(tmp_path / "r"), answers="many") == 2
    assert commands.report(dest=str(tmp_path / "r"), job="prompts", answers="5") == 0
    out = capfd.readouterr().out
    assert "prompts/report.html" in out and not (tmp_path / "r" / "report.html").exists()
    page_html = (tmp_path / "r" / "prompts" / "report.html").read_text()
    assert page_html.count('data-why="random"') == 5 and "the whole run" not in page_html
    assert commands.report(dest=str(tmp_path / "r")) == 0
    assert f"report: {tmp_path / 'r' / 'report.html'}" in capfd.readouterr().out
