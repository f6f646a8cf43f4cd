"""A relaunch's estimate (issue 22 #13: "the estimate counts prompts already done on a
relaunch"): the estimate before any host answers counts every prompt and says so; once the
hosts' probes have read each shard's status, the launch says how many are already done and
what the rest costs and takes; a job resharded since says the figure is an upper bound."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from handoff.cli import commands
from handoff.config import state
from handoff.ops import deploy
from handoff.ops.jobs import datasets, estimate
from handoff.run import plan
from tests.support.workstation import Workstation

KEY = "sk-or-v1-" + "cd" * 32
API = "http://127.0.0.1:9/api/v1"  # the workstation's base_url: nothing listens there


def prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "x" * 40}) + "\n" for i in range(n)))
    return path


def finished(ws: Workstation, hosts: str, job: str) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        files = [ws.remote_dir(h) / "jobs" / job / "status.json" for h in hosts.split(",")]
        if all(f.exists() and "finished" in f.read_text() for f in files):
            return True
        time.sleep(0.05)
    return False


def test_already_done_sums_shards_and_knows_a_reshard() -> None:
    # two shards, one host new to the job; --no-shard: the fewest any host did
    assert estimate.already_done([{"B3": 4}, {}], sharded=True) == {"B3": 4}
    assert estimate.already_done([{"B3": 4}, {"B3": 6}], sharded=True) == {"B3": 10}
    assert estimate.already_done([{"B3": 4}, {"B3": 6}], sharded=False) == {"B3": 4}
    assert estimate.already_done([{"B3": 4}, {}], sharded=False) == {"B3": 0}
    assert estimate.already_done([{"B3": None}, {"B3": 6}], sharded=True) == {"B3": None}
    assert estimate.already_done([{}, {}], sharded=True) == {}  # a first launch: nothing to say


def test_the_estimate_of_what_is_left(ws: Workstation, tmp_path: Path) -> None:
    [ds] = datasets.load([prompts(tmp_path / "B3.jsonl", 100)], ["B3"])
    state.save_smoke(API, str(ws.targets("a")[0].vars["model"]),
                     {"latency_s": 1.0, "prompt_tokens": 10, "completion_tokens": 100,
                      "cost": 0.0011, "prices": {"prompt": 1e-6, "completion": 1e-5, "request": 0.0}})
    targets = ws.targets("a", flags={"max_tokens": 100})
    [whole], _ = estimate.rows_for([ds], targets)
    [left], _ = estimate.rows_for([ds], targets, {"B3": 25})
    assert (whole.prompts, left.prompts) == (100, 25)
    assert left.cost == pytest.approx(whole.cost / 4)  # type: ignore[operator]
    assert left.prompt_tokens == pytest.approx(whole.prompt_tokens / 4)
    [line] = estimate.left_lines([ds], targets, {"B3": 75})
    assert line.startswith("B3: relaunched: 75 of 100 prompts already done or failed on the hosts")
    assert f"what is left, 25 prompts: ~${left.cost:,.2f}" in line
    [line] = estimate.left_lines([ds], targets, {"B3": 100})
    assert "every prompt is already done or failed on the hosts (100 of 100)" in line
    [line] = estimate.left_lines([ds], targets, {"B3": None})
    assert "relaunched over other shards" in line and "for all 100, is an upper bound" in line
    assert estimate.left_lines([ds], targets, {}) == []  # new everywhere: the table was right


def test_a_relaunch_says_what_is_left_once_the_hosts_answer(
        ws: Workstation, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """On fake hosts: the batch role answers its shard and finishes, so a relaunch over the
    same hosts finds every prompt done; one over other shards cannot count them."""
    data = prompts(tmp_path / "B3.jsonl", 30)
    assert all(r.ok for r in plan.execute(deploy.build(ws.targets("s,t"), key=KEY),
                                          connect=ws.connect))
    assert commands.launch("s", "batch", local_input=str(data), remote_input=None, flags={}) == 0
    first = capfd.readouterr().out
    # before any host answers: every prompt, and the caption says a relaunch is counted later
    assert "estimate: 1 dataset(s) over 1 host(s)" in first
    assert "what is left is said once the hosts answer" in " ".join(first.split())
    assert "relaunched" not in first  # a first launch: the estimate was right
    assert finished(ws, "s", "B3")

    assert commands.launch("s", "batch", local_input=str(data), remote_input=None, flags={}) == 0
    again = " ".join(capfd.readouterr().out.split())
    assert ("B3: relaunched: every prompt is already done or failed on the hosts (30 of 30): "
            "nothing left to ask") in again
    assert finished(ws, "s", "B3")

    # s held the whole input; over s and t it is shard 0/2: which of s's ids that shard owns
    # is not known here
    assert commands.launch("s,t", "batch", local_input=str(data), remote_input=None, flags={}) == 0
    moved = " ".join(capfd.readouterr().out.split())
    assert "B3: relaunched over other shards than before" in moved
    assert "for all 30, is an upper bound" in moved
    assert finished(ws, "s,t", "B3")

    # the same two shards again: their sum, read from each host's status
    assert commands.launch("s,t", "batch", local_input=str(data), remote_input=None, flags={}) == 0
    same = " ".join(capfd.readouterr().out.split())
    assert "(30 of 30): nothing left to ask" in same, same


def test_a_dry_run_says_it_cannot_count_what_is_done(
        ws: Workstation, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    data = prompts(tmp_path / "B3.jsonl", 5)
    assert commands.launch("a,b", None, local_input=str(data), remote_input=None, flags={},
                           dry_run=True) == 0
    out = " ".join(capfd.readouterr().out.split())
    assert "a dry run contacts no host to count them" in out and "relaunched" not in out

