"""The run is the unit (issue 32, part B), over real sshd and the fake OpenRouter:

- a fetch with a host down never makes the merged output smaller: the host's last fetched
  copy stands in (said, with when), a copy lost here is covered by the last merge, and the
  fetch exits 1 naming the host (#3);
- a job's budget is its own: two jobs on one host with a management key, one without a
  budget runs to its end, the other stops at its own budget; each budgeted job runs on a
  child key of its own, minted at launch and revoked by forget and cleanup (#1); a launch
  on a job key with nothing left is refused before anything starts (#5);
- cleanup-secrets leaves a host where a job runs as it is unless --force (#7);
- a dead host's shard moves: a relaunch over fewer hosts is refused while a host it leaves
  runs; a take-over asks only what the dead host's last fetched copy lacks, and every id is
  asked exactly once at the fake across the whole run (#4).

Each test uses a private sandbox (they stop hosts and leave jobs behind).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.conftest import explain


def flat(result: Any) -> str:
    """Both streams with the table/line wrapping undone."""
    return " ".join(result.text.split())


def records(result: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """`status --json`: one object per host and job."""
    found = [json.loads(line) for line in result.out.splitlines() if line.startswith("{")]
    return {(r["host"], r["job"]): r for r in found}


def dataset(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"{path.stem}-{i}", "messages": [
                {"role": "user", "content": f"question {i} of {path.stem}"}]}) + "\n")
    return path


def ids(path: Path) -> list[str]:
    return [str(json.loads(line)["id"]) for line in path.read_text().splitlines() if line.strip()]


def test_a_fetch_with_a_host_down_never_makes_the_merge_smaller(make_sandbox, fab,
                                                                tmp_path: Path) -> None:
    sbx = make_sandbox(hosts=3)
    data = dataset(tmp_path / "alpha.jsonl", 60)
    dest = tmp_path / "results"
    assert fab.on(sbx, "deploy").rc == 0
    r = fab.on(sbx, "launch", "--input", str(data))
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "status", "--wait", "--interval", "0.3", timeout=180)
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "fetch", "--dest", str(dest))
    assert r.rc == 0 and "complete: all 60 ids of the job" in flat(r), explain(r)
    merged = dest / "alpha" / "output.jsonl"
    whole = sorted(ids(merged))
    assert len(whole) == 60

    sbx.stop_container("sbx-3")
    r = fab.on(sbx, "fetch", "--dest", str(dest))
    text = flat(r)
    assert r.rc == 1, explain(r)
    assert "sbx-3" in text and "not fetched now (its fetch failed:" in text, explain(r)
    assert "its last fetched copy, from " in text and "(it had finished)" in text
    assert sorted(ids(merged)) == whole  # the host's last copy stands in: nothing lost

    # A copy lost here while its host is down, and only one host asked: the last merge's
    # answers stay, each id once.
    (dest / "sbx-3" / "alpha" / "output.jsonl").unlink()
    r = fab.on(sbx, "fetch", "--dest", str(dest), "--host", "sbx-1")
    assert r.rc == 0, explain(r)
    assert sorted(ids(merged)) == whole, explain(r)
    assert "answers kept from the last merge" in flat(r), explain(r)
    assert "sbx-2 not fetched now (not asked): its last fetched copy" in flat(r)


def minted_sandbox(make_sandbox: Any, hosts: int, **kwargs: Any) -> Any:
    return make_sandbox(hosts=hosts, management=True, key_limit=1.0, keyring="secretservice",
                        **kwargs)


def test_one_jobs_budget_never_stops_another_job_on_its_host(make_sandbox, fab,
                                                             tmp_path: Path) -> None:
    """The issue's case (#1): a job without a budget, then a job with one on the same host
    (a management key stored): the first runs to its end, the second stops at its own
    budget, each on its own key. A relaunch whose key has nothing left is refused before
    anything starts (#5); cleanup leaves the host alone while a job runs there (#7); forget
    revokes the job's own key."""
    # gamma's 40 answers take 0.2 s each, one at a time: it runs while the rest is done.
    sbx = minted_sandbox(make_sandbox, 1, api_latency_s=0.2)
    keys, cost = sbx.api.keys, sbx.api.cost_per_request
    assert fab.on(sbx, "deploy").rc == 0
    [host_key] = keys.live()
    gamma = dataset(tmp_path / "gamma.jsonl", 40)
    beta = dataset(tmp_path / "beta.jsonl", 24)
    r = fab.on(sbx, "launch", "--input", str(gamma), "--concurrency", "1")
    assert r.rc == 0, explain(r)
    budget = round(cost * 4, 6)
    r = fab.on(sbx, "launch", "--input", str(beta), "--job", "budget", "--max-cost", str(budget),
               "--concurrency", "1")
    assert r.rc == 0, explain(r)
    assert "minted job budget's child key" in flat(r) and "on its own key" in flat(r), explain(r)
    own = [k for k in keys.live() if k.hash != host_key.hash]
    assert len(own) == 1 and own[0].limit == budget and own[0].name.endswith(":sbx-1:budget")
    assert host_key.limit == 1.0  # the host's key, what gamma runs on, is not touched

    # cleanup-secrets while gamma runs: refused, everything left in place (#7)
    r = fab.on(sbx, "cleanup-secrets")
    assert r.rc == 1, explain(r)
    assert "still run" in flat(r) and "gamma (pid" in flat(r) and "--force" in flat(r), explain(r)
    assert len(keys.live()) == 2

    r = fab.on(sbx, "status", "--wait", "--json", "--interval", "0.3", timeout=180)
    got = records(r)
    g, b = got[("sbx-1", "gamma")], got[("sbx-1", "budget")]
    assert g["state"] == "finished" and g["done"] == g["total"] == 40, g
    assert b["state"] == "stopped" and 0 < b["done"] < 24 and b["cost"] <= budget + 1e-9, b
    assert b["key"]["own"] is True and b["key"]["limit"] == budget, b["key"]
    assert g["key"]["limit"] == 1.0 and "own" not in g["key"], g["key"]
    assert keys.served_by[own[0].hash] == b["done"] and keys.served_by[host_key.hash] == 40

    # A relaunch whose key would have nothing left is refused, naming host, job, used and
    # limit, before anything starts (#5).
    lower = round(cost * 2, 6)
    r = fab.on(sbx, "launch", "--input", str(beta), "--job", "budget", "--max-cost", str(lower))
    assert r.rc == 1, explain(r)
    used = f"${own[0].usage:.4f}"
    assert f"sbx-1: job budget's key has nothing left: used {used} of {used}" in flat(r), explain(r)
    assert "Nothing was started on any host" in flat(r)
    after = records(fab.on(sbx, "status", "--json", "--job", "budget"))[("sbx-1", "budget")]
    assert after["state"] == "stopped" and after["done"] == b["done"]

    # forget revokes the job's own key and removes its file; the host's key lives on.
    job_key = sbx.container("sbx-1").home / ".handoff" / "secrets" / "jobs" / "budget.key"
    assert job_key.exists()
    r = fab.on(sbx, "forget", "--job", "budget", "--yes")
    assert r.rc == 0, explain(r)
    assert not job_key.exists() and [k.hash for k in keys.live()] == [host_key.hash], explain(r)


def test_cleanup_finds_a_jobs_own_key_with_the_state_dir_gone(make_sandbox, fab,
                                                              tmp_path: Path) -> None:
    import shutil

    sbx = minted_sandbox(make_sandbox, 1)
    assert fab.on(sbx, "deploy").rc == 0
    r = fab.on(sbx, "launch", "--input", str(dataset(tmp_path / "d.jsonl", 4)), "--max-cost", "0.5")
    assert r.rc == 0, explain(r)
    assert fab.on(sbx, "status", "--wait", "--interval", "0.3", timeout=120).rc == 0
    assert len(sbx.api.keys.live()) == 2
    shutil.rmtree(sbx.state_dir)
    r = fab.on(sbx, "cleanup-secrets")
    assert r.rc == 0, explain(r)
    secrets = sbx.container("sbx-1").home / ".handoff" / "secrets"
    assert not (secrets / "jobs" / "d.key").exists() and not (secrets / "openrouter.key").exists()
    assert sbx.api.keys.live() == [] and "revoked 2 child key(s)" in flat(r), explain(r)


def test_a_dead_hosts_shard_moves_and_every_id_is_asked_once(make_sandbox, fab,
                                                             tmp_path: Path) -> None:
    """The issue's take-over (#4): 3 hosts; sbx-3 goes down mid-run (its job ends, as a
    host's processes do at shutdown, after the last fetch; then its sshd stops). A relaunch
    over fewer hosts is refused while another host runs its shard; `--take-over sbx-3 --host
    sbx-2` moves sbx-3's shard to sbx-2, which leaves out what sbx-3's fetched copy holds.
    Every id is asked exactly once at the fake across the whole run, and the merged output
    is complete. (The job ends with SIGTERM, not kill -9: a request cut in flight was sent
    and never recorded anywhere, so no one could know not to ask it again.)"""
    import os
    import signal

    from tests.integration.conftest import wait_until

    sbx = make_sandbox(hosts=3, api_latency_s=0.2)
    data = dataset(tmp_path / "alpha.jsonl", 90)
    dest = tmp_path / "results"
    assert fab.on(sbx, "deploy").rc == 0
    r = fab.on(sbx, "launch", "--input", str(data), "--concurrency", "1")
    assert r.rc == 0, explain(r)
    dead = sbx.container("sbx-3")
    job_dir = dead.home / ".handoff" / "jobs" / "alpha"

    def done_on_dead() -> int:
        try:
            return int(json.loads((job_dir / "status.json").read_text()).get("done") or 0)
        except (OSError, ValueError):
            return 0

    assert wait_until(lambda: done_on_dead() >= 5, 60)
    pid = int((job_dir / "pid").read_text())
    os.kill(pid, signal.SIGTERM)  # the host shuts down: its job drains, then ends
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 60)
    r = fab.on(sbx, "fetch", "--dest", str(dest), "--job", "alpha")
    assert r.rc == 0, explain(r)
    in_hand = len(ids(dest / "sbx-3" / "alpha" / "output.jsonl"))
    assert 0 < in_hand < 30
    sbx.stop_container("sbx-3")

    st = fab.on(sbx, "status", "--job", "alpha")
    assert st.rc == 1 and "partial" in flat(st) and "sbx-3 (unreachable)" in flat(st), explain(st)
    # Relaunching over fewer hosts while sbx-1 runs its shard would ask again: refused.
    r = fab.on(sbx, "launch", "--input", str(data), "--host", "sbx-2")
    assert r.rc == 1, explain(r)
    said = flat(r)
    assert "sbx-1 still runs its shard and sbx-3 cannot be reached" in said, explain(r)
    assert "`fab launch --job alpha --take-over sbx-3 --host sbx-2`" in said
    assert "Nothing was started" in said and "--host sbx-1,sbx-2,sbx-3" in said

    # sbx-2 takes sbx-3's shard over: stopped first (it resumes its own shard with it).
    assert fab.on(sbx, "stop", "--job", "alpha", "--host", "sbx-2").rc == 0
    r = fab.on(sbx, "launch", "--input", str(data), "--job", "alpha", "--take-over", "sbx-3",
               "--host", "sbx-2", "--dest", str(dest))
    assert r.rc == 0, explain(r)
    text = flat(r)
    assert f"shard 2/3 moves from sbx-3 to sbx-2 (take-over): {in_hand} of its ids are in hand" in text
    assert "shard 1,2/3" in text, explain(r)
    meta = json.loads((sbx.container("sbx-2").home / ".handoff" / "jobs" / "alpha" / "job.json")
                      .read_text())
    assert meta["shard"] == "1,2/3" and meta["exclude_ids"].endswith("exclude-ids.jsonl")

    r = fab.on(sbx, "status", "--wait", "--host", "sbx-1,sbx-2", "--job", "alpha",
               "--interval", "0.3", timeout=240)
    assert r.rc == 0, explain(r)
    assert "moved from sbx-3 to sbx-2" in flat(r), explain(r)
    got = records(fab.on(sbx, "status", "--json", "--host", "sbx-1,sbx-2", "--job", "alpha"))
    assert sum(rec["done"] for rec in got.values()) + in_hand == 90

    r = fab.on(sbx, "fetch", "--dest", str(dest), "--host", "sbx-1,sbx-2")
    assert r.rc == 0 and "complete: all 90 ids of the job" in flat(r), explain(r)
    merged = ids(dest / "alpha" / "output.jsonl")
    assert sorted(merged) == sorted(f"alpha-{i}" for i in range(90))
    # At the fake: every prompt asked exactly once across the whole run.
    asked = dict(sbx.api.stats.requests_by_prompt)
    assert len(asked) == 90 and set(asked.values()) == {1}, {k: n for k, n in asked.items() if n != 1}
