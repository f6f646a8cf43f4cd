"""The CLI surface: every task DESIGN names exists, `fab -l` gives one line per task quickly,
and `fab --help TASK` explains every flag."""

from __future__ import annotations

import inspect
import subprocess
import sys
import time
from pathlib import Path

import fabfile

REPO = Path(__file__).resolve().parents[2]
FAB = REPO / ".venv" / "bin" / "fab"
TASKS = ["deploy", "verify", "push-script", "push-key", "trust-host", "set-key", "smoke-test",
         "launch", "status", "logs", "stop", "fetch", "cleanup-secrets", "demo"]


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
