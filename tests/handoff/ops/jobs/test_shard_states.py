"""A sharded job's `all` row (handoff.ops.jobs.status.shards.combined) for every mix of its
shards' states (issue 32, item 2): `running` only while every shard runs or has finished,
else `partial` naming the hosts that do not, `stopping`, `stopped`, `finished` or `finished
with failures`; the ETA from the running shards only; never a crash, not even when no shard
has written its status yet (right after a launch: `max()` of nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from handoff.config import shards
from handoff.ops.jobs import status
from handoff.ops.jobs.state import JobState

HOSTS = ("a", "b", "c")


@pytest.fixture(autouse=True)
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> shards.ShardLayout:
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(tmp_path / "state"))
    return shards.record("J", shards.new_launch(list(HOSTS), sharded=True, input_sha256="s",
                                                prompts=300, per_shard=[100, 100, 100]))


# A shard as its host tells it: (process alive, status.json or None, exit code).
def shard(kind: str, host: str) -> status.JobView:
    meta = {"shard": f"{HOSTS.index(host)}/3", "hosts": 3}
    st: dict[str, Any] | None
    if kind == "unreachable":
        return status.JobView(host, None, "unreachable", error=f"{host}: connection refused")
    if kind == "fresh":  # launched a moment ago: alive, no status file yet
        return status.JobView(host, "J", "running", JobState(f"/j/{host}", meta=meta, pid=7,
                                                             alive=True))
    alive = kind in ("running", "slow", "stopping", "norate")
    st = {"done": 40, "failed": 1, "total": 100, "cost": 0.5, "rate_rps": 10.0,
          "tokens_per_s": 100.0,
          "state": {"running": "running", "slow": "running", "norate": "running",
                    "stopping": "stopped", "stopped": "stopped", "dead": "running",
                    "finished": "finished", "failing": "finished"}[kind]}
    if kind == "slow":
        st["rate_rps"] = 1.0  # 59 left at 1/s: the slowest
    if kind == "norate":
        st.pop("rate_rps")
    if kind in ("finished", "failing"):
        st.update(done=99, rate_rps=50.0, exit_code=1 if kind == "failing" else 0)
    if kind == "stopped":
        st.update(stop_reason="key limit", rate_rps=0.01)  # a stale rate: no ETA from it
    js = JobState(f"/j/{host}", status=st, meta=meta, pid=7, alive=alive)
    return status.JobView(host, "J", js.state, js)


def all_row(*kinds: str) -> status.JobView:
    views = [shard(kind, host) for kind, host in zip(kinds, HOSTS, strict=True)]
    rows = status.combined(views)
    assert len(rows) == 1, rows
    return rows[0]


@pytest.mark.parametrize(("kinds", "state", "named", "eta"), [
    # every shard runs (or ran to its end): running, the slowest running shard's ETA
    (("running", "running", "running"), "running", [], "6s"),
    (("running", "slow", "running"), "running", [], "59s"),
    (("finished", "running", "finished"), "running", [], "6s"),
    (("fresh", "fresh", "fresh"), "running", [], "-"),  # no status yet: no ETA, no crash
    (("fresh", "running", "running"), "running", [], "-"),  # one shard's ETA unknown
    (("norate", "running", "running"), "running", [], "-"),
    # some run, others do not: partial, naming them; the ETA of the running ones only
    (("running", "stopped", "running"), "partial", ["b stopped (key limit)"], "6s"),
    (("running", "dead", "finished"), "partial", ["b dead"], "6s"),
    (("running", "running", "unreachable"), "partial", ["c (unreachable)"], "6s"),
    (("fresh", "fresh", "unreachable"), "partial", ["c (unreachable)"], "-"),
    (("stopping", "running", "running"), "partial", ["a stopping"], "6s"),
    # none runs
    (("finished", "unreachable", "finished"), "partial", ["b (unreachable)"], "-"),
    (("unreachable", "unreachable", "stopped"), "partial",
     ["c stopped (key limit)", "a (unreachable)", "b (unreachable)"], "-"),
    (("stopped", "finished", "finished"), "stopped", ["a stopped (key limit)"], "-"),
    (("stopped", "dead", "stopped"), "stopped",
     ["a stopped (key limit)", "b dead", "c stopped (key limit)"], "-"),
    (("stopping", "finished", "finished"), "stopping", ["a stopping"], "-"),
    (("stopping", "stopped", "finished"), "stopped", ["a stopping", "b stopped (key limit)"], "-"),
    (("finished", "finished", "finished"), "finished", [], "-"),
    (("finished", "failing", "finished"), "finished", [], "-"),
])
def test_the_all_row_for_every_mix_of_shard_states(kinds: tuple[str, ...], state: str,
                                                   named: list[str], eta: str) -> None:
    row = all_row(*kinds)
    assert row.state == state
    assert row.ok == (state in ("running", "finished") and "failing" not in kinds)
    assert (row.error or "") == (f"{state}: {', '.join(named)}" if named else "")
    assert status.eta(row.status) == eta
    cells = status.table([shard(k, h) for k, h in zip(kinds, HOSTS, strict=True)])
    assert cells is not None  # the table is drawn (no traceback) for every mix
    if "failing" in kinds:
        assert row.shown_state == "finished with failures" and not row.ok


def test_none_reported_and_none_running() -> None:
    """No shard wrote a status file (fresh ones: running) or none can be read: no crash."""
    assert all_row("fresh", "fresh", "fresh").status["done"] == 0
    views = [shard("unreachable", h) for h in HOSTS]
    assert status.combined(views) == []  # nothing seen of the job: no row to derive
    dead = [status.JobView(h, "J", "none", JobState(f"/j/{h}", meta={"shard": f"{i}/3"}))
            for i, h in enumerate(HOSTS)]
    row = status.combined(dead)[0]
    assert row.state == "stopped" and row.error == "stopped: a none, b none, c none"


def test_a_stopped_shards_stale_rate_never_gives_the_job_an_eta() -> None:
    """The issue's case: one shard stopped for good (402) with its last rate, the other
    running: the job is `partial`, its ETA the running shard's, not a stale one's."""
    row = all_row("running", "stopped", "finished")
    assert row.state == "partial" and status.eta(row.status) == "6s"
    lines = status.progress_lines([shard("running", "a"), shard("stopped", "b"),
                                   shard("finished", "c")])
    assert any(line.startswith("J partial") and "ETA 6s" in line and "b stopped" in line
               for line in lines), lines
