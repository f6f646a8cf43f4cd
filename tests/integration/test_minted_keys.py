"""Minted child keys end to end through `.venv/bin/fab`: real sshd containers on loopback, the
real Secret Service (the sandbox's throwaway gnome-keyring) holding an API key and a
management key, and the fake OpenRouter's management API and per-key accounting.

- deploy to 3 hosts mints 3 child keys with the configured limit and expiry; a redeploy
  mints none; the jobs' requests are authenticated by the child keys only;
- a child key that reaches its limit stops its job (exit 3, resumable) and the others go
  on; `launch --max-cost` raises it again (PATCH) and the job resumes;
- cleanup-secrets leaves no live child key and no key file, a host down at cleanup time
  included (its key revoked: the file that remains there is dead);
- the management key (and, in minted mode, the API key) appear nowhere: containers, state
  dir, outputs, logs, argv and environment samples;
- a failure of the management API mid-deploy leaves no live orphan key;
- with the state dir deleted, cleanup still finds and removes the keys on the hosts and
  revokes the minted one (issue 8).
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml

from handoff.testing.fakekeys import ROOT, MgmtFault
from tests.integration.conftest import (
    KeyLeakWatch,
    artifacts,
    explain,
    find_key,
    key_file,
    run_as,
)

LIMIT = 1.0


def minted_sandbox(make_sandbox: Any, hosts: int, **kwargs: Any) -> Any:
    return make_sandbox(hosts=hosts, management=True, key_limit=LIMIT, keyring="secretservice",
                        **kwargs)


def record(c: Any) -> dict[str, Any]:
    return json.loads((key_file(c).parent / "openrouter.key.minted.json").read_text())


def prompts(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"p{i}", "messages": [
                {"role": "user", "content": f"Say something about the number {i}."}]}) + "\n")
    return path


def set_host_vars(sbx: Any, name: str, **values: Any) -> None:
    data = yaml.safe_load(sbx.inventory.read_text())
    data["hosts"][name].setdefault("vars", {}).update(values)
    sbx.inventory.write_text(yaml.safe_dump(data, sort_keys=False))


def flat(result: Any) -> str:
    """Both streams with the table/line wrapping undone."""
    return " ".join(result.text.split())


def status_records(result: Any) -> dict[str, dict[str, Any]]:
    return {r["host"]: r for r in (json.loads(line) for line in result.out.splitlines()
                                   if line.startswith("{"))}


def test_three_hosts_three_child_keys_the_jobs_on_them_and_nothing_left(
        make_sandbox, fab, tmp_path: Path) -> None:
    sbx = minted_sandbox(make_sandbox, 3, api_latency_s=0.05)
    assert sbx.keyring_backend == "SecretService"
    keys = sbx.api.keys
    mgmt, api_key = sbx.management_key, sbx.api_key
    before = datetime.now(timezone.utc)

    with KeyLeakWatch(mgmt) as during_deploy:
        deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    assert flat(deploy).count("minted child key") == 3, explain(deploy)
    live = keys.live()
    assert len(live) == 3 and {k.limit for k in live} == {LIMIT}
    for k in live:
        assert k.expires_at is not None
        assert abs(k.expires_at - (before + timedelta(hours=24))) < timedelta(seconds=30)
    for c in sbx.containers:
        held = key_file(c).read_text()
        assert keys.by_key(held) is not None and held not in (api_key, mgmt)
        assert keys.by_key(held).hash == record(c)["hash"] and c.name in keys.by_key(held).name

    again = fab.on(sbx, "deploy")
    assert again.rc == 0, explain(again)
    assert flat(again).count("reused, nothing minted") == 3 and keys.calls["create"] == 3

    smoke = fab.on(sbx, "smoke-test")
    assert smoke.rc == 0, explain(smoke)
    assert flat(smoke).count("left of $1.000000") == 3, explain(smoke)

    with KeyLeakWatch(mgmt) as during_launch, KeyLeakWatch(api_key) as api_during_launch:
        launch = fab.on(sbx, "launch", "--input", str(prompts(tmp_path / "p.jsonl", 30)))
        assert launch.rc == 0, explain(launch)
        waited = fab.on(sbx, "status", "--wait", timeout=180)
    assert waited.rc == 0, explain(waited)
    # Every request was authenticated by a child key; the account's own key served none.
    child_hashes = {record(c)["hash"] for c in sbx.containers}
    assert ROOT not in keys.served_by and set(keys.served_by) == child_hashes
    assert sum(keys.served_by.values()) == 30 + 3  # the prompts and the smoke tests
    st = fab.on(sbx, "status", "--json")
    assert st.rc == 0, explain(st)
    for rec in status_records(st).values():
        assert rec["key"]["mode"] == "minted" and rec["key"]["limit"] == LIMIT
        assert rec["key"]["usage"] > 0 and rec["key"]["expires_at"].endswith("Z")
    table = fab.on(sbx, "status")
    assert flat(table).count("yes (minted)") == 3 and "used $0.00" in flat(table), explain(table)

    # Cleanup while sbx-3 is down: its key is revoked all the same; its file may remain.
    sbx.stop_container("sbx-3")
    with KeyLeakWatch(mgmt) as during_cleanup:
        cleanup = fab.on(sbx, "cleanup-secrets")
    assert cleanup.rc != 0, explain(cleanup)
    text = flat(cleanup)
    assert "sbx-3" in text and "child key it holds is revoked, so it is dead" in text
    assert keys.live() == [] and keys.keys == {}
    assert not key_file(sbx.container("sbx-1")).exists()
    assert not key_file(sbx.container("sbx-2")).exists()
    assert key_file(sbx.container("sbx-3")).exists()  # on the host that was down: dead
    sbx.start_container("sbx-3")
    after = fab.on(sbx, "cleanup-secrets")
    assert after.rc == 0, explain(after)
    assert all(not key_file(c).exists() for c in sbx.containers) and keys.live() == []

    # The management key, and the API key (never placed in minted mode), are nowhere.
    for watch in (during_deploy, during_launch, api_during_launch, during_cleanup):
        assert watch.samples >= 3 and watch.hits == [], watch.hits
    assert any("generate" in args for args in during_launch.args_seen)
    found = artifacts(sbx, fab.results)
    assert find_key(mgmt, found) == [], "the management key leaked"
    assert find_key(api_key, found) == [], "the API key leaked (it is never placed when minting)"
    assert any(label.endswith("status.json") for label in found)
    assert any(label.endswith("ledger.jsonl") for label in found)


def test_a_key_at_its_limit_stops_its_job_and_the_others_go_on(
        make_sandbox, fab, tmp_path: Path) -> None:
    # Answers take 0.3 s and one request flies at a time: the jobs outlive launch's check.
    sbx = minted_sandbox(make_sandbox, 2, api_latency_s=0.3)
    cost = sbx.api.cost_per_request
    set_host_vars(sbx, "sbx-1", key_limit=round(cost * 4.5, 6))  # 4 requests, then 402
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    launch = fab.on(sbx, "launch", "--input", str(prompts(tmp_path / "p.jsonl", 24)),
                    "--concurrency", "1")
    assert launch.rc == 0, explain(launch)
    waited = fab.on(sbx, "status", "--wait", "--json", timeout=180)
    records = status_records(waited)
    assert waited.rc != 0, explain(waited)
    one, two = records["sbx-1"], records["sbx-2"]
    assert two["state"] == "finished" and two["done"] == two["total"] > 0, two
    assert one["state"] == "stopped" and one["done"] == 4 < one["total"], one
    assert "key limit" in str(one["last_error"]).lower(), one
    log = (sbx.container("sbx-1").home / ".handoff" / "jobs" / "p" / "log").read_text()  # job p: p.jsonl
    assert "402" in log and "resumable" in log
    assert one["key"]["usage"] == round(cost * 4, 10) and one["key"]["limit_remaining"] < cost
    assert two["key"]["limit"] == LIMIT

    # With a budget the job runs on a child key of its own (issue 32: a budget is its job's),
    # limited to what is left of the $0.01 budget, $0.0096 (it spent $0.0004 already); the
    # host's key stays as it was. The job resumes.
    relaunch = fab.on(sbx, "launch", "--host", "sbx-1", "--input", str(tmp_path / "p.jsonl"),
                      "--max-cost", "0.01")
    assert relaunch.rc == 0, explain(relaunch)
    assert "minted job p's child key" in flat(relaunch) and "used $0.0000 of $0.0096" in \
        flat(relaunch), explain(relaunch)
    done = fab.on(sbx, "status", "--wait", "--json", "--host", "sbx-1", timeout=180)
    assert done.rc == 0, explain(done)
    resumed = status_records(done)["sbx-1"]
    # (alone, sbx-1 now runs the whole input: the 4 already done are kept, not redone)
    assert resumed["state"] == "finished" and resumed["done"] == resumed["total"], resumed
    assert resumed["key"]["limit"] == 0.0096 and resumed["key"]["own"] is True
    assert round(cost * 4.5, 6) in {k.limit for k in sbx.api.keys.live()}  # the host's key


def test_a_management_api_failure_mid_deploy_leaves_no_orphan(make_sandbox, fab) -> None:
    sbx = minted_sandbox(make_sandbox, 3)
    keys = sbx.api.keys
    # sbx-1's create succeeds at the API but its answer is lost; sbx-3 cannot take the key.
    # (Aimed by name: which host's call arrives first or second varies from run to run.)
    keys.inject(MgmtFault("create", 502, after_effect=True, subject=":sbx-1"))
    broken = sbx.container("sbx-3")
    run_as(broken, "mkdir", "-p", str(key_file(broken).parent.parent))
    run_as(broken, "touch", str(key_file(broken).parent))  # a file where the folder goes
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc != 0, explain(deploy)
    text = flat(deploy)
    assert "found by name and revoked" in text, explain(deploy)
    assert "placing the minted key failed" in text and "was revoked again" in text
    # Every key still alive is the one a host holds; nothing else lives.
    held = {record(c)["hash"] for c in sbx.containers
            if (key_file(c).parent / "openrouter.key.minted.json").exists()}
    assert len(held) == 1 and {k.hash for k in keys.live()} == held
    assert len(keys.keys) + len(keys.deleted) == 3  # three minted in all, two revoked again

    # The fault gone and the host repaired, the same command finishes the job.
    run_as(broken, "rm", str(key_file(broken).parent))
    fixed = fab.on(sbx, "deploy")
    assert fixed.rc == 0, explain(fixed)
    assert len(keys.live()) == 3


def test_cleanup_with_the_state_dir_deleted_still_removes_and_revokes(make_sandbox, fab) -> None:
    """Issue 8: a wiped state dir (or another clone) must not hide a placed key."""
    sbx = minted_sandbox(make_sandbox, 2)
    set_host_vars(sbx, "sbx-2", key_mode="plain")
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    assert key_file(sbx.container("sbx-2")).read_text() == sbx.api_key
    assert len(sbx.api.keys.live()) == 1
    shutil.rmtree(sbx.state_dir)

    st = fab.on(sbx, "status", "--json")  # "key placed" read from the hosts themselves
    records = status_records(st)
    assert records["sbx-1"]["key"]["mode"] == "minted" and records["sbx-2"]["key"]["mode"] == "plain"
    assert "uncapped" in flat(st) and "never expires" in flat(st), explain(st)

    cleanup = fab.on(sbx, "cleanup-secrets")
    assert cleanup.rc == 0, explain(cleanup)
    assert all(not key_file(c).exists() for c in sbx.containers)
    assert sbx.api.keys.live() == []
    assert "removed 2 key file(s)" in flat(cleanup) and "revoked 1 child key(s)" in flat(cleanup), \
        explain(cleanup)
