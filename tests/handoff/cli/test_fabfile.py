"""The CLI surface: every documented task (docs/commands.md) exists, `fab -l` gives one line per task quickly,
and `fab --help TASK` explains every flag."""

from __future__ import annotations

import inspect
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fabfile
from tests.support.fab import FAB, REPO

TASKS = ["deploy", "verify", "push-script", "push-key", "trust-host", "set-key", "smoke-test",
         "launch", "status", "logs", "stop", "fetch", "cleanup-secrets", "demo",
         "jobs", "forget", "report"]


def fab_tasks() -> dict[str, object]:
    from invoke import Task

    return {name.replace("_", "-"): obj for name, obj in vars(fabfile).items() if isinstance(obj, Task)}


def test_every_design_task_exists() -> None:
    assert sorted(fab_tasks()) == sorted(TASKS)


def test_every_flag_has_help_and_no_short_flags() -> None:
    for name, task in fab_tasks().items():
        params = [p for p in inspect.signature(task.body).parameters if p != "c"]  # type: ignore[attr-defined]
        assert set(params) == set(task.help), f"{name}: flags without help: {set(params) - set(task.help)}"  # type: ignore[attr-defined]
        assert task.auto_shortflags is False, name  # type: ignore[attr-defined]
        assert "host" not in params or params[0] == "host"


@pytest.mark.serial  # wall time < 5 s: run alone (scripts/test's serial pass)
def test_fab_list_is_one_line_per_task_and_quick() -> None:
    start = time.monotonic()
    out = subprocess.run([str(FAB if FAB.exists() else sys.executable), "-l"], cwd=REPO,
                         capture_output=True, text=True, timeout=60).stdout
    elapsed = time.monotonic() - start
    lines = [line for line in out.splitlines()[2:] if line.strip()]
    assert len(lines) == len(TASKS), out  # no wrapped continuation lines
    assert elapsed < 5  # lazy imports: no paramiko session, no rich tables, no YAML here


def test_help_explains_host_flag() -> None:
    out = subprocess.run([str(FAB), "--help", "deploy"], cwd=REPO, capture_output=True, text=True,
                         timeout=60).stdout
    assert "--host=STRING" in out and "ssh_config alias" in out and "--dry-run" in out
    assert "-h" not in out.split("Options:")[1].replace("--host", "")


def test_a_finished_task_spares_the_exit_a_full_collection() -> None:
    """`_done` freezes the heap (shutdown then skips collecting it) and still maps a non-zero
    code to invoke's Exit; a fresh interpreter, as the frozen heap outlives the call."""
    code = ("import gc, fabfile, invoke\n"
            "fabfile._done(0); assert gc.get_freeze_count() > 0\n"
            "try:\n    fabfile._done(3)\nexcept invoke.Exit as exc:\n    print(exc.code)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "3"


CHANGING = ["deploy", "verify", "push-script", "push-key", "launch", "stop", "cleanup-secrets",
            "forget"]


def test_every_task_that_changes_a_host_has_dry_run() -> None:
    tasks = fab_tasks()
    for name in CHANGING:
        assert "dry_run" in tasks[name].help, name  # type: ignore[attr-defined]


def test_dry_runs_through_fab_connect_to_nothing(tmp_path: Path) -> None:
    """`fab launch/stop/cleanup-secrets --dry-run` print their plans for hosts that do not
    exist (nothing listens at 127.0.0.1:9): no connection is even tried."""
    inv = tmp_path / "hosts.yml"
    inv.write_text("hosts:\n  a: {address: 127.0.0.1, port: 9, roles: [generator]}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HANDOFF_INVENTORY": str(inv),
           "HANDOFF_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "250", "NO_COLOR": "1"}
    for args, expect in ((["launch", "--remote-input", "/in.jsonl"], "start job in detached"),
                         (["stop", "--timeout", "5"], "SIGTERM"),
                         (["verify", "--install"], "pip-install missing modules")):
        out = subprocess.run([str(FAB), *args, "--dry-run", "--host", "a"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "dry run" in out.stdout and expect in out.stdout, out
    out = subprocess.run([str(FAB), "cleanup-secrets", "--dry-run"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    # The ledger is empty, yet the inventory's host is still to be checked for a key file
    # (a wiped state dir must not hide one): planned, not contacted.
    assert out.returncode == 0 and "remove the key file .handoff/secrets/openrouter.key" in \
        out.stdout and "then revoke the child keys" in out.stdout, out


def test_dash_h_is_one_run_over_exactly_the_named_hosts(tmp_path: Path) -> None:
    """Fabric's -H/--hosts reach the task's --host (handoff.cli.program via fabric.yaml): one plan per
    named host, in one run, never the inventory's hosts; a task that acts on no host, and
    Fabric's connection flags handoff does not use, are refused with exit 2."""
    inv = tmp_path / "hosts.yml"
    inv.write_text("hosts:\n  a: {address: 127.0.0.1, port: 9, roles: [generator]}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HANDOFF_INVENTORY": str(inv),
           "HANDOFF_STATE_DIR": str(tmp_path / "state"), "NO_COLOR": "1"}

    def fab(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(FAB), *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60)

    out = fab("-H", "u@127.0.0.1:10,u@127.0.0.1:11", "stop", "--dry-run")
    assert out.returncode == 0, out
    assert out.stdout.count("dry run") == 1  # one run, not one per host
    assert "u@127.0.0.1:10 (" in out.stdout and "u@127.0.0.1:11 (" in out.stdout
    assert "a (" not in out.stdout
    assert "hosts: u@127.0.0.1:10, u@127.0.0.1:11 (named with --host/-H)" in out.stderr
    for args in (["-H", "a", "set-key"], ["-H", "a", "demo"], ["-i", "k", "stop", "--dry-run"],
                 ["-H", ",", "stop", "--dry-run"]):
        refused = fab(*args)
        assert refused.returncode == 2 and "error:" in refused.stderr, (args, refused)
        assert "Traceback" not in refused.stderr
    for args in (["logs", "--lines", "ten"], ["status", "--interval", "fast"],
                 ["stop", "--timeout", "x", "--dry-run"], ["launch", "--concurrency", "abc"],
                 ["demo", "--hosts", "many"]):
        bad = fab(*args)
        assert bad.returncode == 2 and args[1] in bad.stderr and "Traceback" not in bad.stderr, bad


def test_the_venvs_fab_is_handoffs_program() -> None:
    """`[project.scripts] fab` replaces Fabric's script: the venv's `fab` runs
    handoff.cli.program (issue 22 #10), and `fab -l` / `fab --help TASK` still work."""
    assert "handoff.cli.program" in FAB.read_text()
    listing = subprocess.run([str(FAB), "-l"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and "deploy" in listing.stdout
    helped = subprocess.run([str(FAB), "--help", "stop"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert helped.returncode == 0 and "--timeout" in helped.stdout


def test_every_usage_error_is_exit_2_with_a_suggestion(tmp_path: Path) -> None:
    """invoke answered "No idea what '--hsot' is!" with exit 1, and `-t x` with a traceback."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1",
           "HANDOFF_STATE_DIR": str(tmp_path / "state")}
    cases = [(["deploy", "--hsot", "x"], "unknown flag '--hsot'; did you mean '--host'?"),
             (["deplyo"], "unknown task 'deplyo'; did you mean 'deploy'?"),
             (["--help", "deplyo"], "did you mean 'deploy'?"),
             (["deploy", "--host", "a", "--host", "b"], "--host is given twice"),
             (["-t", "x", "deploy"], "wrong type"),
             (["stop", "--dry-run", "--timout", "0"], "did you mean '--timeout'?")]
    for args, expected in cases:
        out = subprocess.run([str(FAB), *args], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2, (args, out)
        assert expected in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)


def test_the_project_is_found_from_a_parent_folder_or_given(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"}

    def fab(*args: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(FAB), *args], cwd=cwd, env={**env, **extra},
                              capture_output=True, text=True, timeout=60)

    assert "deploy" in fab("-l", cwd=REPO / "docs").stdout  # a folder below the project
    outside = fab("-l", cwd=tmp_path)
    assert outside.returncode == 2 and "no handoff project here" in outside.stderr
    assert "--project DIR" in outside.stderr and "Can't find" not in outside.stderr
    assert "deploy" in fab("--project", str(REPO), "-l", cwd=tmp_path).stdout
    assert "deploy" in fab("-l", cwd=tmp_path, HANDOFF_PROJECT=str(REPO)).stdout
    wrong = fab("--project", str(tmp_path), "-l", cwd=tmp_path)
    assert wrong.returncode == 2 and "no fabfile.py there" in wrong.stderr


def test_version_names_handoff_first_and_help_leaves_out_refused_flags() -> None:
    """`fab --version` showed only Fabric/Paramiko/Invoke, and `fab --help` listed flags handoff
    refuses (issue 32 #11); `-R/--dry` looked like a dry run and changed the hosts all the same."""
    from handoff import __version__

    def fab(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(FAB), *args], cwd=REPO, capture_output=True, text=True, timeout=60)

    version = fab("--version")
    assert version.returncode == 0 and version.stdout.splitlines()[0] == f"handoff {__version__}"
    assert "Fabric " in version.stdout
    helped = fab("--help").stdout
    for refused in ("--identity", "--prompt-for-", "--ssh-config", "--connect-timeout", "--dry,",
                    "--dry ", "--echo", "--pty", "--hide", "--warn-only", "--command-timeout"):
        assert refused not in helped, (refused, helped)
    assert "--hosts" in helped and "--project" in helped and "--version" in helped
    dry = fab("-R", "stop")
    assert dry.returncode == 2 and "--dry-run" in dry.stderr and "Traceback" not in dry.stderr
