"""From a host's job folder to the report, on a fake host: `fab fetch` brings metrics.jsonl
and job.json with the records (metrics.jsonl continued like any append-only file: a grown
one moves only its rest), and `fab report` on what fetch wrote draws from all of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from handoff.cli import commands
from handoff.ops.fetch import fetch_job
from handoff.testing.fakerun import FakeRun
from tests.support.workstation import Workstation


def test_fetch_brings_the_metrics_and_the_report_draws_them(ws: Workstation, tmp_path: Path) -> None:
    made = tmp_path / "made"
    FakeRun(samples=120, hosts=("a",), concurrency=16, time_scale=0.1).write(made)
    jd = ws.remote_dir("a") / "jobs" / "prompts"
    shutil.copytree(made / "a" / "prompts", jd)
    dest = tmp_path / "results"
    assert commands.fetch("a", None, dest=str(dest)) == 0
    local = dest / "a" / "prompts"
    for name in ("metrics.jsonl", "job.json", "status.json", "output.jsonl"):
        assert (local / name).read_bytes() == (jd / name).read_bytes(), name
    assert commands.report(dest=str(dest)) == 0
    html = (dest / "prompts" / "report.html").read_text()
    assert "in flight and window from the hosts&#x27; metrics.jsonl" in html
    assert 'id="fig-errors"' in html and "retried ones included" in html  # metrics' errors_by_kind

    line = json.dumps({"t": 1_767_300_000.0, "role": "generator", "done": 999}) + "\n"
    with (jd / "metrics.jsonl").open("a") as fh:  # the run went on
        fh.write(line)
    [target] = ws.targets("a")
    with ws.connect(target) as session:
        done = fetch_job(session, "prompts", local)
        reads = [path for op, path in session.files.calls if op == "read"]  # type: ignore[attr-defined]
    assert reads == [f"{jd}/metrics.jsonl"] and done.resumed == 1
    assert done.nbytes == len(line.encode())
    assert (local / "metrics.jsonl").read_bytes() == (jd / "metrics.jsonl").read_bytes()
