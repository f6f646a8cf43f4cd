"""Minted child keys on fake hosts (handoff.testing.local) against the fake management API
over real HTTP: one child key per host with the configured limit and expiry, reused while
it lives, replaced (and the old one revoked) when it is not, never half-done; the key
vars checked before any host is touched; cleanup revokes what the ledger or the hosts
name, also for an unreachable host and with the state dir gone; status and launch read
the child key through the management API."""

from __future__ import annotations

import json
import stat
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from handoff import errors
from handoff.cli import commands
from handoff.config import os_keyring, state
from handoff.errors import ConnectError
from handoff.ops import deploy
from handoff.ops.jobs import budget, status
from handoff.ops.secrets import settings
from handoff.run import plan
from handoff.run.plan import Skipped
from handoff.testing.fakekeys import ROOT, MgmtFault
from handoff.testing.local import LocalSession
from tests.support.workstation import KeyedAPI, MemoryKeyring, Workstation

LIMIT = 2.0


@pytest.fixture
def minted(ws: Workstation, keyed_api: KeyedAPI, memory: MemoryKeyring) -> KeyedAPI:
    """The workstation's inventory points at the fake (key_limit set); the keyring holds
    both the API key and the management key."""
    inventory = ws.root / "project" / "inventory" / "hosts.yml"
    text = inventory.read_text().replace("defaults: {", f"defaults: {{key_limit: {LIMIT}, ")
    inventory.write_text(text.replace("http://127.0.0.1:9/api/v1", keyed_api.url))
    memory.store[("openrouter", "api-key")] = keyed_api.api_key
    memory.store[("openrouter", "management-key")] = keyed_api.management_key
    return keyed_api


def creds(api: KeyedAPI, management: bool = True) -> settings.Credentials:
    return settings.Credentials(api.api_key, api.management_key if management else None)


def push(ws: Workstation, spec: str, key: Any) -> list[Any]:
    return plan.execute(deploy.build(ws.targets(spec), verify=False, script=False, key=key),
                        connect=ws.connect)


def keyfile(ws: Workstation, label: str) -> Path:
    return ws.remote_dir(label) / "secrets" / "openrouter.key"


def record_of(ws: Workstation, label: str) -> dict[str, Any]:
    return json.loads((keyfile(ws, label).parent / "openrouter.key.minted.json").read_text())


def test_push_mints_one_capped_expiring_key_per_host_and_reuses_it(
        ws: Workstation, minted: KeyedAPI) -> None:
    before = datetime.now(timezone.utc)
    reports = push(ws, "a,b", creds(minted))
    assert all(r.ok for r in reports), [r.error for r in reports]
    live = minted.keys.live()
    assert len(live) == 2 and {k.limit for k in live} == {LIMIT}
    for k in live:  # expires_at = now + key_ttl_hours (24), to the second, in UTC
        assert k.expires_at is not None
        assert timedelta(hours=24) - timedelta(seconds=5) <= k.expires_at - before <= \
            timedelta(hours=24, seconds=5)
    # Named so the API's own list finds them: handoff:<this workstation>:<host>.
    by_name = {k.name.rsplit(":", 1)[1]: k for k in live}
    assert sorted(by_name) == ["a", "b"]
    assert by_name["a"].name == f"handoff:{state.workstation_id()}:a"
    for label in ("a", "b"):
        held = keyfile(ws, label).read_text()
        assert held == by_name[label].key  # THE child key, not the account's nor the management key
        assert held not in (minted.api_key, minted.management_key)
        assert stat.S_IMODE(keyfile(ws, label).stat().st_mode) == 0o600
        rec = record_of(ws, label)
        assert rec["hash"] == by_name[label].hash and rec["api"] == minted.url
        assert rec["fingerprint"] == os_keyring.fingerprint(held)
        assert held not in json.dumps(rec)
    ledger = state.ledger_path().read_text()
    assert all(k.key not in ledger for k in live) and minted.management_key not in ledger
    assert {e.key_hash for e in state.live_minted()} == {k.hash for k in live}
    assert {e.key_hash for e in state.placed()} == {k.hash for k in live}

    again = push(ws, "a,b", creds(minted))
    assert [r.summary for r in again] == ["no change needed"] * 2
    assert any("reused, nothing minted" in str(line) for line in again[0].lines)
    assert minted.keys.calls["create"] == 2 and len(minted.keys.live()) == 2


def test_a_dead_or_dying_key_is_replaced_and_the_old_one_revoked(
        ws: Workstation, minted: KeyedAPI) -> None:
    push(ws, "a,b,s", creds(minted))
    old = {label: record_of(ws, label)["hash"] for label in ("a", "b", "s")}
    minted.keys.expire(old["a"])  # expired
    minted.keys.keys[old["b"]].expires_at = datetime.now(timezone.utc) + timedelta(minutes=30)
    del minted.keys.keys[old["s"]]  # revoked behind our back
    reports = push(ws, "a,b,s", creds(minted))
    assert all(r.ok for r in reports), [r.error for r in reports]
    new = {label: record_of(ws, label)["hash"] for label in ("a", "b", "s")}
    assert all(new[label] != old[label] for label in new)
    assert {k.hash for k in minted.keys.live()} == set(new.values())
    assert old["a"] not in minted.keys.keys and old["b"] not in minted.keys.keys  # revoked
    text = " ".join(str(line) for r in reports for line in r.lines)
    assert "expires" in text and "was revoked" in text and "revoked its earlier child key" in text
    assert {e.key_hash for e in state.live_minted()} == set(new.values())


def test_a_failed_placement_revokes_the_key_it_minted(ws: Workstation, minted: KeyedAPI) -> None:
    (ws.remote_dir("a")).mkdir(parents=True)
    (ws.remote_dir("a") / "secrets").write_text("a file where the key's folder should be")
    [report] = push(ws, "a", creds(minted))
    assert not report.ok and "placing the minted key failed" in str(report.error)
    assert "was revoked again; nothing is left behind" in str(report.error)
    assert minted.keys.live() == [] and minted.keys.calls["create"] == 1
    assert state.live_minted() == []


def test_a_create_whose_answer_was_lost_is_found_by_name_and_deleted(
        ws: Workstation, minted: KeyedAPI) -> None:
    minted.keys.inject(MgmtFault("create", 502, after_effect=True))
    [report] = push(ws, "a", creds(minted))
    assert not report.ok and "found by name and revoked" in str(report.error)
    assert minted.keys.live() == [] and minted.keys.calls["list"] >= 1
    assert not keyfile(ws, "a").exists()


def test_management_errors_are_reported_per_host_with_the_fix(ws: Workstation,
                                                               minted: KeyedAPI) -> None:
    wrong = settings.Credentials(None, "sk-or-v1-" + "0" * 64)
    reports = push(ws, "a,b", wrong)
    assert [r.ok for r in reports] == [False, False]
    assert all("fab set-key --username management-key" in str(r.error) for r in reports)
    assert all("0" * 64 not in str(r.error) for r in reports)
    plain_as_management = settings.Credentials(None, minted.api_key)
    [report] = push(ws, "a", plain_as_management)
    assert "not a management key" in str(report.error)
    minted.keys.inject(MgmtFault("create", 429, times=-1))
    [report] = push(ws, "a", creds(minted))
    assert "rate-limiting" in str(report.error)
    assert minted.keys.live() == [] and not keyfile(ws, "a").exists()


def test_key_vars_are_checked_before_any_host_is_touched(ws: Workstation, minted: KeyedAPI,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    touched: list[str] = []
    commands.common.CONNECT = lambda target: touched.append(target.label)  # type: ignore[assignment,return-value]
    inventory = ws.root / "project" / "inventory" / "hosts.yml"
    inventory.write_text(inventory.read_text().replace(f"key_limit: {LIMIT}, ", "key_mode: minted, "))
    assert commands.deploy("a") == 2
    assert "key_mode minted needs key_limit" in capfd.readouterr().err.replace("\n", " ")
    inventory.write_text(inventory.read_text().replace("key_mode: minted, ", "key_mode: shiny, "))
    assert commands.push_key("a") == 2
    assert "key_mode 'shiny' is not one of plain, minted, auto" in capfd.readouterr().err
    assert touched == []


def test_modes_choose_the_key(ws: Workstation, minted: KeyedAPI, memory: MemoryKeyring) -> None:
    # auto without a management key: the API key, as before
    assert all(r.ok for r in push(ws, "a", creds(minted, management=False)))
    assert keyfile(ws, "a").read_text() == minted.api_key and minted.keys.keys == {}
    # auto with one: a child key replaces it
    assert all(r.ok for r in push(ws, "a", creds(minted)))
    assert keyfile(ws, "a").read_text() != minted.api_key and len(minted.keys.live()) == 1
    # plain, forced by the var although a management key is stored: the record goes too
    [target] = ws.targets("a", flags={"key_mode": "plain"})
    p = deploy.build([target], verify=False, script=False, key=creds(minted))
    assert "place API key" in p.hosts[0].steps[-1].description
    assert all(r.ok for r in plan.execute(p, connect=ws.connect))
    assert keyfile(ws, "a").read_text() == minted.api_key
    assert not (keyfile(ws, "a").parent / "openrouter.key.minted.json").exists()
    # the replaced child key is still live, and the ledger still lists it: cleanup revokes it
    assert len(state.live_minted()) == 1
    # the keyring read follows the modes: minted needs the management key
    memory.store.pop(("openrouter", "management-key"))
    with pytest.raises(errors.ManagementKeyMissing, match="fab set-key --username management-key"):
        settings.read_credentials("openrouter", "api-key", {"minted"})
    assert settings.read_credentials("openrouter", "api-key", {"auto"}).api_key == minted.api_key


def test_cleanup_removes_the_files_and_revokes_the_child_keys(
        ws: Workstation, minted: KeyedAPI, capfd: pytest.CaptureFixture[str]) -> None:
    push(ws, "a,b", creds(minted))
    assert commands.cleanup_secrets() == 0
    out = capfd.readouterr().out
    assert minted.keys.live() == [] and minted.keys.keys == {}
    assert not keyfile(ws, "a").exists() and not keyfile(ws, "b").exists()
    assert not list((keyfile(ws, "a").parent).iterdir())  # the record is gone too
    assert "revoked 2 child key(s), each confirmed gone (GET answers 404)" in out
    assert state.live_minted() == [] and state.placed() == []
    assert minted.keys.calls["get"] >= 2  # each revocation proved by a GET
    assert commands.cleanup_secrets() == 0  # idempotent
    assert "removed 0 key file(s), 4 already absent" in capfd.readouterr().out


def test_cleanup_with_the_state_dir_gone_still_removes_and_revokes(
        ws: Workstation, minted: KeyedAPI, capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 8: the hosts themselves are checked; the record beside the key names the child
    key to revoke."""
    push(ws, "a", creds(minted))
    push(ws, "b", minted.api_key)  # a plain key, too
    state.ledger_path().unlink()
    assert commands.cleanup_secrets() == 0
    assert not keyfile(ws, "a").exists() and not keyfile(ws, "b").exists()
    assert minted.keys.live() == []
    assert "revoked 1 child key(s)" in capfd.readouterr().out


def test_cleanup_revokes_the_key_of_an_unreachable_host(
        ws: Workstation, minted: KeyedAPI, capfd: pytest.CaptureFixture[str]) -> None:
    push(ws, "a,b", creds(minted))
    a_hash = record_of(ws, "a")["hash"]

    def down_a(target: Any) -> LocalSession:
        if target.label == "a":
            raise ConnectError("a: no SSH answer from 127.0.0.2:2201 within 10 s")
        return ws.connect(target)

    commands.common.CONNECT = down_a  # type: ignore[assignment]
    assert commands.cleanup_secrets() == 1
    captured = capfd.readouterr()
    text = (captured.out + captured.err).replace("\n", " ")
    assert minted.keys.live() == [] and a_hash not in minted.keys.keys
    assert keyfile(ws, "a").exists() and not keyfile(ws, "b").exists()
    assert "may remain there, but the child key it holds is revoked, so it is dead" in text
    assert a_hash[:12] in text
    # back up: the file goes, the key is already revoked
    commands.common.CONNECT = ws.connect
    assert commands.cleanup_secrets() == 0
    assert not keyfile(ws, "a").exists()


def test_cleanup_refuses_a_host_with_a_running_job_unless_forced(
        ws: Workstation, minted: KeyedAPI, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 32 #7: revoking the key under a running job kills it with 401: the host is
    left as it is (file and child key), exit 1 naming the job; --force goes on, warning."""
    from handoff.ops.jobs import launch

    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    assert all(r.ok for r in plan.execute(deploy.build(ws.targets("s"), key=creds(minted)),
                                          connect=ws.connect))
    started = plan.execute(launch.plan(ws.targets("s"), local_input=str(prompts), remote_input=None,
                                       job_flag=None), connect=ws.connect)
    assert all(r.ok for r in started), [r.error for r in started]
    capfd.readouterr()
    assert commands.cleanup_secrets("s") == 1
    err = " ".join(capfd.readouterr().err.split())
    assert "s: job sleeper (pid" in err and "still runs there: nothing was removed or revoked" in err
    assert "fab stop --host s" in err and "--force" in err
    assert keyfile(ws, "s").exists() and len(minted.keys.live()) == 1  # untouched
    assert commands.cleanup_secrets("s", force=True) == 0
    out = " ".join(capfd.readouterr().out.split())
    assert "warning (--force):" in out and "sleeper (pid" in out and "still running on s" in out
    assert "stops, resumable (exit 3)" in out and "fab push-key --host s" in out
    assert not keyfile(ws, "s").exists() and minted.keys.live() == []


def test_status_shows_each_hosts_key(ws: Workstation, minted: KeyedAPI) -> None:
    push(ws, "a", creds(minted))
    push(ws, "b", minted.api_key)
    watcher = status.Watcher(ws.targets("a,b"), None, ws.connect,
                             key_lookup=settings.ManagementKeys().lookup)
    try:
        views = {v.host: v for v in watcher.collect()}
    finally:
        watcher.close()
    a, b = views["a"].key, views["b"].key
    assert a is not None and b is not None
    assert (a.mode, b.mode) == ("minted", "plain")
    assert a.spend().startswith("used $0.0000 of $2.0000, expires in 23h")
    rec = views["a"].record()["key"]
    assert rec["limit"] == LIMIT and rec["usage"] == 0.0 and rec["expires_at"].endswith("Z")
    assert views["b"].record()["key"] == {"placed": True, "mode": "plain"}
    notes = status.table_notes(list(views.values()))
    assert len(notes) == 1 and notes[0].startswith("b: the placed key is your own API key")
    assert "uncapped" in notes[0] and "never expires" in notes[0]
    # revoked behind the host's back: said so
    del minted.keys.keys[record_of(ws, "a")["hash"]]
    watcher = status.Watcher(ws.targets("a"), None, ws.connect,
                             key_lookup=settings.ManagementKeys().lookup)
    try:
        [view] = watcher.collect()
    finally:
        watcher.close()
    assert view.key is not None and "REVOKED" in view.key.spend()


def test_a_budget_is_its_jobs_own_child_key(ws: Workstation, minted: KeyedAPI, tmp_path: Path,
                                            capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 32 #1, #5: a job with a budget runs on a child key of its own, limited to its
    host's share; the host's key (what jobs without a budget run on) is never changed; a
    relaunch reuses the job's key; one whose key would have nothing left is refused before
    anything starts, naming host, job, used and limit; forget revokes it."""
    from handoff.ops.jobs import forget, launch

    assert budget.host_share(10.0, 4) == 2.5
    assert budget.new_limit(usage=0.5, share=2.5, spent=1.0) == 2.0
    assert budget.new_limit(usage=0.5, share=2.5, spent=3.0) == 0.5  # spent: nothing more
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    assert all(r.ok for r in plan.execute(deploy.build(ws.targets("s,t"), key=creds(minted)),
                                          connect=ws.connect))
    host_keys = {k.hash for k in minted.keys.live()}

    def launched(max_cost: float) -> list[Any]:
        p = launch.plan(ws.targets("s,t", flags={"max_cost": max_cost, "act": "finish"}),
                        local_input=str(prompts), remote_input=None, job_flag=None)
        launch.private_of(p).management = minted_keys.JobKeys()
        return plan.execute(p, connect=ws.connect)

    from handoff.ops.secrets import minted as minted_keys

    p = launch.plan(ws.targets("s,t", flags={"max_cost": 0.5}), local_input=str(prompts),
                    remote_input=None, job_flag=None)
    assert [s.action for s in p.hosts[0].steps] == ["probe", "check-keys", "push-input", "job-key",
                                                   "start-job", "check-jobs"]
    reports = launched(0.5)
    assert all(r.ok for r in reports), [r.error for r in reports]
    live = minted.keys.live()
    own = [k for k in live if k.hash not in host_keys]
    assert sorted(k.limit for k in own) == [0.25, 0.25]  # $0.50 over 2 hosts, one key each
    assert {k.limit for k in live if k.hash in host_keys} == {LIMIT}  # the hosts' keys untouched
    assert sorted(k.name.rsplit(":", 2)[1:] for k in own) == [["s", "sleeper"], ["t", "sleeper"]]
    job_key = keyfile(ws, "s").parent / "jobs" / "sleeper.key"
    assert stat.S_IMODE(job_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(job_key.parent.stat().st_mode) == 0o700
    assert job_key.read_text() in {k.key for k in own}
    meta = json.loads((ws.remote_dir("s") / "jobs" / "sleeper" / "job.json").read_text())
    assert meta["key"] == "job"

    def finished(host: str) -> bool:
        try:
            st = json.loads((ws.remote_dir(host) / "jobs" / "sleeper" / "status.json").read_text())
        except (OSError, ValueError):
            return False
        return st.get("state") == "finished"
    deadline = time.monotonic() + 60  # the sleepers end at once; a loaded machine is slow
    while not (finished("s") and finished("t")) and time.monotonic() < deadline:
        time.sleep(0.05)
    again = launched(0.5)  # finished already: nothing started, no key minted
    assert all(r.ok for r in again) and len(minted.keys.live()) == 4, [r.error for r in again]

    # The job spent its share (its status says so): a relaunch with that budget is refused
    # before anything starts anywhere, naming host, job, used and limit.
    status_file = ws.remote_dir("s") / "jobs" / "sleeper" / "status.json"
    st = json.loads(status_file.read_text())
    status_file.write_text(json.dumps({**st, "state": "stopped", "cost": 0.3}))
    capfd.readouterr()
    refused = launched(0.5)
    assert not any(r.ok for r in refused)
    [bad] = [r for r in refused if "nothing changed" not in str(r.error)]
    assert bad.target.label == "s" and "job sleeper's key has nothing left: used $0.0000 of " \
        "$0.0000 (the job's share of the budget here is $0.2500, and it spent $0.3000)" \
        in str(bad.error), bad.error
    assert "Nothing was started on any host" in str(bad.error)
    assert all("start-job" not in str(line) for r in refused for line in r.lines)

    # forget revokes the job's own keys and removes the files; the hosts' keys live on.
    p = forget.plan(ws.targets("s,t"), job_flag="sleeper")
    p.private = forget.ForgetPrivate(minted_keys.JobKeys())
    done = plan.execute(p, connect=ws.connect)
    assert all(r.ok for r in done), [r.error for r in done]
    assert {k.hash for k in minted.keys.live()} == host_keys and not job_key.exists()


def test_the_job_runs_on_the_child_key(ws: Workstation, minted: KeyedAPI) -> None:
    """The fake counts which key served each request: the payload's smoke test from a
    minted host uses that host's child key, never the account's."""
    from handoff.ops.jobs import smoke

    assert all(r.ok for r in plan.execute(deploy.build(ws.targets("a"), key=creds(minted)),
                                          connect=ws.connect))
    [report] = smoke.run(ws.targets("a"), ws.connect)
    assert report.ok, report.error
    child = record_of(ws, "a")["hash"]
    assert minted.keys.served_by == {child: 1} and ROOT not in minted.keys.served_by
    assert "of $2.000000" in smoke.credit(report.data_as(smoke.Smoked).fields["key"])


def test_plans_say_what_minting_does(ws: Workstation, minted: KeyedAPI) -> None:
    p = deploy.build(ws.targets("a"), verify=False, script=False, key=creds(minted))
    step = p.hosts[0].steps[-1]
    assert "mint a child key for a (limit $2.0000, expires 24 h after minting)" in step.description
    assert f"POST {minted.url}/keys" in step.detail and "DELETE every earlier key" in step.detail
    assert minted.management_key not in repr(p.hosts)
    assert isinstance(Skipped("x"), str)


def test_jobs_on_a_used_up_host_key_are_refused_before_anything_starts(
        ws: Workstation, minted: KeyedAPI, tmp_path: Path) -> None:
    """Issue 32 #5, a host's key: jobs without a budget run on it; used up to its key_limit,
    the launch is refused naming host, job, used and limit, and starts nothing."""
    from handoff.ops.jobs import launch
    from handoff.ops.secrets import minted as minted_keys

    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    assert all(r.ok for r in plan.execute(deploy.build(ws.targets("s"), key=creds(minted)),
                                          connect=ws.connect))
    [key] = minted.keys.live()
    key.usage = LIMIT  # spent to its limit
    p = launch.plan(ws.targets("s"), local_input=str(prompts), remote_input=None, job_flag=None)
    launch.private_of(p).management = minted_keys.JobKeys()
    [report] = plan.execute(p, connect=ws.connect)
    assert not report.ok
    assert ("s: the host's key has nothing left for job sleeper: used $2.0000 of $2.0000 "
            "(key_limit); nothing was started on any host") in str(report.error)
    assert not (ws.remote_dir("s") / "jobs" / "sleeper").exists()
    assert not (ws.remote_dir("s") / "data" / "in.jsonl").exists()  # not even pushed
