"""The checklist's happy paths through `.venv/bin/fab`, against real sshd containers on loopback.

Every test deploys what it needs itself, so the order does not matter; tests that change
host keys or need a slow API use a private sandbox (`make_sandbox`).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import explain, key_file, remote_dir, wipe_remote_state
from tests.support.fab import FAB

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "examples" / "prompts.jsonl"


def names(sbx) -> str:
    return ",".join(c.name for c in sbx.containers)


def ledger(sbx) -> list[dict]:
    path = Path(sbx.state_dir) / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ids_in(path: Path) -> list[str]:
    return [str(json.loads(line)["id"]) for line in path.read_text().splitlines() if line.strip()]


def input_ids() -> int:
    return sum(1 for line in PROMPTS.read_text().splitlines() if line.strip())


def test_whole_checklist_on_three_hosts(sandbox, fab, tmp_path: Path) -> None:
    hosts = names(sandbox)
    r = fab("deploy", "--host", hosts)
    assert r.rc == 0, explain(r)
    assert "3/3 hosts ok" in r.out
    for c in sandbox.containers:
        rd = remote_dir(c)
        current = os.readlink(rd / "current")
        assert current.startswith("releases/") and (rd / current / "payload.pyz").is_file()
        st = key_file(c).stat()
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert stat.S_IMODE(key_file(c).parent.stat().st_mode) == 0o700
        assert st.st_uid == int(subprocess.check_output(["id", "-u", c.user]))
        assert key_file(c).read_text() == sandbox.api_key  # exactly the key, no newline
    placed = {e["host"] for e in ledger(sandbox) if e["event"] == "placed"}
    assert placed >= {c.name for c in sandbox.containers}
    assert all(len(e["fingerprint"]) == 8 for e in ledger(sandbox))

    r = fab("smoke-test")  # no --host: the targets of the last deploy
    assert r.rc == 0, explain(r)
    assert "provider (model)" in r.out and "left" in r.out  # provider and key credit per host
    # Each host's figures once (issue 32 #11): in the table; its block holds only the rest.
    assert "served by:" not in r.out and "latency:" not in r.out, explain(r)
    assert r.out.count("answer:") == 3 and r.out.count("prices:") == 3, explain(r)

    r = fab("launch", "--input", str(PROMPTS))
    assert r.rc == 0, explain(r)
    assert "0/3" in r.out and "1/3" in r.out and "2/3" in r.out  # sharded i/n

    r = fab("status", "--wait", "--json", "--interval", "0.5", timeout=180)
    assert r.rc == 0, explain(r)
    # One job per dataset, named after the file's stem; other tests' jobs may share the hosts.
    records = [rec for rec in (json.loads(line) for line in r.out.splitlines() if line.startswith("{"))
               if rec["job"] == "prompts"]
    assert {rec["host"] for rec in records} == {c.name for c in sandbox.containers}
    assert all(rec["state"] == "finished" and rec["alive"] is False for rec in records)
    assert sum(rec["done"] + rec["failed"] for rec in records) == input_ids()
    assert {"host", "job", "state", "done", "failed", "total", "cost", "alive"} <= set(records[0])

    r = fab("logs", "--lines", "3")
    assert r.rc == 0, explain(r)

    dest = tmp_path / "results"
    r = fab("fetch", "--dest", str(dest))
    assert r.rc == 0, explain(r)
    got: list[str] = []
    for c in sandbox.containers:
        folder = dest / c.name / "prompts"
        assert (folder / "status.json").is_file() and (folder / "log").is_file()
        got += ids_in(folder / "output.jsonl") + ids_in(folder / "output.errors.jsonl")
    assert len(got) == len(set(got)) == input_ids()  # every id exactly once across the shards
    r = fab("fetch", "--dest", str(dest))
    assert r.rc == 0 and "0 fetched" in r.out, explain(r)  # all complete: nothing downloaded

    r = fab("cleanup-secrets")
    assert r.rc == 0, explain(r)
    assert all(not key_file(c).exists() for c in sandbox.containers)
    r = fab("cleanup-secrets")
    assert r.rc == 0 and "already absent" in r.out, explain(r)
    r = fab("status", "--json")
    assert all(json.loads(line)["secrets_placed"] == [] for line in r.out.splitlines() if line.startswith("{"))


def test_redeploy_is_a_no_op(sandbox, fab) -> None:
    hosts = names(sandbox)
    assert fab("deploy", "--host", hosts).rc == 0
    before = {c.name: (key_file(c).stat().st_ino, key_file(c).stat().st_mtime_ns,
                       os.readlink(remote_dir(c) / "current")) for c in sandbox.containers}
    r = fab("deploy", "--host", hosts)
    assert r.rc == 0, explain(r)
    assert r.out.count("no change needed") == len(sandbox.containers)
    assert "already on the host" in r.out and "nothing written" in r.out
    after = {c.name: (key_file(c).stat().st_ino, key_file(c).stat().st_mtime_ns,
                      os.readlink(remote_dir(c) / "current")) for c in sandbox.containers}
    assert before == after
    r = fab("push-key", "--host", hosts)  # push-key alone is idempotent too
    assert r.rc == 0 and "nothing written" in r.out, explain(r)


def test_dry_run_changes_nothing(sandbox, fab) -> None:
    c = sandbox.containers[0]
    wipe_remote_state(c)
    events = len(ledger(sandbox))
    for task in ("deploy", "push-script", "push-key"):
        r = fab(task, "--host", c.name, "--dry-run")
        assert r.rc == 0, explain(r)
        assert "dry run" in r.out and c.name in r.out
    assert "payload.pyz" in fab("push-script", "--host", c.name, "--dry-run").out
    assert not remote_dir(c).exists()
    assert len(ledger(sandbox)) == events
    assert sandbox.api_key not in r.out


def test_verify_reports_and_fixes(sandbox, fab) -> None:
    r = fab("verify", "--host", names(sandbox))
    assert r.rc == 0, explain(r)
    assert "aiohttp" in r.out and "python" in r.out
    r = fab("verify", "--host", sandbox.containers[0].name, "--role", "extractor")
    assert r.rc != 0
    assert "missing" in r.out and "torch" in r.out and "nvidia-smi" in r.out


def test_trust_host_pins_an_unknown_key(make_sandbox, fab) -> None:
    sbx = make_sandbox(hosts=1)
    c = sbx.containers[0]
    sbx.forget_host_key(c.name)
    r = fab.on(sbx, "deploy", "--host", c.name)
    assert r.rc != 0 and c.host_key_fingerprint in r.text and f"fab trust-host --host {c.name}" in r.text
    assert not key_file(c).exists()
    r = fab.on(sbx, "trust-host", "--host", c.name)  # stdin is not a terminal: needs --yes
    assert r.rc != 0 and c.host_key_fingerprint in r.text
    r = fab.on(sbx, "trust-host", "--host", c.name, "--yes")
    assert r.rc == 0, explain(r)
    pinned = (Path(sbx.state_dir) / "known_hosts").read_text()
    assert pinned.startswith(f"[{c.address}]:{c.port} ")  # pinned in the state dir ...
    assert f"[{c.address}]:{c.port}" not in Path(sbx.known_hosts).read_text()  # ... nowhere else
    r = fab.on(sbx, "deploy", "--host", c.name)
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "trust-host", "--host", c.name, "--yes")
    assert r.rc == 0 and "already trusted" in r.out


def test_trust_host_known_hosts_pins_where_ssh_looks(make_sandbox, fab) -> None:
    """`trust-host --known-hosts` (issue 22 #5): the pin is in the user's known_hosts (the
    ssh_config's UserKnownHostsFile), so plain ssh logs in and deleting the state dir loses
    nothing: deploy and cleanup-secrets still reach the host."""
    import shutil

    from tests.integration.test_hosts_ssh import ssh_ok

    sbx = make_sandbox(hosts=1)
    c = sbx.containers[0]
    sbx.forget_host_key(c.name)
    assert not ssh_ok(sbx, c.name, "-o", "StrictHostKeyChecking=yes")
    r = fab.on(sbx, "trust-host", "--host", c.name, "--yes")
    assert r.rc == 0 and "plain ssh does not read it" in r.text, explain(r)
    assert "--known-hosts" in r.text
    r = fab.on(sbx, "trust-host", "--host", c.name, "--yes", "--known-hosts")
    assert r.rc == 0, explain(r)
    assert f"in {sbx.known_hosts}" in r.out.replace("\n", "")  # says which file holds it
    assert f"[{c.address}]:{c.port} " in Path(sbx.known_hosts).read_text()
    assert ssh_ok(sbx, c.name, "-o", "StrictHostKeyChecking=yes")
    shutil.rmtree(sbx.state_dir)
    r = fab.on(sbx, "deploy", "--host", c.name)
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "cleanup-secrets", "--host", c.name)
    assert r.rc == 0 and not key_file(c).exists(), explain(r)


def test_set_key_then_push_key_replaces_the_key(make_sandbox, fab) -> None:
    sbx = make_sandbox(hosts=1, api=False)
    c = sbx.containers[0]
    assert fab.on(sbx, "deploy", "--host", c.name).rc == 0
    new_key = "sk-or-v1-" + secrets.token_hex(32)
    r = fab.on(sbx, "set-key", input_text=new_key + "\n")
    assert r.rc == 0 and new_key not in r.text, explain(r)
    r = fab.on(sbx, "push-key")
    assert r.rc == 0 and "placed key" in r.out and new_key not in r.text, explain(r)
    assert key_file(c).read_text() == new_key
    fingerprints = [e["fingerprint"] for e in ledger(sbx) if e["event"] == "placed"]
    assert len(set(fingerprints)) == 2
    assert fingerprints[-1] == hashlib.sha256(new_key.encode()).hexdigest()[:8]  # never the key
    r = fab.on(sbx, "cleanup-secrets")
    assert r.rc == 0 and not key_file(c).exists(), explain(r)


def test_stop_resume_and_partial_fetch(make_sandbox, fab, tmp_path: Path) -> None:
    sbx = make_sandbox(hosts=1, api_latency_s=0.6)
    c = sbx.containers[0]
    assert fab.on(sbx, "deploy", "--host", c.name).rc == 0
    r = fab.on(sbx, "launch", "--input", str(PROMPTS), "--concurrency", "1")
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "launch", "--input", str(PROMPTS))
    assert r.rc != 0 and "already running" in r.text  # refuses a second copy
    r = fab.on(sbx, "status", "--json")
    assert r.rc == 0 and json.loads(r.out.splitlines()[-1])["state"] == "running", explain(r)
    follow = fab.popen(sbx, "logs", "--follow", "--lines", "5")
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()  # streams while the job runs
        assert first.strip(), "logs --follow printed nothing"
    finally:
        follow.send_signal(signal.SIGINT)  # Ctrl-C ends it cleanly
        _out, err = follow.communicate(timeout=15)
    assert follow.returncode == 0 and "Traceback" not in err, err
    r = fab.on(sbx, "stop", "--timeout", "30")
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "status", "--json")
    rec = json.loads(r.out.splitlines()[-1])
    assert r.rc != 0 and rec["state"] == "stopped" and rec["alive"] is False  # stopped: non-zero
    dest = tmp_path / "out"
    assert fab.on(sbx, "fetch", "--dest", str(dest)).rc == 0
    partial = ids_in(dest / c.name / "prompts" / "output.jsonl")
    assert 0 < len(partial) < input_ids()

    r = fab.on(sbx, "launch", "--input", str(PROMPTS), "--concurrency", "16")  # resumes
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "status", "--wait", "--interval", "0.5", timeout=180)
    assert r.rc == 0 and "finished" in r.out, explain(r)
    r = fab.on(sbx, "fetch", "--dest", str(dest))
    assert r.rc == 0 and "resumed" in r.out, explain(r)
    folder = dest / c.name / "prompts"
    got = ids_in(folder / "output.jsonl") + ids_in(folder / "output.errors.jsonl")
    assert len(got) == len(set(got)) == input_ids()
    assert got[: len(partial)] == partial  # the partial file was continued, not replaced
    r = fab.on(sbx, "logs", "--lines", "5")
    assert r.rc == 0 and r.out.strip(), explain(r)
    assert fab.on(sbx, "cleanup-secrets").rc == 0


def test_demo_end_to_end_leaves_home_untouched(tmp_path: Path) -> None:
    """`fab demo` as the README runs it: the whole checklist, results kept, sandbox gone,
    and the caller's HOME (its ~/.ssh and keyring) never written."""
    home = tmp_path / "home"
    home.mkdir()
    results = tmp_path / "demo-results"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
           "COLUMNS": "160", "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([str(FAB), "demo", "--results", str(results)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "demo done" in proc.stdout and str(results) in proc.stdout.replace("\n", "")
    got = [json.loads(line)["id"] for f in results.glob("*/prompts/output.jsonl")
           for line in f.read_text().splitlines()]
    assert len(got) == len(set(got)) == input_ids()
    merged = [json.loads(line)["id"] for line in (results / "prompts" / "output.jsonl").read_text().splitlines()]
    assert sorted(merged, key=str) == sorted(got, key=str)  # the shards, merged by fetch
    assert list(home.iterdir()) == []  # no ~/.ssh, no keyring, nothing
    assert "handoff-demo-" not in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                                 text=True).stdout
    # it ends with the report, its path said; the report opens in a real browser with no
    # error and shows the figures of the records
    report = results / "report.html"
    assert f"the report: {report}" in " ".join(proc.stdout.split()), proc.stdout[-2000:]
    check_demo_report(results, tmp_path)


def check_demo_report(results: Path, tmp_path: Path) -> None:
    import statistics

    from tests.support.browser import CHROMIUM, Chromium

    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: scripts/bootstrap installs Debian's package")
    out = [json.loads(line) for line in (results / "prompts" / "output.jsonl").read_text().splitlines()]
    q = statistics.quantiles([r["latency_s"] for r in out], n=100, method="inclusive")
    with Chromium(tmp_path / "chromium") as browser:
        for page in (results / "report.html", results / "prompts" / "report.html"):
            browser.open(page.as_uri())
            figures = browser.evaluate("JSON.parse(document.getElementById('handoff-summary')"
                                       ".textContent)")
            assert figures["samples"] == len(out) and figures["failed"] == 0
            assert abs(figures["cost_usd"] - sum(r["usage"]["cost"] for r in out)) < 1e-6
            assert abs(figures["latency_s"]["p50"] - q[49]) < 1e-3
            browser.screenshot(tmp_path / f"{page.parent.name}.png", full_page=True)
        assert browser.errors == []
