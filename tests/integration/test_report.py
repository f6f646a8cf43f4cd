"""`fab report` against real sshd containers and a real headless Chromium: the live page of a
job running on 3 hosts updates between two loads (its done count rises), shows every host's
state, makes no request besides its own, and Ctrl-C ends the watch cleanly."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from tests.integration.conftest import explain
from tests.support.browser import CHROMIUM, Chromium

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: scripts/bootstrap "
                                "installs Debian's package")

SUMMARY = "JSON.parse(document.getElementById('handoff-summary').textContent)"


def test_live_page_of_a_running_three_host_job(sandbox, fab, tmp_path: Path) -> None:
    hosts = ",".join(c.name for c in sandbox.containers)
    assert fab("deploy", "--host", hosts).rc == 0
    prompts = tmp_path / "live.jsonl"  # its own job: other tests' jobs share the hosts
    prompts.write_text("".join(json.dumps({"id": f"l{i}", "prompt": f"count to {i}"}) + "\n"
                               for i in range(90)))
    sandbox.api.latency_s = 0.4  # one answer in flight per host: ~12 s for the 30 of each
    watch = None
    try:
        r = fab("launch", "--input", str(prompts), "--concurrency", "1")
        assert r.rc == 0, explain(r)
        watch = fab.popen(sandbox, "report", "--watch", "--job", "live", "--interval", "1")
        assert watch.stdout is not None
        line = ""
        deadline = time.monotonic() + 60
        while "serving the live report at" not in line and time.monotonic() < deadline:
            line = watch.stdout.readline()
            assert line or watch.poll() is None, "fab report --watch ended before serving"
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, line
        with Chromium(tmp_path / "chromium") as browser:
            browser.open(url.group(0) + "live/")
            first = browser.evaluate(SUMMARY)
            assert set(first["states"]) == set(hosts.split(","))  # every host, with its state
            assert "running" in first["states"].values() and first["source"] == "live status"
            browser.screenshot(tmp_path / "live-1.png", full_page=True)
            later = first
            while later["samples"] <= first["samples"] and time.monotonic() < deadline:
                time.sleep(1.0)
                browser.open(url.group(0) + "live/")
                later = browser.evaluate(SUMMARY)
            browser.screenshot(tmp_path / "live-2.png", full_page=True)
            assert later["samples"] > first["samples"], (first, later)
            browser.open(url.group(0))  # the run's page: the job and its hosts
            run = browser.evaluate(SUMMARY)
            assert run["jobs"] == ["live"] and set(run["hosts"]) == set(hosts.split(","))
            assert browser.errors == []
            assert {u for u in browser.requests if not u.startswith("data:")} == {url.group(0)}
        watch.send_signal(signal.SIGINT)  # Ctrl-C ends it
        out, err = watch.communicate(timeout=30)
        assert watch.returncode == 0, out + err
        assert "stopped serving" in out and "Traceback" not in err
        watch = None
    finally:
        sandbox.api.latency_s = 0.0
        if watch is not None:
            watch.kill()
            watch.communicate(timeout=10)
        fab("stop", "--job", "live", "--timeout", "30")
        fab("forget", "--job", "live", "--yes")
