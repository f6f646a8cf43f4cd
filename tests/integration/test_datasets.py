"""Several datasets per launch, over real sshd and the project's fake OpenRouter (issue 9):
two datasets over two hosts give two merged outputs with every id exactly once; the budget
split is shown at launch and reaches each host; a non-UTF-8 line is counted as bad and shown
by `fab status`; a relaunch with a changed input is refused and starts nothing; an input with
no valid record fails before any host is touched; a full disk (a small tmpfs under the job)
stops the generator with exit 3 within 30 s and `fab status` says why; push-script refuses a
remote_dir without room for the role.

Each test uses a private sandbox: jobs it leaves behind must not show up in another test's
`fab status`.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import explain, remote_dir, run_as, wait_until


def flat(result: Any) -> str:
    """Both streams with the table/line wrapping undone."""
    return " ".join(result.text.split())


def records(result: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """`status --json`: one object per host and job."""
    found = [json.loads(line) for line in result.out.splitlines() if line.startswith("{")]
    return {(r["host"], r["job"]): r for r in found}


def dataset(path: Path, n: int, *, extra: bytes = b"", size: int = 0) -> Path:
    with path.open("wb") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"{path.stem}-{i}", "messages": [
                {"role": "user", "content": f"question {i} of {path.stem} " + "x" * size}]}).encode() + b"\n")
        fh.write(extra)
    return path


def ids(path: Path) -> list[str]:
    return [str(json.loads(line)["id"]) for line in path.read_text().splitlines() if line.strip()]


def test_two_datasets_over_two_hosts(make_sandbox, fab, tmp_path: Path) -> None:
    sbx = make_sandbox(hosts=2)
    data = tmp_path / "data"
    data.mkdir()
    # B3 ends with a Latin-1 line (byte 0xe9): counted as bad, never sent.
    dataset(data / "B3.jsonl", 40, extra=b'{"id": "latin", "prompt": "caf\xe9"}\n')
    dataset(data / "B4.jsonl", 30)
    assert fab.on(sbx, "deploy").rc == 0

    r = fab.on(sbx, "launch", "--input", str(data / "B*.jsonl"), "--max-cost", "1")
    assert r.rc == 0, explain(r)
    text = flat(r)
    assert "budget: $1 for each of the 2 jobs (--max-cost), split over 2 hosts: $0.5 per host" in text
    assert "B3: " in text and "1 bad line (line 41: not valid UTF-8 (byte 0xe9" in text
    assert "estimate: 2 dataset(s) over 2 host(s)" in text
    assert "shard 0/2" in text and "shard 1/2" in text

    r = fab.on(sbx, "status", "--wait", "--json", "--interval", "0.5", timeout=180)
    assert r.rc == 0, explain(r)
    got = records(r)
    assert sorted(got) == [(h, j) for h in ("sbx-1", "sbx-2") for j in ("B3", "B4")]
    assert all(rec["state"] == "finished" and rec["exit_code"] == 0 for rec in got.values())
    assert all(rec["max_cost"] == 0.5 for rec in got.values())  # each host's share reached it
    assert sum(got[(h, "B3")]["done"] for h in ("sbx-1", "sbx-2")) == 40
    assert sum(got[(h, "B4")]["total"] for h in ("sbx-1", "sbx-2")) == 30
    for h in ("sbx-1", "sbx-2"):
        b3 = got[(h, "B3")]
        assert b3["bad_lines"] == 1 and b3["bad_line_samples"][0]["line"] == 41
        assert "not valid UTF-8" in b3["bad_line_samples"][0]["reason"]
    r = fab.on(sbx, "status")
    assert r.rc == 0, explain(r)
    assert "B3 on sbx-1, sbx-2: 1 bad input line skipped (line 41: not valid UTF-8" in flat(r)
    assert "all (2 hosts)" in r.out and "40/0/40" in r.out and "30/0/30" in r.out

    dest = tmp_path / "results"
    r = fab.on(sbx, "fetch", "--dest", str(dest))
    assert r.rc == 0, explain(r)
    for job, n in (("B3", 40), ("B4", 30)):
        merged = ids(dest / job / "output.jsonl") + ids(dest / job / "output.errors.jsonl")
        assert len(merged) == len(set(merged)) == n  # every id exactly once
        assert set(merged) == {f"{job}-{i}" for i in range(n)}
        shards = [ids(dest / h / job / "output.jsonl") for h in ("sbx-1", "sbx-2")]
        assert all(shards) and sorted(shards[0] + shards[1]) == sorted(merged)  # beside the copies
        assert f"merged {job}" in r.out
    assert "complete: all 40 ids of the job" in flat(r)

    # The same job name with another input: refused on every host, nothing started.
    jobs = [remote_dir(c) / "jobs" / "B3" for c in sbx.containers]
    before = [((jd / "pid").read_text(), (jd / "job.json").read_text()) for jd in jobs]
    with (data / "B3.jsonl").open("ab") as fh:
        fh.write(b'{"id": "added", "prompt": "a new question"}\n')
    r = fab.on(sbx, "launch", "--input", str(data / "B3.jsonl"))
    assert r.rc != 0, explain(r)
    text = flat(r)
    assert "job 'B3' was launched with another input (sha256" in text
    assert "`--job B3-2`" in text and "'mv " in text and "ssh -p " in text
    assert [((jd / "pid").read_text(), (jd / "job.json").read_text()) for jd in jobs] == before

    # An input with no valid record: exit 2 before any host is touched.
    bad = dataset(data / "bad.jsonl", 0, extra=b'{"id": 1, "text": "no prompt"}\nnot json\n')
    r = fab.on(sbx, "launch", "--input", str(bad))
    assert r.rc == 2, explain(r)
    assert "has no valid record: 2 bad lines" in flat(r) and "Nothing was launched" in flat(r)
    assert not any((remote_dir(c) / "data" / "bad.jsonl").exists() for c in sbx.containers)
    assert not any((remote_dir(c) / "jobs" / "bad").exists() for c in sbx.containers)


def mount_tmpfs(path: Path, size: str, uid: int) -> None:
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},uid={uid},mode=0755", "tmpfs",
                          str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode}): the "
                    f"full-disk test needs root and mount rights")


def test_a_full_disk_stops_the_job_and_status_says_why(make_sandbox, fab, tmp_path: Path) -> None:
    # Answers take 50 ms and 20 fly at once: the disk fills after a few seconds, well after
    # launch's one-second check (a job that dies within it fails the launch instead).
    sbx = make_sandbox(hosts=1, api_latency_s=0.05)
    c = sbx.containers[0]
    uid = int(subprocess.check_output(["id", "-u", c.user]))
    assert fab.on(sbx, "deploy").rc == 0, "deploy"

    # remote_dir on a 4 MB volume: push-script refuses (the role asks for 1 GB), changing nothing.
    small = Path(c.home) / "small"
    run_as(c, "mkdir", "-p", str(small))
    mount_tmpfs(small, "4m", uid)
    job_dir = remote_dir(c) / "jobs" / "big"
    try:
        inv = yaml.safe_load(sbx.inventory.read_text())
        inv["hosts"][c.name]["vars"]["remote_dir"] = str(small)
        sbx.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
        r = fab.on(sbx, "push-script")
        assert r.rc != 0, explain(r)
        assert "free under" in flat(r) and "role generator needs 1.0 GB" in flat(r), explain(r)
        assert list(small.iterdir()) == []
        del inv["hosts"][c.name]["vars"]["remote_dir"]
        sbx.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))

        # The job's folder on a 4 MB volume: ~2 KB answers fill it after ~1800 of 6000.
        run_as(c, "mkdir", "-p", str(job_dir))
        mount_tmpfs(job_dir, "4m", uid)
        big = dataset(tmp_path / "big.jsonl", 6000, size=2000)
        started = time.monotonic()
        r = fab.on(sbx, "launch", "--input", str(big), "--concurrency", "20")
        assert r.rc == 0, explain(r)

        def stopped() -> bool:
            try:
                return json.loads((job_dir / "status.json").read_text()).get("state") == "stopped"
            except (OSError, ValueError):
                return False

        assert wait_until(stopped, 45), (job_dir / "log").read_text()[-2000:]
        took = time.monotonic() - started
        assert took < 30, f"the full disk stopped the job only after {took:.1f} s"
        r = fab.on(sbx, "status")
        assert r.rc != 0, explain(r)  # stopped: not running or finished
        text = flat(r)
        assert "stopped" in text and "disk_full: stopping: no space left on device" in text, explain(r)
        rec = records(fab.on(sbx, "status", "--json"))[(c.name, "big")]
        assert (rec["state"], rec["exit_code"], rec["stop_reason"]) == ("stopped", 3, "disk_full")
        assert 0 < rec["done"] < 6000 and rec["alive"] is False
    finally:
        for mount in (job_dir, small):
            subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
