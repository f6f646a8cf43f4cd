"""Helpers for payload tests: keys, prompt files, and `python -m payload …` as a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handoff.testing.fakeapi import FakeOpenRouter, answer_digest
from payload.records import errors_path

REPO = Path(__file__).resolve().parents[2]


def make_key() -> str:
    return "sk-or-v1-" + secrets.token_hex(32)


def write_private(path: Path, text: str, mode: int = 0o600) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)
    return path


def write_prompts(path: Path, n: int, *, start: int = 0, extra_lines: dict[int, str] | None = None
                  ) -> list[str]:
    """n prompts with int ids start..start+n-1; `extra_lines` inserts raw lines before index i."""
    ids = []
    with path.open("w", encoding="utf-8") as fh:
        for i in range(start, start + n):
            if extra_lines and i in extra_lines:
                fh.write(extra_lines[i] + "\n")
            fh.write(json.dumps({"id": i, "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": f"question number {i}"}]}) + "\n")
            ids.append(str(i))
    return ids


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def payload_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # No key from the outer environment, and no proxy: the fake API is on loopback.
    env = {k: v for k, v in os.environ.items()
           if k != "OPENROUTER_API_KEY" and not k.lower().endswith("_proxy")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra or {})
    return env


def payload_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "payload", *args]


def run_payload(*args: str, env: dict[str, str] | None = None, timeout: float = 60
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(payload_cmd(*args), cwd=REPO, env=payload_env(env), text=True,
                          capture_output=True, timeout=timeout)


# The status file (and the outage and stall checks) every 0.2 s instead of 2 s: a test
# that waits for the status to show something, or for --outage-timeout to pass, waits for
# that, not for the next tick.
STATUS_EVERY = "0.2"


def gen_args(fake: FakeOpenRouter, key_file: Path, inp: Path, out: Path, *extra: str
             ) -> list[str]:
    return ["generate", "--input", str(inp), "--output", str(out), "--base-url", fake.base_url,
            "--api-key-file", str(key_file), "--backoff-base", "0.02",
            "--request-timeout", "5", "--status-every", STATUS_EVERY, *extra]


def status_of(out: Path) -> dict[str, Any]:
    """The status file beside `out` (`out.jsonl` -> `out.status.json`)."""
    return json.loads(out.with_name(out.name.replace(".jsonl", ".status.json")).read_text())


def wait_for_status(out: Path, ready: Callable[[dict[str, Any]], bool], timeout: float = 30
                    ) -> dict[str, Any]:
    """Poll the status file until `ready(status)` (or `timeout` s): the last one read."""
    deadline = time.monotonic() + timeout
    st: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):  # not written yet / being replaced
            st = status_of(out)
            if ready(st):
                break
        time.sleep(0.05)
    return st


def assert_paired(records: list[dict[str, Any]]) -> None:
    """Every answer embeds the digest of its own prompt's last user message."""
    for r in records:
        assert r["response"] == f"answer {answer_digest(r['messages'])}", r["id"]


def assert_exactly_once(ids: list[str], out: Path
                        ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every id in exactly one of the output and errors files, exactly once."""
    done = read_jsonl(out)
    failed = read_jsonl(errors_path(out))
    seen = [str(r["id"]) for r in done] + [str(r["id"]) for r in failed]
    assert len(seen) == len(set(seen)), "an id was recorded twice"
    assert sorted(seen) == sorted(ids), "an id was lost"
    return done, failed
