"""The code that runs on the hosts (handoff.host.remote_code), tested here as ordinary modules:
their functions called directly, and each module's source run the way it is shipped
(`python -c SOURCE ARGS`, one JSON object out)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from handoff.host import remote_code
from handoff.host.remote_code import fetch_list, jobs, probe

MODULES = [remote_code.PROBE, remote_code.JOBS, remote_code.FETCH_LIST, remote_code.INSTALL]


def ship(module: str, args: dict[str, object], home: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", remote_code.source(module),
                          remote_code.encode_args(args)],
                         capture_output=True, text=True, check=True, cwd=home,
                         env={"HOME": str(home), "PATH": os.environ["PATH"]})
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_every_remote_module_is_stdlib_only_and_self_contained() -> None:
    """A host has no handoff and gets one module's source: no import of handoff, of a
    sibling, or of anything outside the standard library."""
    for name in MODULES:
        tree = ast.parse(remote_code.source(name))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for imported in names:
                top = imported.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", (name, imported)
    with pytest.raises(RuntimeError):
        remote_code.source("nope")


def test_probe_reports_files_dirs_releases_and_current(tmp_path: Path) -> None:
    rd = tmp_path / ".handoff"
    (rd / "releases" / "abc").mkdir(parents=True)
    (rd / "releases" / "abc" / "payload.pyz").write_bytes(b"pyz")
    (rd / "current").symlink_to("releases/abc")
    key = rd / "secrets" / "k"
    key.parent.mkdir()
    key.write_text("s3cr3t-value")
    key.chmod(0o600)
    facts = ship(remote_code.PROBE, {"remote_dir": "~/.handoff", "modules": ["json", "no_such_mod"],
                                     "files": {"key": "~/.handoff/secrets/k", "gone": "~/x"},
                                     "dirs": ["~/.handoff", "~/.handoff/data"], "hash": True}, tmp_path)
    assert facts["home"] == str(tmp_path) and facts["remote_dir"] == str(rd)
    assert facts["modules"] == {"json": True, "no_such_mod": False}
    assert facts["current"] == "releases/abc"
    assert [r["name"] for r in facts["releases"]] == ["abc"]  # type: ignore[index]
    files = facts["files"]
    assert files["key"]["mode"] == 0o600 and files["key"]["size"] == 12  # type: ignore[index]
    import hashlib

    assert files["key"]["sha256"] == hashlib.sha256(b"s3cr3t-value").hexdigest()  # type: ignore[index]
    assert "s3cr3t" not in json.dumps(facts)  # the hash travels, never the content
    assert files["gone"] == {"path": str(tmp_path / "x"), "exists": False}  # type: ignore[index]
    assert facts["dirs"] == {str(rd): True, str(rd / "data"): False}


def test_probe_runs_the_preflight_only_when_its_paths_exist(tmp_path: Path) -> None:
    spec = {"argv": ["@python", "-c", "print('{\"fits\": true}')"], "self": "@python",
            "needs": {"{input}": str(tmp_path / "in.jsonl")}, "timeout": 30}
    assert probe.preflight(spec, {}, str(tmp_path)) == {"missing": ["{input}"]}
    (tmp_path / "in.jsonl").write_text("")
    assert probe.preflight(spec, {"torch": False}, str(tmp_path)) == {"modules": ["torch"]}
    ran = probe.preflight(spec, {"json": True}, str(tmp_path))
    assert ran["rc"] == 0 and json.loads(ran["out"]) == {"fits": True}


def test_jobs_start_state_stop(tmp_path: Path) -> None:
    jd = tmp_path / "jobs" / "j"
    script = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(3)); time.sleep(60)"
    command = f"{sys.executable} -c '{script}' {jd}"
    started = ship(remote_code.JOBS, {"op": "start", "job_dir": str(jd), "command": command,
                                      "meta": {"job": "j"}, "watch_s": 0.3}, tmp_path)
    assert started["started"] is True and json.loads((jd / "job.json").read_text()) == {"job": "j"}
    pid = int((jd / "pid").read_text())
    assert pid == started["pid"]
    state = jobs.state({"job_dir": str(jd), "keys": [str(jd / "job.json"), str(tmp_path / "no")]})
    assert state["alive"] is True and state["pid"] == pid
    assert state["keys"] == {str(jd / "job.json"): True, str(tmp_path / "no"): False}
    # The job left the starter's session (setsid) and outlived the starter itself.
    assert os.getsid(pid) == pid != os.getsid(0)
    stopped = jobs.stop({"job_dir": str(jd), "timeout": 10})
    assert stopped["was_alive"] is True and stopped["drained"] is True
    assert stopped["state"]["alive"] is False  # type: ignore[index]
    assert jobs.stop({"job_dir": str(jd), "timeout": 10})["was_alive"] is False


@pytest.mark.parametrize("op", ["stop", "stop_all"])
def test_jobs_stop_now_signals_twice(tmp_path: Path, op: str) -> None:
    """`fab stop --now`: a second SIGTERM after NOW_GAP_S, which the payload takes as
    "close the requests in flight at once"; the job here exits on the second only."""
    jd = tmp_path / "jobs" / "j"
    script = ("import signal, sys, time, pathlib; n = []; "
              "p = pathlib.Path(sys.argv[1]) / 'terms'; "
              "signal.signal(signal.SIGTERM, lambda *a: (n.append(1), p.write_text(str(len(n))), "
              "len(n) > 1 and sys.exit(3))); (p.parent / 'ready').touch(); time.sleep(60)")
    command = f"{sys.executable} -c \"{script}\" {jd}"
    jobs.start({"job_dir": str(jd), "command": command, "meta": {}, "watch_s": 0.5})
    # (a python started on a loaded machine may take longer than watch_s to reach its
    # handler; a SIGTERM before it ends the job on the first signal, as it should)
    deadline = time.monotonic() + 20
    while not (jd / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    where = {"job_dir": str(jd)} if op == "stop" else {"jobs_dir": str(jd.parent)}
    stopped = getattr(jobs, op)({**where, "timeout": 10, "now": True})
    drained = stopped["drained"] if op == "stop" else stopped["jobs"]["j"]["drained"]
    assert drained is True and (jd / "terms").read_text() == "2"


def test_jobs_start_of_a_command_that_dies_at_once_returns_the_log(tmp_path: Path) -> None:
    jd = tmp_path / "j"
    answer = jobs.start({"job_dir": str(jd), "command": "sh -c \"echo 'no such input' >&2; exit 2\"",
                         "meta": {}, "watch_s": 2})
    assert answer["started"] is False and answer["exit"] == 2
    assert answer["log_tail"] == ["no such input"]


def test_jobs_state_of_a_folder_that_does_not_exist(tmp_path: Path) -> None:
    state = jobs.state({"job_dir": str(tmp_path / "none")})
    assert state == {"job_dir": str(tmp_path / "none"), "status": None, "meta": None, "pid": None,
                     "alive": False, "ledger": None, "keys": {}, "records": {}}


def test_jobs_running_lists_only_live_jobs_and_state_returns_key_records(tmp_path: Path) -> None:
    """`running` (cleanup-secrets' warning) names the jobs whose process is alive; `state`
    returns the records asked for (the minted key's), None when absent or torn."""
    import os

    live, dead = tmp_path / "jobs" / "live", tmp_path / "jobs" / "dead"
    live.mkdir(parents=True)
    dead.mkdir()
    (dead / "pid").write_text("999999999\n")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", str(live)])
    try:
        (live / "pid").write_text(f"{proc.pid}\n")
        assert jobs.running({"jobs_dir": str(tmp_path / "jobs")}) == \
            {"running": [{"job": "live", "pid": proc.pid}]}
    finally:
        proc.kill()
        proc.wait()
    assert jobs.running({"jobs_dir": str(tmp_path / "nowhere")}) == {"running": []}
    record, torn = tmp_path / "k.minted.json", tmp_path / "t.minted.json"
    record.write_text('{"hash": "abc"}')
    torn.write_text('{"hash": ')
    got = jobs.state({"job_dir": str(live), "records": [str(record), str(torn),
                                                        str(tmp_path / "none.json")]})
    assert got["records"] == {str(record): {"hash": "abc"}, str(torn): None,
                              str(tmp_path / "none.json"): None}
    assert os.path.exists(record)  # read, never changed


def test_fetch_list_hashes_the_prefix_the_workstation_holds(tmp_path: Path) -> None:
    jd = tmp_path / "j"
    (jd / "sub").mkdir(parents=True)
    (jd / "output.jsonl").write_bytes(b"abcdef")
    (jd / "sub" / "x").write_bytes(b"x")
    (jd / "pid").write_text("1")
    (jd / ".output.jsonl.tmp-1").write_text("t")
    listing = fetch_list.listing({"job_dir": str(jd), "local": {"output.jsonl": 3, "sub/x": 5}})
    files = {f["rel"]: f for f in listing["files"]}
    assert set(files) == {"output.jsonl", "sub/x"} and listing["exists"] is True
    import hashlib

    assert files["output.jsonl"]["prefix_sha256"] == hashlib.sha256(b"abc").hexdigest()
    assert "prefix_sha256" not in files["sub/x"]  # the local copy is longer: no prefix
    assert fetch_list.listing({"job_dir": str(tmp_path / "none"), "local": {}})["exists"] is False


@pytest.mark.serial  # wall time < 5 s: run alone (scripts/test's serial pass)
def test_a_remote_module_answers_within_one_process_start(tmp_path: Path) -> None:
    """Shipping costs one interpreter start: the probe's source runs in well under a second."""
    start = time.monotonic()
    ship(remote_code.PROBE, {"remote_dir": "~/.handoff"}, tmp_path)
    assert time.monotonic() - start < 5


def test_jobs_list_and_stop_all_read_every_job_in_one_call(tmp_path: Path) -> None:
    """`list` (status, launch's probe) and `stop_all` (stop without --job) see every job
    folder under jobs/; hidden and temp names are not jobs."""
    jobs_dir = tmp_path / "jobs"
    for name in ("B3", "B4", ".B5.tmp-1"):
        (jobs_dir / name).mkdir(parents=True)
    (jobs_dir / "B3" / "job.json").write_text('{"input_sha256": "abc"}')
    (jobs_dir / "B3" / "status.json").write_text('{"state": "finished"}')
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", str(jobs_dir / "B4")])
    try:
        (jobs_dir / "B4" / "pid").write_text(f"{proc.pid}\n")
        listed = ship(remote_code.JOBS, {"op": "list", "jobs_dir": str(jobs_dir),
                                         "keys": [str(tmp_path / "k")]}, tmp_path)
        assert sorted(listed["jobs"]) == ["B3", "B4"]  # type: ignore[call-overload]
        b3, b4 = listed["jobs"]["B3"], listed["jobs"]["B4"]  # type: ignore[index]
        assert b3["meta"] == {"input_sha256": "abc"} and b3["alive"] is False
        assert b4["alive"] is True and b4["pid"] == proc.pid
        assert listed["keys"] == {str(tmp_path / "k"): False}
        stopped = jobs.stop_all({"jobs_dir": str(jobs_dir), "timeout": 10})
        assert list(stopped["jobs"]) == ["B4"] and stopped["jobs"]["B4"]["drained"] is True
        assert stopped["idle"] == ["B3"] and stopped["batches"] == {}
    finally:
        proc.kill()
        proc.wait()
    assert jobs.list_jobs({"jobs_dir": str(tmp_path / "none")})["jobs"] == {}


def test_a_batch_ledger_is_counted_and_stop_all_names_idle_jobs_with_live_batches(
        tmp_path: Path) -> None:
    """A generator job in batch mode: its ledger's live batches (not collected: they may
    still run at the provider) are counted in its state; `stop_all` names an idle job that
    has some, so `fab stop` cancels them; a torn or foreign ledger counts as none."""
    jobs_dir = tmp_path / "jobs"
    for name in ("B1", "B2", "B3"):
        (jobs_dir / name).mkdir(parents=True)
    (jobs_dir / "B1" / "batches.json").write_text(json.dumps({"batches": [
        {"step": "done", "requests": 5}, {"step": "submitted", "requests": 7},
        {"step": "uploaded", "requests": 3}, {"step": "prepared", "requests": 2}]}))
    (jobs_dir / "B2" / "batches.json").write_text(json.dumps({"batches": [
        {"step": "done", "requests": 5}]}))
    (jobs_dir / "B3" / "batches.json").write_text('{"batches": [')
    assert jobs.state({"job_dir": str(jobs_dir / "B1")})["ledger"] == {
        "batches": 4, "live": 2, "live_requests": 10}
    assert jobs.state({"job_dir": str(jobs_dir / "B2")})["ledger"] == {
        "batches": 1, "live": 0, "live_requests": 0}
    assert jobs.state({"job_dir": str(jobs_dir / "B3")})["ledger"] is None
    stopped = jobs.stop_all({"jobs_dir": str(jobs_dir), "timeout": 1})
    assert stopped["jobs"] == {} and list(stopped["batches"]) == ["B1"]
    assert stopped["batches"]["B1"]["ledger"]["live"] == 2


def test_fetch_list_of_every_job(tmp_path: Path) -> None:
    for name in ("B3", "B4"):
        (tmp_path / "jobs" / name).mkdir(parents=True)
        (tmp_path / "jobs" / name / "output.jsonl").write_bytes(b"abcdef")
    listing = ship(remote_code.FETCH_LIST, {"jobs_dir": str(tmp_path / "jobs"),
                                            "local": {"B4": {"output.jsonl": 2}}}, tmp_path)
    got = listing["jobs"]  # type: ignore[index]
    assert sorted(got) == ["B3", "B4"]  # type: ignore[arg-type]
    assert "prefix_sha256" not in got["B3"]["files"][0]  # type: ignore[index]
    assert got["B4"]["files"][0]["prefix_sha256"]  # type: ignore[index]


def test_probe_finds_modules_as_find_spec_does_without_importing_importlib_util() -> None:
    import importlib.util

    def find_spec_says(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a missing parent package
            return False

    for name in ("json", "os.path", "xml.etree", "no_such_module_xyz", "no_such_pkg.sub",
                 "aiohttp", "_hashlib"):
        assert probe.importable(name) == find_spec_says(name), name
    # Shipped as `python -c`: a probe that checks a module leaves importlib.util unimported.
    code = (remote_code.source(remote_code.PROBE).replace("sys.exit(main(sys.argv))", "pass")
            + "\nimportable('json')\nprint('importlib.util' in sys.modules)")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


def test_probe_answer_is_json_without_importing_json_or_re(tmp_path: Path) -> None:
    values = [None, True, False, 0, -7, 2**70, 1.5, -0.0, 1e300, float("nan"), float("inf"),
              "", "plain", 'quo"te \\ back', "line\nbreak\ttab\x00", "héllo ✓ 😀",
              [], [1, [2, [3]]], (4, 5), {}, {"a": {"b": [None, "c"]}, "é": 1}]
    for value in values:
        text = probe.dumps(value)
        assert text == json.dumps(value), value
        assert json.dumps(json.loads(text)) == json.dumps(value)
    with pytest.raises(TypeError):
        probe.dumps({1, 2})
    # Shipped as `python -c`, the whole probe runs without importing json or re (-S: this
    # venv's .pth files import re themselves; a container's python need not).
    code = (remote_code.source(remote_code.PROBE).replace(
        "sys.exit(main(sys.argv))",
        "main(sys.argv); print(sorted({'json', 're'} & set(sys.modules)))"))
    out = subprocess.run([sys.executable, "-S", "-c", code, remote_code.encode_args(
        {"remote_dir": str(tmp_path), "modules": ["json"], "files": {"k": str(tmp_path / "k")},
         "dirs": [str(tmp_path)], "hash": True})], capture_output=True, text=True, check=True,
        env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]}).stdout.splitlines()
    assert json.loads(out[0])["modules"] == {"json": True}
    assert out[1] == "[]"


def test_encode_args_takes_plain_data_only() -> None:
    args = {"a": [1, 2.5, None, True, "x'\"\n"], "b": {"c": (1,)}}
    assert eval(remote_code.encode_args(args), {"__builtins__": {}}) == {**args, "b": {"c": (1,)}}
    for bad in ({"p": Path("/x")}, {"s": {1}}, {"f": float("inf")}, {1: "int key"}):
        with pytest.raises(RuntimeError, match="plain data"):
            remote_code.encode_args(bad)  # type: ignore[arg-type]


def test_the_jobs_module_reads_answers_latency_incrementally(tmp_path: Path) -> None:
    """`fab status`'s latency (issue 32 #8): a histogram of the records' top-level
    `latency_s` (with --turns all, the record's sum, not its turns'), read once per line:
    a cache in the job folder says how far, a line still being written waits, and a file
    replaced since is read again from its start."""
    import json
    import os

    from handoff.host.remote_code import jobs
    from handoff.ops.jobs.state import latency_quantiles

    def record(i: int, seconds: float) -> str:
        return json.dumps({"id": i, "turns": [{"latency_s": 999.0, "attempts": 1}],
                           "response": 'say "latency_s":5,"attempts":1', "latency_s": seconds,
                           "attempts": 1, "messages": []}, separators=(",", ":")) + "\n"

    out = tmp_path / "output.jsonl"
    out.write_text("".join(record(i, 10.0 if i < 90 else 40.0) for i in range(100)) + '{"id": 100')
    first = jobs.latency(str(tmp_path))
    assert first is not None and first["n"] == 100
    bins = {int(k): n for k, n in first["bins"].items()}
    p50, p95 = latency_quantiles(bins) or [0.0, 0.0]
    assert abs(p50 - 10) / 10 < 0.01 and abs(p95 - 40) / 40 < 0.01
    cache = json.loads((tmp_path / jobs.LATENCY_CACHE).read_text())
    assert cache["offset"] == out.read_bytes().rindex(b"\n") + 1  # the cut line waits
    assert oct((tmp_path / jobs.LATENCY_CACHE).stat().st_mode & 0o777) == "0o600"

    with out.open("a") as fh:  # the cut line ends; one more comes
        fh.write(',"latency_s":40.0,"attempts":1}\n' + record(101, 40.0))
    # Only the new lines are read: the cache's count is carried on (set here to 1000).
    (tmp_path / jobs.LATENCY_CACHE).write_text(json.dumps({**cache, "n": 1000}))
    assert jobs.latency(str(tmp_path))["n"] == 1002  # type: ignore[index]
    assert json.loads((tmp_path / jobs.LATENCY_CACHE).read_text())["offset"] == out.stat().st_size

    out.with_name("new").write_text(record(0, 1.0))
    os.replace(out.with_name("new"), out)  # another file: read from its start
    again = jobs.latency(str(tmp_path))
    assert again is not None and again["n"] == 1
    assert jobs.latency(str(tmp_path / "none")) is None
