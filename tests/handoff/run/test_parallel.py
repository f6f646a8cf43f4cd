"""Many hosts: one failing host never stops the others, output is grouped, the summary
names the failures; everything printed is redacted, even when rich wraps the line."""

from __future__ import annotations

import secrets as pysecrets
import threading
import time

import pytest

from handoff import console
from handoff.errors import RemoteError
from handoff.host.targets import Target
from handoff.run.parallel import HostReport, run_parallel
from handoff.ssh.endpoint import Endpoint
from payload.redact import REDACTOR


def target(name: str) -> Target:
    return Target(name, name, Endpoint("127.0.0.1", 22, "u"), None, None, {})


@pytest.fixture(autouse=True)
def fresh_console() -> None:
    console._console = None
    console._err_console = None


def test_failures_are_isolated_and_summarised(capfd: pytest.CaptureFixture[str]) -> None:
    started: list[str] = []
    lock = threading.Lock()

    def work(t: Target, report: HostReport) -> None:
        with lock:
            started.append(t.label)
        report.log(f"line 1 of {t.label}")
        time.sleep(0.05)
        report.log(f"line 2 of {t.label}")
        if t.label == "h2":
            raise RemoteError("h2: disk full")
        if t.label == "h3":
            raise ValueError("a bug")
        report.summary = "fine"

    reports = run_parallel([target(f"h{i}") for i in range(1, 6)], work, title="test")
    out = capfd.readouterr().out
    assert sorted(started) == ["h1", "h2", "h3", "h4", "h5"]
    assert [r.ok for r in reports] == [True, False, False, True, True]
    assert reports[2].error is not None and "ValueError: a bug" in reports[2].error
    for i in range(1, 6):  # grouped: each host's two lines are adjacent
        lines = out.splitlines()
        first = lines.index(f"line 1 of h{i}")
        assert lines[first + 1] == f"line 2 of h{i}"
    assert "3/5 hosts ok; failed: h2, h3" in out
    assert "disk full" in out


@pytest.mark.serial  # wall time < 1.2 s: run alone (scripts/test's serial pass)
def test_runs_in_parallel() -> None:
    def work(t: Target, report: HostReport) -> None:
        time.sleep(0.3)

    start = time.monotonic()
    run_parallel([target(f"h{i}") for i in range(8)], work, title="t", summary=False)
    assert time.monotonic() - start < 1.2


def test_everything_printed_is_redacted(capfd: pytest.CaptureFixture[str]) -> None:
    key = "sk-or-v1-" + pysecrets.token_hex(32)
    REDACTOR.add(key)
    console.say(f"the key is {key} " * 3)  # long: rich wraps it at 80 columns
    console.say(console.table("t", ["a", "b"], [[key, f"x{key}y"]]))
    console.error(f"failed with {key}")
    console.warn(key)

    def work(t: Target, report: HostReport) -> None:
        report.log(key)
        raise RemoteError(f"remote said {key}")

    run_parallel([target("h1"), target("h2")], work, title="t")
    captured = capfd.readouterr()
    both = captured.out + captured.err
    assert key not in both.replace("\n", "")
    assert key[9:30] not in both.replace("\n", "")
    assert "sk-or-v1-****" in both


def test_output_off_a_terminal_is_never_cut(capfd: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipe is not 80 columns: rows and messages come out whole, on one line each."""
    monkeypatch.setenv("COLUMNS", "40")
    long_cell = "10047/0/12000 " + "x" * 150
    console.say(console.table("status", ["host", "done/failed/total", "note"],
                              [["h1", long_cell, "a long note " * 10]]))
    console.error("h1: " + "a long error message that must stay on one line " * 4)
    console.say(console.heading("h1 u@127.0.0.1:22"))
    captured = capfd.readouterr()
    assert "…" not in captured.out
    row = next(line for line in captured.out.splitlines() if "h1" in line and "10047" in line)
    assert long_cell in row and ("a long note " * 10).strip() in row
    assert len([line for line in captured.err.splitlines() if line.strip()]) == 1
    assert "── h1 u@127.0.0.1:22" in captured.out and len(captured.out.splitlines()[-1]) < 40


def test_one_host_failure_is_said_once(capfd: pytest.CaptureFixture[str]) -> None:
    def work(t: Target, report: HostReport) -> None:
        raise RemoteError(f"{t.label}: input is empty: nothing to generate")

    run_parallel([target("h1")], work, title="launch")
    out = capfd.readouterr().out
    assert out.count("input is empty") == 1, out


def test_failures_are_listed_whole_below_the_summary(capfd: pytest.CaptureFixture[str]) -> None:
    def work(t: Target, report: HostReport) -> None:
        if t.label == "h2":
            raise RemoteError("h2: " + "disk full on /data, " * 8)

    run_parallel([target("h1"), target("h2")], work, title="t")
    tail = capfd.readouterr().out.split("t summary", 1)[1]
    assert "✗ h2: " + ("disk full on /data, " * 8).strip() in tail


def test_every_error_of_several_hosts_is_printed_once(capfd: pytest.CaptureFixture[str]) -> None:
    """Each failed host's error was printed in its block and again under the summary (issue 32
    #11): once now, under the summary; a block with other lines points there."""
    def work(t: Target, report: HostReport) -> None:
        if t.label == "h2":
            report.log("  ✓ probed")
        raise RemoteError(f"{t.label}: no job 'nope' on the host")

    run_parallel([target("h1"), target("h2"), target("h3")], work, title="logs")
    out = capfd.readouterr().out
    for label in ("h1", "h2", "h3"):
        assert out.count(f"{label}: no job 'nope'") == 1, out
    assert "✓ probed\n✗ failed (why: under the summary below)" in out, out
