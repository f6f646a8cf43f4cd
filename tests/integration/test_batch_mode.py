"""`fab launch --mode batch` over real sshd and the fake OpenRouter's Batch API (issue 35):
the launch passes the mode and the job's ledger, `fab status` shows the batches, `fab stop`
cancels them (the payload cancels its own on SIGTERM; for a job whose process was killed,
the role's cancel command runs on the host), a relaunch collects what they answered and
asks the rest, and the merged dataset holds every id once, each answered once."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import yaml

from handoff.testing.fakeapi import BatchPlan
from payload.records import derive_id
from tests.integration.conftest import explain, remote_dir, wait_until


def test_batch_mode_from_fab_launch_status_stop_relaunch(make_sandbox, fab, tmp_path: Path
                                                          ) -> None:
    sbx = make_sandbox(hosts=2)
    inventory = sbx.inventory_data()
    for host in inventory["hosts"].values():  # a role var: set per host (it beats defaults)
        host["vars"]["batch_poll"] = 0.05
    sbx.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    api = sbx.api
    # lines answered one by one, 25 s a batch: still running at the stop on a loaded machine
    api.batches.plan = BatchPlan(run_s=0, line_s=1.0)
    data = tmp_path / "B1.jsonl"
    with data.open("w") as fh:
        for i in range(40):
            fh.write(json.dumps({"id": i, "messages": [{"role": "user", "content": f"q {i}"}]})
                     + "\n")
    assert fab.on(sbx, "deploy").rc == 0

    r = fab.on(sbx, "launch", "--input", str(data), "--mode", "batch", "--dry-run")
    assert r.rc == 0, explain(r)
    text = " ".join(r.text.split())
    assert "--mode batch --batch-poll 0.05 --batches-file" in text, text
    assert "/jobs/B1/batches.json" in text
    assert "--mode batch: the provider's Batch API, at about half the synchronous price" in text
    assert "cancel command" in " ".join(fab.on(sbx, "stop", "--dry-run").text.split())

    r = fab.on(sbx, "launch", "--input", str(data), "--mode", "batch")
    assert r.rc == 0, explain(r)
    answered = lambda: sum(b.counts["completed"] for b in api.batches.batches.values())  # noqa: E731
    assert wait_until(lambda: api.batches.stats.created == 2 and answered() >= 4, 60)
    assert api.stats.requests == 0  # batched, not one synchronous request
    for c in sbx.containers:
        meta = json.loads((remote_dir(c) / "jobs" / "B1" / "job.json").read_text())
        assert meta["sampling"]["mode"] == "batch"


    def states(c: Any) -> dict[str, int] | None:
        try:
            st = json.loads((remote_dir(c) / "jobs" / "B1" / "status.json").read_text())
            return st["batches"]["by_state"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    # The payload's status file follows the provider by one poll.
    assert wait_until(lambda: all(states(c) == {"in_progress": 1} for c in sbx.containers), 30)
    r = fab.on(sbx, "status")
    assert r.rc == 0, explain(r)
    text = " ".join(r.text.split())
    assert "B1 (sbx-1) batches: 1 (" in text and "); requests 25: " in text, r.text
    rows = [json.loads(line) for line in fab.on(sbx, "status", "--json").out.splitlines()
            if line.startswith("{")]
    assert [row["batches"]["batches"] for row in rows] == [1, 1]

    # fab stop: each payload cancels its batch and records what it answered.
    r = fab.on(sbx, "stop")
    assert r.rc == 0, explain(r)
    assert api.batches.stats.cancels == 2
    assert {b.status for b in api.batches.batches.values()} == {"cancelled"}
    for c in sbx.containers:
        st = json.loads((remote_dir(c) / "jobs" / "B1" / "status.json").read_text())
        assert (st["state"], st["stop_reason"], st["batches"]["live"]) == ("stopped", "signal", 0)

    # A job killed while its batch runs: fab stop runs the role's cancel command for it.
    r = fab.on(sbx, "launch", "--input", str(data), "--mode", "batch")
    assert r.rc == 0, explain(r)
    assert wait_until(lambda: api.batches.stats.created == 4, 60)
    victim = sbx.containers[0]
    job_dir = remote_dir(victim) / "jobs" / "B1"

    def last_step() -> str | None:
        try:
            return json.loads((job_dir / "batches.json").read_text())["batches"][-1]["step"]
        except (OSError, ValueError, KeyError, IndexError):
            return None

    assert wait_until(lambda: last_step() == "submitted", 30)
    os.kill(int((job_dir / "pid").read_text()), signal.SIGKILL)
    r = fab.on(sbx, "status")
    assert r.rc != 0
    assert "its process is gone but 1 batch(es) are live at the provider" in " ".join(
        r.text.split())
    r = fab.on(sbx, "stop")
    assert r.rc == 0, explain(r)
    text = " ".join(r.text.split())
    assert "cancelled 1" in text and "relaunch to record what they answered" in text
    victim_batch = json.loads((job_dir / "batches.json").read_text())["batches"][-1]["batch_id"]
    assert api.batches.batches[victim_batch].status in ("cancelling", "cancelled")
    assert api.batches.batches[victim_batch].cancel_requested

    # The relaunch records what the cancelled batches answered and asks the rest, once.
    api.batches.plan.line_s = 0
    r = fab.on(sbx, "launch", "--input", str(data), "--mode", "batch")
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "status", "--wait", "--interval", "0.5", timeout=180)
    assert r.rc == 0, explain(r)
    dest = tmp_path / "fetched"
    r = fab.on(sbx, "fetch", "--dest", str(dest))
    assert r.rc == 0, explain(r)
    merged = [json.loads(line) for line in (dest / "B1" / "output.jsonl").read_text().splitlines()]
    assert sorted(int(x["id"]) for x in merged) == list(range(40))
    assert all(api.stats.successes_by_prompt[derive_id(x["messages"])] == 1 for x in merged)
    assert not (dest / "B1" / "output.errors.jsonl").read_text().strip()
