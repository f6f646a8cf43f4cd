"""Jobs without sshd: state derivation, smoke output, the status table; the launch and stop
plans as data (`--dry-run`); and launch, status, logs and stop run on fake hosts
(handoff.testing.local) with the `sleeper` test role, whose job is a real detached process."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from handoff import commands, deploy, plan
from handoff.errors import RoleError, UsageError
from handoff.jobs import launch, smoke, status, stop
from handoff.jobs.state import OK_STATES, JobState, job_name
from tests.unit.conftest import Workstation

KEY = "sk-or-v1-" + "ab" * 32


def test_job_state() -> None:
    def state(**kw: object) -> str:
        return JobState.from_json({"job_dir": "/j", **kw}).state

    assert state(alive=True, status={"state": "running"}) == "running"
    assert state(alive=True, status=None) == "running"
    assert state(alive=True, status={"state": "stopped"}) == "stopping"
    assert state(alive=True, status={"state": "finished"}) == "running"  # exiting
    assert state(alive=False, pid=5, status={"state": "running"}) == "dead"
    assert state(alive=False, pid=5, status={"state": "finished"}) == "finished"
    assert state(alive=False, pid=5, status={"state": "stopped"}) == "stopped"
    assert state(alive=False, pid=5, status=None) == "dead"
    assert state(alive=False, pid=None, status=None) == "none"
    assert {"running", "finished"} <= OK_STATES and "stopped" not in OK_STATES


def test_job_name(ws: Workstation) -> None:
    [a] = ws.targets("a")
    assert job_name(a, None) == "generator" and job_name(a, "b3") == "b3"
    for bad in ("../x", ".hidden", "a/b"):
        with pytest.raises(UsageError, match="plain folder name"):
            job_name(a, bad)


def test_parse_smoke_and_credit() -> None:
    text = (
        "model:     moonshotai/kimi-k2.5\n"
        "served by: DeepInfra (moonshotai/kimi-k2.5)\n"
        "latency:   0.42 s\n"
        "tokens:    prompt 9, completion 32\n"
        "cost:      $0.000100\n"
        "answer:    'ready'\n"
        "key:       usage $0.000300, limit $10.000000, left $9.999700\n"
        "smoke: OK\n"
    )
    f = smoke.parse(text)
    assert f["served by"].startswith("DeepInfra") and f["latency"] == "0.42 s" and f["smoke"] == "OK"
    assert smoke.credit(f["key"]) == "$9.999700 left of $10.000000 (used $0.000300)"
    child = "usage $0.000100, limit $0.500000, left $0.499900, expires 2026-12-01T10:00:00Z"
    assert smoke.credit(child) == \
        "$0.499900 left of $0.500000 (used $0.000100), expires 2026-12-01T10:00:00Z"
    assert smoke.credit("usage $0.1, limit none, left unlimited, expires never") == \
        "unlimited left (used $0.1)"
    assert smoke.credit("usage unknown (GET /key answered 404)") == "usage unknown (GET /key answered 404)"


def test_eta_uses_the_one_formatter() -> None:
    assert status.eta({"total": 100, "done": 40, "failed": 10, "rate_rps": 5}) == "10s"
    assert status.eta({"total": 100000, "done": 0, "failed": 0, "rate_rps": 10}) == "2h46m"
    assert status.eta({"total": None, "rate_rps": 5}) == "-"
    assert status.eta({"total": 10, "done": 10, "rate_rps": 5}) == "0s"


def test_status_record_has_the_contract_fields() -> None:
    view = status.JobView("h", "generator", "running", JobState.from_json({
        "job_dir": "/j", "alive": True, "pid": 7, "keys": {"/k": True},
        "status": {"state": "running", "done": 3, "failed": 1, "total": 9, "cost": 0.25}}))
    rec = view.record()
    assert {"host", "job", "state", "done", "failed", "total", "cost", "alive"} <= set(rec)
    assert (rec["done"], rec["failed"], rec["total"], rec["alive"]) == (3, 1, 9, True)
    assert rec["secrets_placed"] == ["/k"]


# --- plans as data ------------------------------------------------------------------------


def test_launch_plan_is_data_and_needs_no_host(ws: Workstation, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    p = launch.plan(ws.targets("a,b", flags={"concurrency": 7}), local_input=str(prompts),
                    remote_input=None, job_flag=None)
    assert [[s.action for s in hp.steps] for hp in p.hosts] == [["probe", "push-input", "start-job"]] * 2
    assert p.all_or_nothing  # no host starts unless every host passed its probe
    start_a = p.for_host("a")[-1]
    # One job per dataset, named after the file's stem.
    assert start_a.params == {"job": "p", "input": "~/.handoff/data/p.jsonl", "shard": "0/2",
                              "hosts": 2, "max_cost": None, "share": None}
    assert p.for_host("b")[-1].params["shard"] == "1/2"
    assert "--concurrency 7" in start_a.detail and "--shard 0/2" in start_a.detail
    assert "~/.handoff/jobs/p/output.jsonl" in start_a.detail
    assert "--provider" not in start_a.detail  # the payload's own rule: OpenRouter only
    assert [s.changes for s in p.for_host("a")] == [False, True, True]
    alone = launch.plan(ws.targets("a"), local_input=None, remote_input="/data/x.jsonl", job_flag="b3")
    assert [s.action for s in alone.hosts[0].steps] == ["probe", "start-job"]
    assert alone.hosts[0].steps[-1].params["job"] == "b3"
    assert alone.hosts[0].steps[-1].params["shard"] is None
    stem = launch.plan(ws.targets("a"), local_input=None, remote_input="/data/B4.jsonl", job_flag=None)
    assert stem.hosts[0].steps[-1].params["job"] == "B4"
    provider = launch.plan(ws.targets("a", flags={"provider": {"only": ["x"]}}), local_input=None,
                           remote_input="/d/x.jsonl", job_flag=None)
    assert """--provider '{"only":["x"]}'""" in provider.hosts[0].steps[-1].detail  # set: passed


def test_launch_plan_refuses_what_no_host_can_fix(ws: Workstation, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not both"):
        launch.plan(ws.targets("a"), local_input="x", remote_input="y", job_flag=None)
    with pytest.raises(UsageError, match="no such file"):
        launch.plan(ws.targets("a"), local_input=str(tmp_path / "none"), remote_input=None, job_flag=None)
    with pytest.raises(UsageError, match="no input"):
        launch.plan(ws.targets("a"), local_input=None, remote_input=None, job_flag=None)
    with pytest.raises(RoleError, match="model_dir"):
        launch.plan(ws.targets("a", role="extractor", flags={"gpus": 1}), local_input=None,
                    remote_input="/in.jsonl", job_flag=None)


def test_launch_and_stop_dry_runs_contact_no_host(ws: Workstation, capfd: pytest.CaptureFixture[str]) -> None:
    touched: list[str] = []
    commands.CONNECT = lambda target: touched.append(target.label)  # type: ignore[assignment,return-value]
    assert commands.launch("a,b", None, local_input=None, remote_input="/in.jsonl", flags={},
                           dry_run=True) == 0
    assert commands.stop("a,b", None, timeout=5, dry_run=True) == 0
    out = capfd.readouterr().out
    assert touched == []
    assert out.count("dry run") == 2 and "start job in detached" in out
    assert "SIGTERM each, wait up to 5 s" in out


def test_stop_plan(ws: Workstation) -> None:
    p = stop.plan(ws.targets("a,s"), job_flag=None, timeout=0)  # every running job
    assert [(hp.steps[0].action, hp.steps[0].params) for hp in p.hosts] == \
        [("stop-jobs", {"job": None, "timeout": 0.0})] * 2
    assert "do not wait" in p.hosts[0].steps[0].description
    one = stop.plan(ws.targets("a"), job_flag="B3", timeout=5)
    assert one.hosts[0].steps[0].params == {"job": "B3", "timeout": 5.0}


# --- on fake hosts -------------------------------------------------------------------------


def deployed(ws: Workstation, spec: str) -> None:
    reports = plan.execute(deploy.build(ws.targets(spec), key=KEY), connect=ws.connect)
    assert all(r.ok for r in reports), [r.error for r in reports]


def job_dir(ws: Workstation, label: str, job: str = "sleeper") -> Path:
    return ws.remote_dir(label) / "jobs" / job


def wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def gone(pid: int) -> bool:
    """The process exited (a zombie waiting for its reaper counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_launch_status_logs_stop_on_fake_hosts(ws: Workstation, tmp_path: Path,
                                               capfd: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    deployed(ws, "s,t")
    assert commands.launch("s,t", None, local_input=str(prompts), remote_input=None, flags={}) == 0
    pids = {}
    for i, label in enumerate("st"):
        jd = job_dir(ws, label)
        meta = json.loads((jd / "job.json").read_text())
        assert meta["shard"] == f"{i}/2" and meta["role"] == "sleeper"
        assert meta["input"] == str(ws.remote_dir(label) / "data" / "in.jsonl")
        assert (ws.remote_dir(label) / "data" / "in.jsonl").read_bytes() == prompts.read_bytes()
        pids[label] = int((jd / "pid").read_text())
        assert wait_for(lambda jd=jd: (jd / "status.json").exists())
    out = capfd.readouterr().out
    assert "started sleeper" in out and "shard 1/2" in out

    # A second copy is refused; the input, unchanged, is not pushed again.
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None, flags={}) == 1
    assert "already running" in capfd.readouterr().out.replace("\n", " ")

    assert commands.status("s,t", None, as_json=True) == 0
    records = [json.loads(line) for line in capfd.readouterr().out.splitlines() if line.startswith("{")]
    assert [(r["host"], r["state"], r["alive"], r["pid"]) for r in records] == \
        [("s", "running", True, pids["s"]), ("t", "running", True, pids["t"])]
    assert all(r["secrets_placed"] for r in records)  # the ledger's key, present on the host

    assert commands.logs("s", None, lines=5) == 0
    assert "sleeper: running" in capfd.readouterr().out

    assert commands.stop("s,t", None, timeout=20) == 0
    out = capfd.readouterr().out
    assert out.count("sent SIGTERM") == 2 and "state now stopped" in out
    assert all(gone(pids[label]) for label in "st")
    assert commands.status("s", None, as_json=True) == 1  # stopped: not running or finished
    assert json.loads(capfd.readouterr().out.splitlines()[-1])["state"] == "stopped"
    assert commands.stop("s", None, timeout=20) == 0  # nothing to stop: skipped, still fine
    assert "no job is running (1 job(s) on the host: sleeper)" in capfd.readouterr().out
    assert commands.stop("s", None, job="sleeper", timeout=20) == 0
    assert "is not running (state stopped)" in capfd.readouterr().out

    # Relaunch: the job resumes in the same folder; the input is the same, not pushed again.
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None, flags={}) == 0
    assert "unchanged on the host" in capfd.readouterr().out
    assert commands.stop("s", None, timeout=20) == 0


def remote_input(ws: Workstation, label: str) -> str:
    """A prompts file already on the fake host: `--remote-input`'s argument."""
    (ws.home(label) / "in.jsonl").write_text('{"id": 1, "prompt": "hi"}\n')
    return "~/in.jsonl"


def test_launch_reports_an_instant_crash_with_the_log(ws: Workstation,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    deployed(ws, "s")
    rc = commands.launch("s", None, local_input=None, remote_input=remote_input(ws, "s"),
                         flags={"mode": "crash"})
    assert rc == 1
    out = capfd.readouterr().out.replace("\n", " ")
    assert "exited right after start" in out and "simulated failure" in out


def test_launch_of_a_job_that_finishes_at_once_is_fine(ws: Workstation,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    deployed(ws, "s")
    assert commands.launch("s", None, local_input=None, remote_input=remote_input(ws, "s"),
                           flags={"mode": "finish"}) == 0
    assert "ran and finished already" in capfd.readouterr().out
    assert commands.status("s", None) == 0


def test_launch_needs_a_release_and_the_key(ws: Workstation, capfd: pytest.CaptureFixture[str]) -> None:
    assert commands.launch("s", None, local_input=None, remote_input="/in.jsonl", flags={}) == 1
    assert "no release on the host; run `fab deploy --host s` first" in capfd.readouterr().out.replace("\n", " ")
    plan.execute(deploy.build(ws.targets("s"), key=None), connect=ws.connect)  # release, no key
    assert commands.launch("s", None, local_input=None, remote_input="/in.jsonl", flags={}) == 1
    assert "fab push-key --host s" in capfd.readouterr().out.replace("\n", " ")
    assert not job_dir(ws, "s").exists()


def test_a_reused_pid_is_not_the_job(ws: Workstation) -> None:
    """The pid file names a live process that is not the job (the pid was reused): dead."""
    from handoff.jobs.state import read

    [s_target] = ws.targets("s")
    jd = job_dir(ws, "s")
    jd.mkdir(parents=True)
    (jd / "pid").write_text(f"{os.getpid()}\n")  # this test process: alive, not the job
    (jd / "status.json").write_text('{"state": "running"}')
    with ws.connect(s_target) as session:
        current = read(session, "sleeper")
    assert current.pid == os.getpid() and not current.alive and current.state == "dead"


def test_status_marks_an_unreadable_host_unreachable(ws: Workstation,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    deployed(ws, "s")
    real = commands.CONNECT

    def flaky(target):  # type: ignore[no-untyped-def]
        if target.label == "t":
            from handoff.errors import ConnectError

            raise ConnectError("t: connection refused; is sshd running and is the port right?")
        return real(target)

    commands.CONNECT = flaky
    assert commands.status("s,t", None) == 1
    out = capfd.readouterr().out
    assert "unreachable" in out and "connection refused" in out and "not running or finished: s, t" in out


def test_sleeper_stops_on_sigterm_directly(tmp_path: Path) -> None:
    """The test role's job itself behaves as the tests assume (SIGTERM -> stopped, exit 3)."""
    import subprocess
    import sys

    from tests.unit.conftest import SLEEPER

    proc = subprocess.Popen([sys.executable, str(SLEEPER), str(tmp_path), "in", "run"],
                            stdout=subprocess.DEVNULL)
    assert wait_for(lambda: (tmp_path / "status.json").exists())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 3
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "stopped"
