"""Jobs without sshd: state derivation, smoke output, the status table; the launch and stop
plans as data (`--dry-run`); and launch, status, logs and stop run on fake hosts
(handoff.testing.local) with the `sleeper` test role, whose job is a real detached process."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from handoff.cli import commands
from handoff.defaults import BUILTIN_VARS
from handoff.errors import RoleError, UsageError
from handoff.host import untrusted
from handoff.ops import deploy
from handoff.ops.jobs import launch, smoke, status, stop
from handoff.ops.jobs.state import OK_STATES, JobState, job_name
from handoff.run import plan
from tests.support.workstation import SLEEPER_ROLE, Workstation

KEY = "sk-or-v1-" + "ab" * 32

# What the start watch catches (an instant crash, an instant finish) needs its default length;
# the other tests run with the fixture's short one.
WATCH_S = BUILTIN_VARS["start_watch_s"]


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


def test_batch_notes_show_the_batches_and_a_dead_job_with_live_ones() -> None:
    running = status.JobView("h1", "B1", "running", JobState.from_json({
        "job_dir": "/j/B1", "alive": True, "pid": 7, "ledger": {"batches": 2, "live": 1,
                                                                "live_requests": 5},
        "status": {"state": "running", "batches": {
            "batches": 2, "live": 1, "requests": 9, "live_requests": 5, "completed": 4,
            "failed": 0, "by_state": {"completed": 1, "in_progress": 1}}}}))
    dead = status.JobView("h2", "B1", "dead", JobState.from_json({
        "job_dir": "/j/B1", "alive": False, "pid": 8, "ledger": {"batches": 1, "live": 1,
                                                                 "live_requests": 3},
        "status": {"state": "running"}}))
    sync = status.JobView("h3", "B2", "running", JobState.from_json({
        "job_dir": "/j/B2", "alive": True, "status": {"state": "running"}}))
    assert status.batch_notes([running, dead, sync]) == [
        "B1 (h1) batches: 2 (completed 1, in_progress 1); requests 9: 4 answered, 0 errors, "
        "5 at the provider",
        "B1 (h2): its process is gone but 1 batch(es) are live at the provider: relaunch the "
        "job to collect them, or `fab stop` to cancel them"]
    assert running.record()["batches"]["live"] == 1 and sync.record()["batches"] is None
    assert JobState.from_json({"job_dir": "/j", "ledger": {"live": -2}}).problems == [
        "batches.json: its counts are not valid"]


# --- plans as data ------------------------------------------------------------------------


def test_launch_plan_is_data_and_needs_no_host(ws: Workstation, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    p = launch.plan(ws.targets("a,b", flags={"concurrency": 7}), local_input=str(prompts),
                    remote_input=None, job_flag=None)
    assert [[s.action for s in hp.steps] for hp in p.hosts] == \
        [["probe", "check-keys", "push-input", "start-job", "check-jobs"]] * 2
    assert p.all_or_nothing  # no host starts unless every host passed its probe
    start_a = p.for_host("a")[-2]
    # One job per dataset, named after the file's stem.
    assert asdict(start_a.params) == {"job": "p", "input": "~/.handoff/data/p.jsonl", "shard": "0/2",
                              "hosts": 2, "max_cost": None, "share": None,
                              # where the shards are, for status (issue 22 #3)
                              "shard_hosts": ("a", "b"), "prompts": 1, "exclude": None}
    assert p.for_host("b")[-2].params.shard == "1/2"
    assert "--concurrency 7" in start_a.detail and "--shard 0/2" in start_a.detail
    assert "~/.handoff/jobs/p/output.jsonl" in start_a.detail
    assert "--provider" not in start_a.detail  # the payload's own rule: OpenRouter only
    assert [s.changes for s in p.for_host("a")] == [False, False, True, True, False]
    alone = launch.plan(ws.targets("a"), local_input=None, remote_input="/data/x.jsonl", job_flag="b3")
    assert [s.action for s in alone.hosts[0].steps] == ["probe", "check-keys", "start-job", "check-jobs"]
    assert alone.hosts[0].steps[-2].params.job == "b3"
    assert alone.hosts[0].steps[-2].params.shard is None
    stem = launch.plan(ws.targets("a"), local_input=None, remote_input="/data/B4.jsonl", job_flag=None)
    assert stem.hosts[0].steps[-2].params.job == "B4"
    provider = launch.plan(ws.targets("a", flags={"provider": {"only": ["x"]}}), local_input=None,
                           remote_input="/d/x.jsonl", job_flag=None)
    assert """--provider '{"only":["x"]}'""" in provider.hosts[0].steps[-2].detail  # set: passed


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
    commands.common.CONNECT = lambda target: touched.append(target.label)  # type: ignore[assignment,return-value]
    assert commands.launch("a,b", None, local_input=None, remote_input="/in.jsonl", flags={},
                           dry_run=True) == 0
    assert commands.stop("a,b", None, timeout=5, dry_run=True) == 0
    out = capfd.readouterr().out
    assert touched == []
    assert out.count("dry run") == 2 and "start job in detached" in out
    assert "SIGTERM each, wait up to 5 s" in out


def test_stop_plan(ws: Workstation) -> None:
    p = stop.plan(ws.targets("a,s"), job_flag=None, timeout=0)  # every running job
    assert [(hp.steps[0].action, asdict(hp.steps[0].params)) for hp in p.hosts] == \
        [("stop-jobs", {"job": None, "timeout": 0.0})] * 2
    assert "do not wait" in p.hosts[0].steps[0].description
    one = stop.plan(ws.targets("a"), job_flag="B3", timeout=5)
    assert asdict(one.hosts[0].steps[0].params) == {"job": "B3", "timeout": 5.0}


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
    assert commands.launch("s,t", None, local_input=str(prompts), remote_input=None, flags={}) == 1
    assert "already running" in capfd.readouterr().out.replace("\n", " ")
    # So is a relaunch over fewer hosts while t still runs its shard (issue 32 #4): it would
    # ask t's prompts again; the way out is named.
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None, flags={}) == 1
    err = " ".join(capfd.readouterr().err.split())
    assert "t still runs its shard" in err and "Nothing was started" in err
    assert "fab launch --job sleeper --take-over t --host s" in err

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


def test_hints_carry_every_flag_needed_for_the_same_job(ws: Workstation, tmp_path: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """Following the launch-twice hint must stop THIS job (its --job), on this host, as this
    role: a hint without --job would stop the role's default job instead."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    deployed(ws, "s")
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None,
                           flags={"job": "custom"}) == 0
    capfd.readouterr()
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None,
                           flags={"job": "custom"}) == 1
    out = capfd.readouterr().out.replace("\n", " ")
    assert "`fab stop --host s --job custom`" in out and "`fab status --host s --job custom`" in out
    # as another role than the host's own, the hint says the role too
    [target] = ws.targets("s", role="generator")
    assert target.flags("j") == "--host s --role generator --job j"
    assert commands.stop("s", None, job="custom", timeout=20) == 0


@pytest.mark.serial  # wall time < 5 s: run alone (scripts/test's serial pass)
def test_ctrl_c_on_status_wait_says_the_job_keeps_running(ws: Workstation, tmp_path: Path,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    import signal
    import threading

    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    deployed(ws, "s")
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None, flags={}) == 0
    pid = int((job_dir(ws, "s") / "pid").read_text())
    timer = threading.Timer(0.8, signal.raise_signal, args=(signal.SIGINT,))
    timer.start()
    started = time.monotonic()
    assert commands.status("s", None, wait=True, interval="0.2") == 130
    assert time.monotonic() - started < 5
    err = capfd.readouterr().err
    assert "the jobs keep running" in err and "interrupted" not in err
    assert not gone(pid)  # still running, as the message says
    assert commands.stop("s", None, timeout=20) == 0


def test_bad_flag_values_are_usage_errors_naming_the_flag(ws: Workstation,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    cases = [
        (lambda: commands.launch("s", None, local_input=None, remote_input="x",
                                 flags={"concurrency": "abc"}, dry_run=True), "--concurrency"),
        (lambda: commands.launch("s", None, local_input=None, remote_input="x",
                                 flags={"max_cost": "ten"}, dry_run=True), "--max-cost"),
        (lambda: commands.logs("s", None, lines="ten"), "--lines"),
        (lambda: commands.status("s", None, interval="fast"), "--interval"),
        (lambda: commands.stop("s", None, timeout="x", dry_run=True), "--timeout"),
    ]
    for call, flag in cases:
        assert call() == 2
        err = capfd.readouterr().err
        assert f"{flag}: expected" in err, err


def remote_input(ws: Workstation, label: str) -> str:
    """A prompts file already on the fake host: `--remote-input`'s argument."""
    (ws.home(label) / "in.jsonl").write_text('{"id": 1, "prompt": "hi"}\n')
    return "~/in.jsonl"


def test_launch_reports_an_instant_crash_with_the_log(ws: Workstation,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    deployed(ws, "s")
    rc = commands.launch("s", None, local_input=None, remote_input=remote_input(ws, "s"),
                         flags={"act": "crash", "start_watch_s": WATCH_S})
    assert rc == 1
    out = capfd.readouterr().out.replace("\n", " ")
    assert "exited right after start" in out and "simulated failure" in out


def test_launch_of_a_job_that_finishes_at_once_is_fine(ws: Workstation,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    deployed(ws, "s")
    assert commands.launch("s", None, local_input=None, remote_input=remote_input(ws, "s"),
                           flags={"act": "finish", "start_watch_s": WATCH_S}) == 0
    assert "ran and finished already" in capfd.readouterr().out
    assert commands.status("s", None) == 0


def test_a_finished_job_relaunched_says_so_and_starts_no_process(
        ws: Workstation, capfd: pytest.CaptureFixture[str]) -> None:
    """A finished job relaunched "resumed" and started a process that found nothing to do
    (issue 32 #11): now no process starts, the launch says the job finished, exit 0."""
    deployed(ws, "s")
    flags = {"act": "finish", "start_watch_s": WATCH_S}
    given = remote_input(ws, "s")
    assert commands.launch("s", None, local_input=None, remote_input=given, flags=flags) == 0
    pid_file = ws.remote_dir("s") / "jobs" / "sleeper" / "pid"
    pid, started = pid_file.read_text(), pid_file.stat().st_mtime_ns
    capfd.readouterr()
    assert commands.launch("s", None, local_input=None, remote_input=given, flags=flags) == 0
    out = " ".join(capfd.readouterr().out.split())
    assert "job sleeper: finished already (3 done, 0 failed): nothing to start" in out, out
    assert "not started again" in out and "started sleeper" not in out, out
    assert pid_file.read_text() == pid and pid_file.stat().st_mtime_ns == started


def test_launch_needs_a_release_and_the_key(ws: Workstation, capfd: pytest.CaptureFixture[str]) -> None:
    assert commands.launch("s", None, local_input=None, remote_input="/in.jsonl", flags={}) == 1
    assert "no release on the host; run `fab deploy --host s` first" in capfd.readouterr().out.replace("\n", " ")
    plan.execute(deploy.build(ws.targets("s"), key=None), connect=ws.connect)  # release, no key
    assert commands.launch("s", None, local_input=None, remote_input="/in.jsonl", flags={}) == 1
    assert "fab push-key --host s" in capfd.readouterr().out.replace("\n", " ")
    assert not job_dir(ws, "s").exists()


def test_a_reused_pid_is_not_the_job(ws: Workstation) -> None:
    """The pid file names a live process that is not the job (the pid was reused): dead."""
    from handoff.ops.jobs.state import read

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
    real = commands.common.CONNECT

    def flaky(target):  # type: ignore[no-untyped-def]
        if target.label == "t":
            from handoff.errors import ConnectError

            raise ConnectError("t: connection refused; is sshd running and is the port right?")
        return real(target)

    commands.common.CONNECT = flaky
    assert commands.status("s,t", None) == 1
    out = capfd.readouterr().out
    # s has no job at all: nothing of it failed (issue 32 #8); t could not be read.
    assert "unreachable" in out and "connection refused" in out and "not running or finished: t" in out


def test_sleeper_stops_on_sigterm_directly(tmp_path: Path) -> None:
    """The test role's job itself behaves as the tests assume (SIGTERM -> stopped, exit 3)."""
    import subprocess
    import sys

    from tests.support.workstation import SLEEPER

    proc = subprocess.Popen([sys.executable, str(SLEEPER), str(tmp_path), "in", "run"],
                            stdout=subprocess.DEVNULL)
    assert wait_for(lambda: (tmp_path / "status.json").exists())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 3
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "stopped"


# --- several datasets: one job each, bound to its input ---------------------------------------


def dataset(folder: Path, name: str, n: int, extra: str = "") -> Path:
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"id": f"{name}-{i}", "prompt": f"q{i}"}) + "\n"
                            for i in range(n)) + extra)
    return path


def records(out: str) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_two_datasets_over_two_hosts(ws: Workstation, tmp_path: Path,
                                     capfd: pytest.CaptureFixture[str]) -> None:
    """Two files, one quoted glob: a job each (named after the stem), each sharded over both
    hosts with half the budget, listed by status per host and job, merged by fetch."""
    data = tmp_path / "data"
    data.mkdir()
    b3, b4 = dataset(data, "B3", 30), dataset(data, "B4", 20, extra="not json\n")
    deployed(ws, "s,t")
    assert commands.launch("s,t", "batch", local_input=[str(data / "B*.jsonl")], remote_input=None,
                           flags={"max_cost": 1.0}) == 0
    out = capfd.readouterr()
    assert "budget: $1 for each of the 2 jobs (--max-cost), split over 2 hosts: $0.5 per host" in out.out
    assert "B4: " in out.err and "1 bad line (line 21: not JSON" in out.err  # said before launch
    for i, label in enumerate("st"):
        for job, path in (("B3", b3), ("B4", b4)):
            meta = json.loads((job_dir(ws, label, job) / "job.json").read_text())
            assert meta["shard"] == f"{i}/2" and meta["hosts"] == 2
            assert meta["input_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
            assert (meta["max_cost"], meta["host_max_cost"]) == (1.0, "0.5")
    assert wait_for(lambda: all((job_dir(ws, h, j) / "status.json").exists()
                                and "finished" in (job_dir(ws, h, j) / "status.json").read_text()
                                for h in "st" for j in ("B3", "B4")))

    assert commands.status("s,t", "batch", as_json=True) == 0
    got = records(capfd.readouterr().out)
    assert [(r["host"], r["job"], r["state"], r["shard"]) for r in got] == [
        ("s", "B3", "finished", "0/2"), ("s", "B4", "finished", "0/2"),
        ("t", "B3", "finished", "1/2"), ("t", "B4", "finished", "1/2")]
    assert sum(r["done"] for r in got if r["job"] == "B3") == 30
    assert {r["bad_lines"] for r in got if r["job"] == "B4"} == {1}
    assert commands.status("s,t", "batch") == 0
    out = capfd.readouterr()
    assert "all (2 hosts)" in out.out and "30/0/30" in out.out and "20/0/20" in out.out
    assert "B4 on s, t: 1 bad input line skipped (line 21: not JSON" in out.err

    dest = tmp_path / "results"
    assert commands.fetch("s,t", "batch", dest=str(dest)) == 0
    out = capfd.readouterr().out
    assert "merged B3" in out and "complete: all 30 ids of the job" in out
    for job, n in (("B3", 30), ("B4", 20)):
        merged = [json.loads(line)["id"] for line in (dest / job / "output.jsonl").read_text().splitlines()]
        assert sorted(merged) == sorted(f"{job}-{i}" for i in range(n))  # each id exactly once
        assert (dest / job / "output.errors.jsonl").read_text() == ""
        assert (dest / "s" / job / "output.jsonl").is_file() and (dest / "t" / job / "output.jsonl").is_file()
    assert commands.fetch("s,t", "batch", dest=str(dest)) == 0
    assert capfd.readouterr().out.count("unchanged since the last fetch") == 2


def test_a_changed_input_under_the_same_job_is_refused_and_nothing_starts(
        ws: Workstation, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    b3 = dataset(tmp_path, "B3", 4)
    deployed(ws, "s,t")
    assert commands.launch("s", "batch", local_input=str(b3), remote_input=None, flags={}) == 0
    meta_before = (job_dir(ws, "s", "B3") / "job.json").read_text()
    b3.write_text(b3.read_text() + '{"id": "new", "prompt": "changed"}\n')
    capfd.readouterr()
    assert commands.launch("s,t", "batch", local_input=str(b3), remote_input=None, flags={}) == 1
    out = capfd.readouterr().out.replace("\n", " ")
    assert "job 'B3' was launched with another input (sha256" in out
    assert "`--job B3-2`" in out and "mv " in out and "/jobs/B3-" in out and "ssh -p 2203" in out
    # All or nothing: t passed its own probe, yet changed nothing.
    assert "t: nothing changed: s failed its checks" in out
    assert not job_dir(ws, "t", "B3").exists() and not (ws.remote_dir("t") / "data" / "B3.jsonl").exists()
    assert (job_dir(ws, "s", "B3") / "job.json").read_text() == meta_before
    assert len((ws.remote_dir("s") / "data" / "B3.jsonl").read_text().splitlines()) == 4  # not pushed
    # The way out: another name.
    assert commands.launch("s", "batch", local_input=str(b3), remote_input=None,
                           flags={"job": "B3-2"}) == 0
    assert wait_for(lambda: (job_dir(ws, "s", "B3-2") / "status.json").exists())


def test_an_input_with_no_valid_record_touches_no_host(ws: Workstation, tmp_path: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": 1, "text": "x"}\n\xe9\n')
    touched: list[str] = []
    commands.common.CONNECT = lambda target: touched.append(target.label)  # type: ignore[assignment,return-value]
    assert commands.launch("s,t", "batch", local_input=str(bad), remote_input=None, flags={}) == 2
    err = capfd.readouterr().err.replace("\n", " ")
    assert "has no valid record: 2 bad lines" in err and "not valid UTF-8 (byte 0xe9" in err
    assert touched == []


def test_status_shows_failures_full_disks_and_bad_input(ws: Workstation,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    """The payload's final states as fab status shows them (status files as the payload
    writes them; no process)."""
    def job(name: str, **status: object) -> None:
        jd = job_dir(ws, "s", name)
        jd.mkdir(parents=True)
        (jd / "status.json").write_text(json.dumps(status))
        (jd / "pid").write_text("999999999\n")

    deployed(ws, "s")
    job("ok", state="finished", exit_code=0, done=10, failed=0, total=10)
    job("failures", state="finished", exit_code=1, done=5, failed=5, total=10, max_failed=1)
    job("full", state="stopped", exit_code=3, stop_reason="disk_full", done=4, failed=0, total=10,
        last_error="stopping: no space left on device writing /x/output.jsonl; free space")
    job("allbad", state="aborted", exit_code=2, stop_reason="bad_input", done=0, failed=0, total=0,
        bad_lines=2, bad_line_samples=[{"line": 1, "reason": "not JSON"}, {"line": 2, "reason": "x"}],
        last_error="no valid record in the input")
    assert commands.status("s", "batch") == 1
    out = capfd.readouterr()
    text = out.out.replace("\n", " ")
    assert "finished with failures" in text and "5 ids failed permanently (more than the 1" in text
    assert "disk_full: stopping: no space left on device" in text
    assert "not running or finished: s/allbad, s/failures, s/full" in text
    assert "allbad on s: 2 bad input lines skipped (line 1: not JSON; line 2: x)" in out.err
    assert commands.status("s", "batch", as_json=True) == 1
    got = {r["job"]: r for r in records(capfd.readouterr().out)}
    assert got["failures"]["state"] == "finished" and got["failures"]["finished_with_failures"] is True
    assert got["failures"]["ok"] is False and got["ok"]["ok"] is True
    assert (got["full"]["state"], got["full"]["stop_reason"]) == ("stopped", "disk_full")
    assert got["allbad"]["bad_lines"] == 2 and len(got["allbad"]["bad_line_samples"]) == 2
    assert commands.status("s", "batch", job="ok") == 0  # one job by name


def test_stop_and_logs_act_on_every_job(ws: Workstation, tmp_path: Path,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "d"
    data.mkdir()
    dataset(data, "B3", 2)
    dataset(data, "B4", 2)
    deployed(ws, "s")
    assert commands.launch("s", "batch", local_input=[str(data / "B*.jsonl")], remote_input=None,
                           flags={"act": "run"}) == 0
    pids = [int((job_dir(ws, "s", j) / "pid").read_text()) for j in ("B3", "B4")]
    assert wait_for(lambda: all((job_dir(ws, "s", j) / "status.json").exists() for j in ("B3", "B4")))
    assert commands.logs("s", "batch", lines=5) == 0
    out = capfd.readouterr().out
    assert "== B3" in out and "== B4" in out and out.count("sleeper: running") == 2
    assert commands.stop("s", "batch", timeout=20) == 0
    out = capfd.readouterr().out
    assert "sent SIGTERM to B3" in out and "sent SIGTERM to B4" in out
    assert all(gone(pid) for pid in pids)
    assert commands.stop("s", "batch", timeout=20) == 0
    assert "no job is running (2 job(s) on the host: B3, B4)" in capfd.readouterr().out


def test_push_and_launch_check_free_disk_against_the_role(ws: Workstation, tmp_path: Path,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    """A role asking for more disk than the host has: push-script, push-key and launch
    refuse before changing anything (deploy's verify already did)."""
    (ws.root / "project" / "roles" / "huge.yml").write_text(
        SLEEPER_ROLE.replace("secret: openrouter", "secret: openrouter\nrequires: {disk_gb: 1.0e+9}"))
    for command in (commands.push_script, commands.push_key):
        assert command("s", "huge") == 1
        out = capfd.readouterr().out.replace("\n", " ")
        assert "free under" in out and "(role huge needs 1000000.0 TB)" in out
        assert "set `remote_dir` to a bigger volume; nothing was changed" in out
    assert not (ws.remote_dir("s") / "releases").exists()
    deployed(ws, "s")  # the sleeper role asks for no disk: deployed
    assert commands.launch("s", "huge", local_input=str(dataset(tmp_path, "in", 1)),
                           remote_input=None, flags={}) == 1
    out = capfd.readouterr().out.replace("\n", " ")
    assert "role huge needs" in out and "nothing was started" in out
    assert not (ws.remote_dir("s") / "jobs").exists()


# --- shards: a job knows how many it has, and where (issue 22 #3) ----------------------------


def test_status_accounts_for_every_shard_of_a_job(ws: Workstation, tmp_path: Path,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    """job.json records the shards' hosts: `status --host s` alone, or with t unreachable,
    says the job is partial/unknown (done/?/whole input) and exits 1, never a quiet 0."""
    data = tmp_path / "data"
    data.mkdir()
    dataset(data, "B3", 30)
    deployed(ws, "s,t")
    assert commands.launch("s,t", "batch", local_input=[str(data / "B3.jsonl")], remote_input=None,
                           flags={}) == 0
    meta = json.loads((job_dir(ws, "s", "B3") / "job.json").read_text())
    assert meta["shard_hosts"] == ["s", "t"] and meta["prompts"] == 30
    assert wait_for(lambda: all("finished" in (job_dir(ws, h, "B3") / "status.json").read_text()
                                for h in "st" if (job_dir(ws, h, "B3") / "status.json").exists())
                    and all((job_dir(ws, h, "B3") / "status.json").exists() for h in "st"))
    capfd.readouterr()
    assert commands.status("s,t", "batch", job="B3") == 0
    assert "all (2 hosts)" in capfd.readouterr().out

    assert commands.status("s", "batch", job="B3") == 1  # t's shard not asked for
    out = capfd.readouterr()
    done = json.loads((job_dir(ws, "s", "B3") / "status.json").read_text())["done"]
    assert "partial" in out.out and f"{done}/?/30" in out.out and "t (not asked)" in out.out
    assert "B3: partial, shards not seen: t (not asked)" in out.err.replace("\n", " ")

    real = commands.common.CONNECT

    def flaky(target):  # type: ignore[no-untyped-def]
        if target.label == "t":
            from handoff.errors import ConnectError

            raise ConnectError("t: connection refused; is sshd running and is the port right?")
        return real(target)

    commands.common.CONNECT = flaky
    assert commands.status("s,t", "batch") == 1
    out = capfd.readouterr()
    assert "partial" in out.out and "t (unreachable)" in out.out


def test_an_unknown_job_is_an_error_for_every_command_taking_job(
        ws: Workstation, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """`fab stop --job nosuch` said `ok │ not running (none)`, exit 0 (issue 22 #2): every
    `--job` command now exits 1 naming the jobs the host has, with "did you mean"."""
    data = tmp_path / "data"
    data.mkdir()
    dataset(data, "B3", 4)
    deployed(ws, "s")
    assert commands.launch("s", "batch", local_input=[str(data / "B3.jsonl")], remote_input=None,
                           flags={}) == 0
    capfd.readouterr()
    for name, call in [("stop", lambda: commands.stop("s", "batch", job="B33", timeout=0)),
                       ("status", lambda: commands.status("s", "batch", job="B33")),
                       ("logs", lambda: commands.logs("s", "batch", job="B33")),
                       ("fetch", lambda: commands.fetch("s", "batch", job="B33",
                                                        dest=str(tmp_path / "r")))]:
        assert call() == 1, name
        out = capfd.readouterr()
        text = (out.out + out.err).replace("\n", " ")
        assert "no job 'B33' on the host; jobs there: B3; did you mean 'B3'?" in text, (name, text)


def test_status_wait_off_a_terminal_prints_progress_and_outlasts_an_outage(
        ws: Workstation, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Piped, `status --wait` printed nothing until every job ended, and returned at once when
    the host was briefly unreachable (issue 22 #4): now one line per job per refresh, and
    the watch says the host is unreachable, waits, and says when it is back."""

    from handoff.errors import ConnectError

    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    deployed(ws, "s")
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None, flags={}) == 0
    pid = int((job_dir(ws, "s") / "pid").read_text())
    capfd.readouterr()
    # The outage and the stop follow the watch's own calls, not wall-clock timers: on a loaded
    # machine a timer fired before the first refresh came back (CI saw 2 running lines).
    calls = 0
    real = commands.common.CONNECT

    class Flaky:
        def __init__(self, session) -> None:  # type: ignore[no-untyped-def]
            self.session = session

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(self.session, name)

        def run_code(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal calls
            calls += 1
            if calls in (4, 5):
                raise ConnectError("s: connection reset by peer")
            if calls == 7:
                os.kill(pid, signal.SIGTERM)
            return self.session.run_code(*args, **kwargs)

    commands.common.CONNECT = lambda target: Flaky(real(target))
    assert commands.status("s", None, wait=True, interval="0.2") == 1  # ends stopped
    out = capfd.readouterr()
    lines = out.out.splitlines()
    running = [line for line in lines if "sleeper running" in line]
    assert len(running) >= 3, out.out  # progress while it runs, not only at the end
    assert any("s: unreachable (s: connection reset by peer)" in line for line in lines)
    err = out.err.replace("\n", " ")
    assert "s: unreachable; still waiting" in err and "s: reachable again" in err
    assert "stopped" in out.out


def test_fab_jobs_lists_and_forget_removes_a_stopped_job(ws: Workstation, tmp_path: Path,
                                                         capfd: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """One stopped job made `status` exit 1 forever (issue 22 #3): `fab jobs` lists it with
    its input and shards, `fab forget` removes it (asked first; never while it runs)."""
    import io

    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    deployed(ws, "s,t")
    assert commands.launch("s,t", None, local_input=str(prompts), remote_input=None, flags={}) == 0
    capfd.readouterr()
    assert commands.jobs("s,t", None) == 0
    out = capfd.readouterr().out
    assert "sleeper" in out and str(prompts) in out and "2 → s, t" in out and "running" in out

    assert commands.forget("s,t", None, job="sleeper", yes=True) == 1  # running: refused
    out = capfd.readouterr().out.replace("\n", " ")
    assert "is running" in out and "fab stop --host s" in out
    assert job_dir(ws, "s").is_dir()
    assert commands.stop("s,t", None, timeout=20) == 0
    assert commands.status("s,t", None) == 1  # stopped: not a success
    capfd.readouterr()

    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal, no --yes
    assert commands.forget("s,t", None, job="sleeper") == 2
    assert "pass --yes" in capfd.readouterr().err
    assert commands.forget("s,t", None, job="sleeper", dry_run=True) == 0
    assert job_dir(ws, "s").is_dir() and job_dir(ws, "t").is_dir()
    assert commands.forget("s,t", None, job="sleeper", yes=True) == 0
    assert not job_dir(ws, "s").exists() and not job_dir(ws, "t").exists()
    assert not [p for p in (ws.remote_dir("s") / "jobs").iterdir()]
    capfd.readouterr()
    # No job at all: said, and not a failure (issue 32 #8: it exited 1 with a `-` row).
    assert commands.status("s,t", None) == 0
    assert "no jobs on s, t: `fab launch --input FILE` starts one" in capfd.readouterr().out
    assert commands.forget("s", None, job="sleeper", yes=True) == 1  # gone: unknown now
    assert "no job 'sleeper' on the host" in capfd.readouterr().out


def test_forget_asks_and_ctrl_d_is_a_no(ws: Workstation, monkeypatch: pytest.MonkeyPatch,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Tty())

    def eof(prompt: str) -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", eof)
    assert commands.forget("s", None, job="sleeper") == 1
    assert "nothing removed" in capfd.readouterr().out


def test_the_printed_ssh_command_names_handoffs_pinned_file(ws: Workstation) -> None:
    """The `ssh …` fix a launch refusal prints failed with "Host key verification failed"
    for a host pinned only in the state dir (issue 22 #5): it now names that file too."""
    from handoff.config import state
    from handoff.ssh import hostkeys
    from tests.support.fakessh import ed25519_key

    [target] = ws.targets("s")
    plain = launch.ssh_command(target, "true")
    assert "UserKnownHostsFile" not in plain and plain.startswith("`ssh -p 2203 ")
    hostkeys.pin("127.0.0.4", 2203, ed25519_key())
    pinned = launch.ssh_command(target, "true")
    assert f"-o 'UserKnownHostsFile={state.pinned_keys_path()} " in pinned


def test_status_notes_say_what_holds_now(capfd: pytest.CaptureFixture[str]) -> None:
    """A stopped job kept the payload's "stopping; waiting up to 60s…"; a clean finish showed
    a retried error; a finished job showed `ETA 0s` (issue 22 #13, #14)."""
    from handoff import console

    stopped = status.JobView("h", "j", "stopped", JobState("d", status={
        "state": "stopped", "stop_reason": "signal",
        "last_error": "SIGTERM: stopping; waiting up to 60s for in-flight requests (resumable)"}))
    assert "waiting up to" not in status.note(stopped) and "relaunching resumes" in status.note(stopped)
    clean = status.JobView("h", "j", "finished", JobState("d", status={
        "state": "finished", "done": 5, "failed": 0, "total": 5, "rate_rps": 2.0,
        "last_error": "429 rate_limited: slow down"}))
    assert status.note(clean) == ""
    console._console = None
    console.say(status.table([clean]))
    out = capfd.readouterr().out
    assert "0s" not in out and "rate_limited" not in out


def test_stop_with_timeout_0_says_it_did_not_wait(ws: Workstation, tmp_path: Path,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    """`stop --timeout 0` reported "stopped (running)" (issue 22 #13)."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    deployed(ws, "s")
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None,
                           flags={}) == 0
    jd = job_dir(ws, "s")
    assert wait_for(lambda: (jd / "status.json").exists())
    # The sleeper ends at once on SIGTERM, so the state read right after the signal finds it
    # still alive or already stopped (a race a loaded CI lost both ways): either is told
    # truly, and never as "stopped" while it runs.
    capfd.readouterr()
    assert commands.stop("s", None, job="sleeper", timeout=0) == 0
    out = capfd.readouterr().out
    assert "stopped (running)" not in out and "state now running" not in out
    assert "not waited for" in out or "state now stopped" in out, out
    commands.stop("s", None, timeout=20)


def test_a_refused_key_is_said_once_with_its_fix(ws: Workstation, keyed_api,  # type: ignore[no-untyped-def]
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """A rotated key's smoke test said "the API key was refused (401 …)" three times per host,
    with no fix (issue 22 #6): once now, naming set-key then push-key for this host."""
    targets = ws.targets("a", flags={"base_url": keyed_api.url})
    assert all(r.ok for r in plan.execute(deploy.build(targets, key=KEY), connect=ws.connect))
    capfd.readouterr()
    reports = smoke.run(targets, ws.connect)
    assert not reports[0].ok
    from handoff import console

    console.say(smoke.table(reports))
    out = capfd.readouterr()
    text = out.out + out.err
    assert text.count("refused") == 2, text  # the host's message, and the table's short cell
    assert "API key refused (401)" in out.out
    assert "`fab set-key`" in str(reports[0].error) and "`fab push-key --host a`" in str(reports[0].error)


def _drawn(views: list[status.JobView], width: int) -> str:
    import io

    from rich.console import Console

    from handoff import console

    buf = io.StringIO()
    console._console = Console(file=buf, force_terminal=True, width=width, color_system=None)
    try:
        for part in status.status_parts(views):
            console.say(part)
    finally:
        console._console = None
    return buf.getvalue()


def _running_shards() -> list[status.JobView]:
    """Three shards of a running job with retried errors and answers' latencies, a stopped
    job with a long note, and an extractor's job."""
    from handoff.ops.jobs.status.views import KeyView

    views = []
    for i in range(1, 4):
        js = JobState("d", status={"state": "running", "done": 885 + i, "failed": 3, "total": 2995,
                                   "cost": 1.234567, "tokens_per_s": 1234.5, "rate_rps": 3.2,
                                   "errors_by_kind": {"rate_limited": 12, "timeout": 3},
                                   "retries": 15},
                      meta={"shard": f"{i - 1}/3", "hosts": 3, "started": 1}, pid=7, alive=True,
                      latency={160: 50, 180: 40, 200: 10})
        views.append(status.JobView(f"gen-{i}", "gamma", js.state, js, key=KeyView(True)))
    stopped = JobState("d", status={"state": "stopped", "done": 10, "failed": 0, "total": 100,
                                    "cost": 0.01, "stop_reason": "disk_full", "last_error":
                                    "stopping: no space left on device writing "
                                    "/root/.handoff/jobs/B3/output.jsonl; free some space"})
    views.append(status.JobView("gen-1", "B3", "stopped", stopped, key=KeyView(True)))
    extracting = JobState("d", status={"state": "running", "done": 120, "failed": 0, "total": 300,
                                       "tokens_per_s": 5123.4, "rate_rps": 2.0, "cost": 0.0,
                                       "bytes_written": 3_456_000_000,
                                       "retokenized_mismatch": 300},
                          meta={"role": "extractor"}, pid=8, alive=True)
    views.append(status.JobView("gpu-1", "extractor", "running", extracting, role="extractor"))
    return views


def test_status_at_80_and_200_columns_keeps_numbers_whole_and_moves_the_rest_under() -> None:
    """At 80 columns the status split `885/0/299`/`5` and dropped $ spent, ETA and tok/s while
    a wrapped note stayed (issue 32 #8): numbers stay whole and those never go; what does not
    fit (latency, errors, keys, notes) moves to a line under the table. At 200 it is all in
    the table. An extractor's table has its own columns and no dollars or keys (#9)."""
    import re

    views = _running_shards()
    narrow = _drawn(views, 80)
    assert max(len(line) for line in narrow.splitlines()) <= 80, narrow
    for number in ("886/3/2995", "887/3/2995", "888/3/2995", "2661/9/8985", "$1.2346", "$3.7037",
                   "10m58s", "1234", "3704", "120/0/300", "5123", "3.46"):
        assert number in narrow, (number, narrow)
    header = next(line for line in narrow.splitlines() if "done/fail/total" in line)
    assert "tok/s" in header and "$ spent" in header and "ETA" in header, narrow
    # The rest, under the table: each shard's latency, error mix and key; B3's whole note.
    assert "gen-1 gamma: p50/p95 s 23.8/52.5; errors rate_limited 12, timeout 3; 15 retries" \
        in " ".join(narrow.split()), narrow
    assert "note disk_full: stopping: no space left on device writing" in " ".join(narrow.split())
    assert "/root/.handoff/jobs/B3/output.jsonl;" in narrow  # a long word is never split

    wide = _drawn(views, 200)
    assert max(len(line) for line in wide.splitlines()) <= 200, wide
    generator, extractor = wide.split("status: extractor jobs")
    top = next(line for line in generator.splitlines() if "done/fail/total" in line)
    assert re.search(r"p50/p95 s .*errors .*key placed .*key spend .*note", top), wide
    assert re.search(r"gen-1 +│ gamma +│ running +│ 886/3/2995 +│ 1234 +│ \$1\.2346 +│ 10m58s +│ "
                     r"23\.8/52\.5 +│ rate_limited 12, timeout", generator), wide
    assert "all (3 hosts)" in generator and "51 retries" not in generator  # summed: 45
    assert "45 retries" in " ".join(generator.split())
    head = next(line for line in extractor.splitlines() if "done/fail/total" in line)
    assert "GB written" in head and "mismatches" in head and "tok/s" in head, wide
    assert "$" not in extractor and "key" not in extractor, wide
    assert re.search(r"gpu-1 +│ extractor +│ running +│ 120/0/300 +│ 5123 +│ 3\.46 +│ 300 +│", extractor)


def test_status_json_has_the_error_mix_and_latency_per_job() -> None:
    """`fab status --json` adds per job `errors_by_kind`, `retries` and `latency_s` {p50, p95}
    (DESIGN round 4; issue 32 #8), and an extractor's figures (#9)."""
    views = _running_shards()
    rec = views[0].record()
    assert rec["errors_by_kind"] == {"rate_limited": 12, "timeout": 3} and rec["retries"] == 15
    assert rec["latency_s"] == {"p50": round(1.02 ** 160, 3), "p95": round(1.02 ** 200, 3)}
    assert rec["role"] == "generator"
    gpu = views[-1].record()
    assert gpu["role"] == "extractor" and gpu["bytes_written"] == 3_456_000_000
    assert gpu["retokenized_mismatch"] == 300 and gpu["latency_s"] is None


def test_piped_output_is_never_wrapped_padded_or_700_columns_wide(
        ws: Workstation, capfd: pytest.CaptureFixture[str]) -> None:
    """Piped: a caption wrapped ("failed: sbx-1, sbx-2,⏎ sbx-3"), headers carried trailing
    spaces, a dry-run plan was a ~700-column table (issue 22 #12)."""
    from handoff import console
    from handoff.run import parallel

    console._console = None
    many = ",".join(f"u@127.0.0.{i}:9" for i in range(10, 20))
    reports = [parallel.HostReport(t) for t in ws.targets(many)]
    for rep in reports:
        rep.fail("unreachable")
    capfd.readouterr()
    parallel.print_summary("deploy", reports)
    out = capfd.readouterr().out
    caption = next(line for line in out.splitlines() if "hosts ok" in line)
    assert caption.endswith("u@127.0.0.19:9"), out  # one line, every host on it
    assert all(line == line.rstrip() for line in out.splitlines()), out
    assert commands.launch("s", None, local_input=None, remote_input="~/in.jsonl", flags={},
                           dry_run=True) == 0
    out = capfd.readouterr().out
    assert "1. probe the host" in out and "     runs: " in out and "     when: " in out, out
    assert max(len(line) for line in out.splitlines() if "runs:" not in line) < 200, out
    assert all(line == line.rstrip() for line in out.splitlines())


def test_smoke_test_of_one_host_prints_no_table(ws: Workstation, keyed_api,  # type: ignore[no-untyped-def]
                                                capfd: pytest.CaptureFixture[str]) -> None:
    """The docs say one host's block is not repeated by a table (issue 22 #16)."""
    targets = ws.targets("a", flags={"base_url": keyed_api.url})
    assert all(r.ok for r in plan.execute(deploy.build(targets, key=KEY), connect=ws.connect))
    ws_inv = ws.root / "project" / "inventory" / "hosts.yml"
    ws_inv.write_text(ws_inv.read_text().replace(
        "  a: {address: 127.0.0.2,", f"  a: {{vars: {{base_url: '{keyed_api.url}'}}, address: 127.0.0.2,"))
    capfd.readouterr()
    assert commands.smoke_test("a", None) == 1
    out = capfd.readouterr().out
    assert "smoke-test" not in out.replace("── smoke-test", "") and "API key refused (401)" not in out, out
    assert commands.smoke_test("a,a", None) == 1  # one host still, named twice


def test_the_probe_says_a_job_is_new_not_none(ws: Workstation, tmp_path: Path,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    """The launch probe said "prompts none" for a job never launched (issue 22 #14)."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n')
    deployed(ws, "s")
    capfd.readouterr()
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None, flags={}) == 0
    out = capfd.readouterr().out
    assert "free; job sleeper: new" in out and "sleeper none" not in out
    assert commands.stop("s", None, timeout=20) == 0
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None, flags={}) == 0
    assert "job sleeper: was stopped, resumes" in capfd.readouterr().out
    assert commands.stop("s", None, timeout=20) == 0
def test_launch_plan_shows_and_passes_the_sampling(ws: Workstation) -> None:
    """Issue 20: temperature, top_p, seed, reasoning, provider, turns, max_timeouts from the
    flags (or vars) reach the payload's argv, and the plan says them."""
    flags = {"temperature": 1.0, "top_p": 0.95, "seed": 7, "reasoning": {"effort": "high"},
             "provider": {"require_parameters": True}, "turns": "all", "max_timeouts": 0}
    p = launch.plan(ws.targets("a", flags=flags), local_input=None, remote_input="/d/x.jsonl",
                    job_flag=None)
    start = p.hosts[0].steps[-2]
    for text in ("--temperature 1.0", "--top-p 0.95", "--seed 7",
                 """--reasoning '{"effort":"high"}'""",
                 """--provider '{"require_parameters":true}'""", "--turns all",
                 "--max-timeouts 0"):
        assert text in start.detail, (text, start.detail)
    assert ('sampling: temperature 1.0, top_p 0.95, seed 7, reasoning {"effort":"high"}, '
            'provider {"require_parameters":true}, turns all, max_timeouts 0') in start.description
    assert launch.sampling(ws.targets("a")[0]) == {}  # none set: the payload's defaults
    plain = launch.plan(ws.targets("a"), local_input=None, remote_input="/d/x.jsonl", job_flag=None)
    assert "--temperature" not in plain.hosts[0].steps[-2].detail
    assert "sampling" not in plain.hosts[0].steps[-2].description
    # the vars in the inventory's shapes: YAML mappings, or JSON text; null provider: send none
    t = ws.targets("a", flags={"reasoning": '{"max_tokens": 8000, "exclude": true}',
                               "provider": "null"})[0]
    assert launch.sampling(t) == {"reasoning": {"max_tokens": 8000, "exclude": True},
                                  "provider": "null"}


def test_launch_passes_streaming_and_its_timeouts(ws: Workstation) -> None:
    """Issue 33: --stream and the three timeouts reach the payload's argv and the plan."""
    flags = {"stream": "off", "idle_timeout": "90", "first_token_timeout": 300,
             "request_timeout": 7200}
    p = launch.plan(ws.targets("a", flags=flags), local_input=None, remote_input="/d/x.jsonl",
                    job_flag=None)
    start = p.hosts[0].steps[-2]
    for text in ("--stream off", "--idle-timeout 90.0", "--first-token-timeout 300",
                 "--request-timeout 7200"):
        assert text in start.detail, (text, start.detail)
    assert ("stream off, idle_timeout 90.0, first_token_timeout 300, request_timeout 7200"
            in start.description)
    plain = launch.plan(ws.targets("a"), local_input=None, remote_input="/d/x.jsonl", job_flag=None)
    assert "--stream" not in plain.hosts[0].steps[-2].detail
    assert "--idle-timeout" not in plain.hosts[0].steps[-2].detail


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("temperature", "3", "--temperature: expected a number from 0 to 2"),
    ("temperature", "nan", "--temperature: expected a number from 0 to 2"),
    ("top_p", "1.5", "--top-p: expected a number from 0 to 1"),
    ("seed", "1.5", "--seed: expected a whole number from 0 to 9223372036854775807"),
    ("max_timeouts", "-1", "--max-timeouts: expected a whole number >= 0"),
    ("reasoning", "high", "--reasoning: expected a JSON object"),
    ("reasoning", '{"efort": "high"}', "--reasoning: unknown key 'efort'"),
    ("reasoning", '{"effort": "hi"}', "--reasoning: effort must be one of"),
    ("reasoning", '{"effort": "high", "max_tokens": 10}', "give effort or max_tokens, not both"),
    ("reasoning", '{"exclude": "yes"}', "--reasoning: exclude must be true or false"),
    ("provider", "[1]", "--provider: expected a JSON object"),
    ("turns", "some", "--turns: expected one of last, all"),
    ("stream", "yes", "--stream: expected one of auto, on, off"),
    ("idle_timeout", "0", "--idle-timeout: expected a number > 0"),
    ("first_token_timeout", "-5", "--first-token-timeout: expected a number > 0"),
    ("request_timeout", "an hour", "--request-timeout: expected a number > 0"),
])
def test_bad_sampling_flags_exit_2_naming_the_flag(ws: Workstation, capfd: pytest.CaptureFixture[str],
                                                   flag: str, value: str, says: str) -> None:
    assert commands.launch("a", None, local_input=None, remote_input="/in.jsonl",
                           flags={flag: value}, dry_run=True) == 2
    assert says in capfd.readouterr().err


def test_extractor_role_passes_completion_format_turns_and_on_mismatch(ws: Workstation) -> None:
    """Issue 19: set, they reach `payload extract`; the completion form's braces are the
    payload's placeholders, passed as written (not vars: `reasoning` is one)."""
    form = "{reasoning}\n</think>\n\n{content}<｜end▁of▁sentence｜>"
    base = {"gpus": 1, "model_dir": "/models/r1"}
    p = launch.plan(ws.targets("a", role="extractor", flags={
        **base, "completion_format": form, "turns": "all", "on_mismatch": "skip",
        "reasoning": "include"}), local_input=None, remote_input="/in.jsonl", job_flag=None)
    detail = p.hosts[0].steps[-2].detail
    assert f"--completion-format '{form}'" in detail
    assert "--turns all" in detail and "--on-mismatch skip" in detail
    assert "--reasoning include" in detail  # the extractor's own reasoning var, not JSON
    assert "sampling" not in p.hosts[0].steps[-2].description
    plain = launch.plan(ws.targets("a", role="extractor", flags=base), local_input=None,
                        remote_input="/in.jsonl", job_flag=None).hosts[0].steps[-2].detail
    assert "--completion-format" not in plain and "--turns" not in plain


def test_status_breaks_answers_down_by_provider_and_finish_reason() -> None:
    """Issue 20: the status file's by_provider, by_finish_reason and cut in `--json`, the
    table and the notes; shards summed; a host's values read as hostile input."""
    def view(host: str, st: dict) -> status.JobView:  # type: ignore[type-arg]
        return status.JobView(host, "B3", "running", JobState("/j/B3", status=st, alive=True))

    a = view("a", {"done": 5, "by_provider": {"DeepInfra": 4, "Together": 1},
                   "by_finish_reason": {"stop": 3, "length": 2}, "cut": 2, "timeouts": 1,
                   "think_split": 0})
    b = view("b", {"done": 2, "by_provider": {"Together": 2}, "by_finish_reason": {"stop": 2},
                   "cut": 0})
    rec = a.record()
    assert rec["by_provider"] == {"DeepInfra": 4, "Together": 1}
    assert (rec["cut"], rec["timeouts"], rec["think_split"]) == (2, 1, 0)
    assert status.breakdown_notes([a, b]) == [
        "B3 (2 hosts) answers: by provider DeepInfra 4, Together 3; by finish reason stop 5, "
        "length 2; 2 cut by max_tokens (recorded, not asked again)"]
    allrow = status.combined([a, b])[0]
    assert allrow.status["by_finish_reason"] == {"stop": 5, "length": 2} and allrow.status["cut"] == 2
    table = status.table([a, b])
    assert "cut" in [c.header for c in table.columns]
    # hostile values: wrong types, NaN, negatives, huge and control-character names
    evil = view("c", {"by_provider": {"x": float("nan")}, "by_finish_reason": ["stop"],
                      "cut": -1, "timeouts": float("inf"), "think_split": True})
    assert {k: evil.record()[k] for k in (*status.BREAKDOWNS, *status.COUNTS)} == dict.fromkeys(
        (*status.BREAKDOWNS, *status.COUNTS))
    assert status.breakdown_notes([evil]) == []
    many = untrusted.counts_by_name({f"p{i}\x1b[31m" + "y" * 100: 1 for i in range(40)})
    assert many is not None and len(many) == untrusted.MAX_NAMES
    assert all("\x1b" not in k and len(k) <= untrusted.MAX_SHOWN_NAME for k in many)
    assert many["other (9 names)"] == 9
    assert untrusted.counts_by_name({"a": 10**400}) is None


def test_a_take_over_of_a_host_still_running_its_shard_is_refused(
        ws: Workstation, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 32 #4: a take-over moves the shard of a host that is gone; one whose job still
    runs there is refused (exit 1, nothing started), naming the way; a dry run says the move
    and contacts no host."""
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"q{i}"}) + "\n" for i in range(9)))
    deployed(ws, "s,t")
    assert commands.launch("s,t", None, local_input=str(prompts), remote_input=None, flags={}) == 0
    capfd.readouterr()
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None,
                           flags={"job": "sleeper"}, take_over="t", dest=str(tmp_path / "r")) == 1
    err = " ".join(capfd.readouterr().err.split())
    assert "t: job sleeper still running there: a take-over moves the shard of a host that is " \
           "gone. Stop it first (`fab stop --job sleeper --host t`)" in err
    assert json.loads((job_dir(ws, "s") / "job.json").read_text())["shard"] == "0/2"  # unchanged
    assert commands.launch("s", None, local_input=str(prompts), remote_input=None,
                           flags={"job": "sleeper"}, take_over="t", dest=str(tmp_path / "r"),
                           dry_run=True) == 0
    cap = capfd.readouterr()
    said = " ".join((cap.out + cap.err).split())
    assert "shard 1/2 moves from t to s (take-over): 0 of its ids are in hand" in said
    assert "none fetched: every id of it is asked again" in said and "runs shard 0,1/2" in said
    assert commands.stop("s,t", None, timeout=20) == 0
