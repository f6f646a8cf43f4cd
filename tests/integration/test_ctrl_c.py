"""Ctrl-C says per host what was done (issue 32 #6): a real `fab` process gets SIGINT at the
moments that matter, against real sshd. A launch cut after its jobs started says they run and
never says "rerun the command" (a rerun would answer "already running"); one cut before any
start says nothing changed and a rerun is safe; a fetch cut mid-file says which part files are
kept for the next fetch; set-key cut at its prompt says nothing was stored."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import (
    ALL_RESULTS,
    FabResult,
    clean_env,
    explain,
    remote_dir,
    wait_until,
)
from tests.integration.test_transfer import MB, make_output
from tests.support.fab import FAB, REPO
from tests.support.listener import Listener


def interrupt(sbx: Any, args: list[str], when: Any, timeout_s: float = 60.0,
              stdin: int | None = subprocess.DEVNULL) -> FabResult:
    """`fab ARGS`, sent SIGINT (Ctrl-C) once `when()` holds; its result (recorded, so the
    traceback check sees it too)."""
    proc = subprocess.Popen([str(FAB), *args], cwd=REPO, env=clean_env(sbx), stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = wait_until(when, timeout_s, 0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    result = FabResult(proc.returncode, out, err)
    ALL_RESULTS.append(result)
    assert seen, f"the moment never came:\n{explain(result)}"
    return result


def prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": i, "prompt": f"question {i}"}) + "\n" for i in range(n)))
    return path


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.serial  # SIGINT at a moment: run alone (scripts/test's serial pass)
def test_a_launch_cut_after_its_jobs_started_says_they_run(make_sandbox, fab, tmp_path: Path) -> None:
    # Jobs that take a while (slow answers, one at a time) and a long start watch: the
    # Ctrl-C lands after both hosts started their job, while the launch watches them.
    sbx = make_sandbox(hosts=2, api_latency_s=0.3, defaults={"start_watch_s": 20})
    assert fab.on(sbx, "deploy").rc == 0
    given = prompts(tmp_path / "slow.jsonl", 80)
    pids = [remote_dir(c) / "jobs" / "slow" / "pid" for c in sbx.containers]
    seen: list[float] = []

    def watching() -> bool:  # both pid files there 1.5 s ago: the start steps have returned
        if not seen and all(p.exists() for p in pids):
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] > 1.5

    r = interrupt(sbx, ["launch", "--input", str(given), "--concurrency", "1"], watching)
    text = flat(r.err)
    assert r.rc == 130 and "Traceback" not in r.text, explain(r)
    for c in sbx.containers:
        assert f"{c.name}: done: pushed slow.jsonl" in text, explain(r)
        assert re.search(rf"{c.name}: done: [^:]*; started slow \(pid \d+\)", text), explain(r)
    assert "runs on every host: nothing to redo; do not rerun the launch" in text, explain(r)
    assert "rerun the command" not in text and "can be rerun" not in text, explain(r)
    # What it said holds: the jobs run, and a rerun would only answer "already running".
    again = fab.on(sbx, "launch", "--input", str(given), "--concurrency", "1")
    assert again.rc == 1 and "already running" in flat(again.text), explain(again)
    status = fab.on(sbx, "status", "--job", "slow")
    assert status.rc == 0 and flat(status.out).count("running") >= 2, explain(status)


@pytest.mark.serial  # SIGINT at a moment: run alone (scripts/test's serial pass)
def test_a_launch_cut_before_any_start_says_nothing_changed(make_sandbox, fab, tmp_path: Path) -> None:
    # One host answers nothing: the other passes its probe and waits at the all-or-nothing
    # gate, where the Ctrl-C finds it.
    sbx = make_sandbox(hosts=1)
    assert fab.on(sbx, "deploy").rc == 0
    silent = Listener("silent")
    try:
        given = prompts(tmp_path / "waits.jsonl", 5)
        job_dir = remote_dir(sbx.containers[0]) / "jobs" / "waits"
        begun = time.monotonic()
        r = interrupt(sbx, ["launch", "--host", f"sbx-1,tester@127.0.0.1:{silent.port}",
                            "--input", str(given)],
                      lambda: time.monotonic() - begun > 4)
    finally:
        silent.close()
    text = flat(r.err)
    assert r.rc == 130 and "Traceback" not in r.text, explain(r)
    assert "sbx-1: nothing changed" in text and f"127.0.0.1:{silent.port}: nothing changed" in text
    assert "no job was started on any host: the launch can be rerun as it is" in text, explain(r)
    assert not job_dir.exists()


@pytest.mark.serial  # SIGINT at a moment: run alone (scripts/test's serial pass)
def test_a_fetch_cut_mid_file_names_the_part_kept_and_the_next_fetch_resumes(
        make_sandbox, fab, tmp_path: Path) -> None:
    sbx = make_sandbox(hosts=1, api=False, keyring="file")
    c = sbx.containers[0]
    data = make_output(c, 120 * MB)
    dest = tmp_path / "results"
    part = dest / c.name / "generator" / ".output.jsonl.tmp-part"
    r = interrupt(sbx, ["fetch", "--dest", str(dest)],
                  lambda: part.exists() and part.stat().st_size > 4 * MB)
    text = flat(r.err)
    assert r.rc == 130 and "Traceback" not in r.text, explain(r)
    assert f"{c.name}: cut mid-way: kept generator/output.jsonl (" in text, explain(r)
    assert "the next fetch resumes from there" in text and "did not run" in text, explain(r)
    assert "rerun the command" not in text
    again = fab.on(sbx, "fetch", "--dest", str(dest))
    assert again.rc == 0 and "1 file(s) fetched (1 resumed" in again.out, explain(again)
    assert (dest / c.name / "generator" / "output.jsonl").read_bytes() == data[:data.rindex(b"\n") + 1]


@pytest.mark.serial  # SIGINT at a moment: run alone (scripts/test's serial pass)
def test_set_key_cut_at_its_prompt_stores_nothing_and_says_so(sandbox, tmp_path: Path) -> None:
    begun = time.monotonic()
    r = interrupt(sandbox, ["set-key", "--username", "ctrl-c-test"],
                  lambda: time.monotonic() - begun > 2.5, stdin=subprocess.PIPE)
    text = flat(r.err)
    assert r.rc == 130 and "Traceback" not in r.text, explain(r)
    assert "before a key was given: nothing was stored" in text and "ctrl-c-test" in text, explain(r)
    assert "host" not in text.replace("no host is touched", ""), explain(r)
