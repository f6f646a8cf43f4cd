"""Every usage error is exit 2 with a suggestion, and Ctrl-D at every prompt is a plain
"no": both run through the real `fab` (handoff's program) and are recorded with the
session's other runs, so the no-traceback check (test_no_tracebacks.py, run last) covers
them too (issue 22 #7, #10)."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import termios
import time
from typing import Any

import pytest

from tests.integration.conftest import ALL_RESULTS, REPO, FabResult, clean_env, explain
from tests.support.fab import FAB

USAGE_ERRORS = [
    (["deploy", "--hsot", "x"], "did you mean '--host'?"),
    (["deplyo"], "did you mean 'deploy'?"),
    (["--help", "deplyo"], "did you mean 'deploy'?"),
    (["deploy", "--host", "a", "--host", "b"], "--host is given twice"),
    (["-t", "x", "deploy"], "wrong type"),
    (["-H", "a", "set-key"], "acts on no host"),
    (["status", "--interval", "fast"], "--interval"),
    (["logs", "--lines", "ten"], "--lines"),
    (["stop", "--timeout", "x"], "--timeout"),
    (["launch", "--concurrency", "abc"], "--concurrency"),
    (["forget"], "needs --job"),
    (["--project", "/nonexistent", "-l"], "no fabfile.py there"),
]


@pytest.mark.parametrize("args, expected", USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_every_usage_error_is_exit_2_with_its_fix(sandbox, fab, args: list[str], expected: str) -> None:
    r = fab(*args)
    assert r.rc == 2 and expected in r.err, explain(r)
    assert "Traceback" not in r.text


def on_a_terminal(sbx: Any, args: list[str], prompt: bytes, keys: bytes = b"\x04",
                  timeout: float = 60.0) -> FabResult:
    """`fab ARGS` with a pty as its controlling terminal (stdin, stdout, stderr, /dev/tty):
    once `prompt` shows, type `keys` (Ctrl-D: end of input). Recorded with the session's runs."""
    master, slave = os.openpty()

    def controlling_tty() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([str(FAB), *args], cwd=REPO, env=clean_env(sbx, {"TERM": "xterm"}),
                            stdin=slave, stdout=slave, stderr=slave, preexec_fn=controlling_tty)
    os.close(slave)
    out, sent = b"", False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal: it ended
                break
            if not chunk:
                break
            out += chunk
        if not sent and prompt in out:
            os.write(master, keys)
            sent = True
        if proc.poll() is not None and not ready:
            break
    try:
        rc = proc.wait(timeout=10)
    finally:
        os.close(master)
    result = FabResult(rc, out.decode("utf-8", "replace"), "")
    ALL_RESULTS.append(result)
    assert sent, f"the prompt {prompt!r} never showed:\n{explain(result)}"
    return result


def test_ctrl_d_at_every_prompt_is_a_no_without_a_traceback(make_sandbox) -> None:
    sbx = make_sandbox(hosts=1, api=False)
    c = sbx.containers[0]
    r = on_a_terminal(sbx, ["set-key"], b"(hidden)")
    assert r.rc == 2 and "empty key; nothing stored" in r.out and "EOFError" not in r.out, explain(r)
    sbx.forget_host_key(c.name)
    r = on_a_terminal(sbx, ["trust-host", "--host", c.name], b"[y/N]")
    assert r.rc == 1 and "not pinned" in r.out and "EOFError" not in r.out, explain(r)
    r = on_a_terminal(sbx, ["forget", "--host", c.name, "--job", "x"], b"[y/N]")
    assert r.rc == 1 and "nothing removed" in r.out and "EOFError" not in r.out, explain(r)
    for result in ALL_RESULTS[-3:]:
        assert "Traceback" not in result.text, explain(result)
