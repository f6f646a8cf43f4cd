"""The smaller things a user meets first (issue 32 #11), through `fab` against real sshd: a
host name a letter off gets "did you mean", an error of several hosts is printed once, and a
finished job relaunched says so and starts no process."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.conftest import explain, remote_dir


def test_a_mistyped_host_gets_did_you_mean(sandbox, fab) -> None:
    r = fab("status", "--host", "sbx1")
    assert r.rc == 2 and "unknown host 'sbx1'" in r.err and "did you mean 'sbx-1'?" in r.err, explain(r)


def test_every_error_of_several_hosts_is_printed_once(sandbox, fab) -> None:
    r = fab("logs", "--job", "no-such-job-32")
    assert r.rc == 1, explain(r)
    for c in sandbox.containers:
        assert r.text.count(f"{c.name}: no job 'no-such-job-32' on the host") == 1, explain(r)


def test_a_finished_job_relaunched_starts_no_process(make_sandbox, fab, tmp_path: Path) -> None:
    sbx = make_sandbox(hosts=1)
    assert fab.on(sbx, "deploy").rc == 0
    given = tmp_path / "once.jsonl"
    given.write_text("".join(json.dumps({"id": i, "prompt": f"q{i}"}) + "\n" for i in range(5)))
    assert fab.on(sbx, "launch", "--input", str(given)).rc == 0
    assert fab.on(sbx, "status", "--wait", "--interval", "0.3").rc == 0
    job = remote_dir(sbx.containers[0]) / "jobs" / "once"
    pid, log = (job / "pid").read_text(), (job / "log").read_bytes()

    again = fab.on(sbx, "launch", "--input", str(given))
    said = " ".join(again.text.split())
    assert again.rc == 0, explain(again)
    assert "job once: finished already (5 done, 0 failed): nothing to start" in said, explain(again)
    assert "not started again" in said and "started once (pid" not in said, explain(again)
    assert (job / "pid").read_text() == pid and (job / "log").read_bytes() == log  # no process ran
