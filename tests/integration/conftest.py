"""Fixtures for the integration tests: real sshd "containers" on loopback, a real keyring.

Everything in tests/integration is marked `integration` and skipped, with the reason,
when the machine cannot host the sandbox (not root, no /usr/sbin/sshd).

- `sandbox`: one 3-container Sandbox for the whole session (do not break it: tests that
  stop a host, rotate a key or edit the inventory use `make_sandbox`).
- `make_sandbox(hosts=2, **kw)`: a function-scoped, private Sandbox, closed after the test
  (its inventory's start watch short: `FAST`).
- `fab(*args)`: runs `fab` (the one beside this interpreter) against the session sandbox; `fab.on(sbx, *args)`
  against another one. Returns FabResult(rc, out, err) and remembers every result, so
  `artifacts(sbx, fab.results)` can gather everything a run produced for leak checks.
- `KeyLeakWatch`: samples every process's argv and environment at a high rate (as `ps`
  would show them) while a command runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.support.fab import FAB, REPO

HERE = Path(__file__).resolve().parent
DEFAULT_TIMEOUT_S = 120
# Private sandboxes watch a launch's fresh jobs 0.1 s, not 1 s: none of their tests depends on
# the watch catching an instant crash (the session sandbox keeps the default: the extractor
# role's test does).
FAST = {"start_watch_s": 0.1}


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "integration tests need root (they create throwaway users and run sshd)"
    if not os.access("/usr/sbin/sshd", os.X_OK):
        return ("integration tests need /usr/sbin/sshd "
                "(apt-get install -y --no-install-recommends openssh-server)")
    if not FAB.exists():
        return f"integration tests run {FAB}; create the venv first (scripts/bootstrap)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _skip_reason()
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
    # The traceback check reads what every other test's fab runs printed: it runs last,
    # whatever the file order, the selection or the plugins that reorder tests.
    last = [item for item in items if item.get_closest_marker("after_every_fab_run")]
    items[:] = [item for item in items if item not in last] + last


# -- sandboxes -------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from handoff.testing.sandbox import Sandbox

    with Sandbox(tmp_path_factory.mktemp("sandbox"), hosts=3) as sbx:
        yield sbx


@pytest.fixture
def make_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """Factory for private sandboxes (destructive tests); all are closed after the test."""
    from handoff.testing.sandbox import Sandbox

    opened: list[Sandbox] = []

    def make(hosts: int = 2, **kwargs: Any) -> Sandbox:
        kwargs.setdefault("defaults", FAST)
        sbx = Sandbox(tmp_path_factory.mktemp("sbx"), hosts=hosts, **kwargs)
        opened.append(sbx)
        sbx.start()
        return sbx

    yield make
    for sbx in reversed(opened):
        sbx.close()


# -- running fab -----------------------------------------------------------------------------------

# Every fab run of the session, for the check that no user error ever shows a Python
# traceback (tests/integration/test_no_tracebacks.py, run last: see the hook above).
ALL_RESULTS: list[FabResult] = []
# When several pytest processes share the work (scripts/test: xdist workers, then a serial
# pass that runs the traceback check last), each fab run is also written here, one JSON
# file each, so the check sees the runs of every process. Unset: ALL_RESULTS alone.
FAB_RUNS_ENV = "HANDOFF_FAB_RUNS"


def record(result: FabResult) -> None:
    ALL_RESULTS.append(result)
    folder = os.environ.get(FAB_RUNS_ENV)
    if folder:
        path = Path(folder) / f"{os.getpid()}-{uuid.uuid4().hex}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(result._asdict(), f)


def every_result() -> list[FabResult]:
    """The fab runs of this session: of every process sharing $HANDOFF_FAB_RUNS, or of this
    one when it is unset."""
    folder = os.environ.get(FAB_RUNS_ENV)
    if not folder:
        return list(ALL_RESULTS)
    return [FabResult(**json.loads(p.read_text())) for p in sorted(Path(folder).glob("*.json"))]


class FabResult(NamedTuple):
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def clean_env(sbx: Any, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment plus the sandbox's: nothing of the caller's HOME, ssh agent,
    keyring or HANDOFF_* settings leaks into the run."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "COLUMNS": "200",
    }
    env.update(sbx.env())
    env.update(extra or {})
    return env


@dataclass
class FabRunner:
    default: Any
    results: list[FabResult] = field(default_factory=list)

    def on(self, sbx: Any, *args: str, timeout: float = DEFAULT_TIMEOUT_S,
           input_text: str | None = None, env: dict[str, str] | None = None) -> FabResult:
        proc = subprocess.run([str(FAB), *args], cwd=REPO, env=clean_env(sbx, env),
                              input=input_text, capture_output=True, text=True, timeout=timeout,
                              check=False)
        result = FabResult(proc.returncode, proc.stdout, proc.stderr)
        self.results.append(result)
        record(result)
        return result

    def popen(self, sbx: Any, *args: str) -> subprocess.Popen[str]:
        """Started, not awaited (for Ctrl-C and mid-run tests); caller collects the output."""
        return subprocess.Popen([str(FAB), *args], cwd=REPO, env=clean_env(sbx),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def __call__(self, *args: str, **kwargs: Any) -> FabResult:
        return self.on(self.default, *args, **kwargs)


@pytest.fixture
def fab(request: pytest.FixtureRequest) -> FabRunner:
    """`fab(*args)` on the session sandbox (created on first use); `fab.on(sbx, *args)`."""

    class LazyDefault:
        def env(self) -> dict[str, str]:
            return dict(request.getfixturevalue("sandbox").env())

    return FabRunner(default=LazyDefault())


_KEYLIKE = re.compile(r"sk-or-v1-[0-9a-fA-F]{8,}")


def explain(result: FabResult) -> str:
    """For assertion messages: the exit code and both streams, with anything key-shaped masked
    (a failing test must not print a key; leak tests check the raw output separately)."""
    text = f"rc={result.rc}\n--- stdout\n{result.out}\n--- stderr\n{result.err}"
    return _KEYLIKE.sub("sk-or-v1-<masked by the test>", text)


# -- what a run leaves behind ----------------------------------------------------------------------

def keyring_storage(sbx: Any) -> list[Path]:
    """Where the throwaway keyring keeps the key on purpose (excluded from leak scans)."""
    env = sbx.env()
    data = Path(env.get("XDG_DATA_HOME", sbx.home / ".local" / "share"))
    return [data / "python_keyring", data / "keyrings"]


def artifacts(sbx: Any, results: list[FabResult] = (), *, extra_dirs: tuple[Path, ...] = (),
              skip: tuple[Path, ...] = ()) -> dict[str, bytes]:
    """Everything a run produced, by label: captured outputs, the state dir, every file under
    the container homes, the sshd logs and `extra_dirs` (e.g. a fetch destination).
    `skip` names files that legitimately hold the key (a key file still placed)."""
    found: dict[str, bytes] = {}
    for i, result in enumerate(results):
        found[f"fab run {i} stdout"] = result.out.encode()
        found[f"fab run {i} stderr"] = result.err.encode()
    excluded = [p.resolve() for p in (*keyring_storage(sbx), *skip)]
    roots = [sbx.state_dir, *(c.home for c in sbx.containers), *extra_dirs,
             getattr(sbx, "hosts_dir", sbx.root / "sshd"), sbx.home]
    for root in roots:
        if not Path(root).exists():
            continue
        for path in sorted(Path(root).rglob("*")):
            resolved = path.resolve() if not path.is_symlink() else path
            if any(resolved == e or e in resolved.parents for e in excluded):
                continue
            if path.is_file() and not path.is_symlink():
                try:
                    found[str(path)] = path.read_bytes()
                except OSError:
                    continue
    return found


def find_key(key: str, haystack: dict[str, bytes]) -> list[str]:
    """Labels whose content holds the key (or its stripped core, without the sk-or-v1- prefix)."""
    needles = [key.encode(), key.split("-")[-1].encode()]
    return [label for label, data in haystack.items() if any(n in data for n in needles)]


class KeyLeakWatch:
    """Samples /proc/*/cmdline and /proc/*/environ (what `ps -eo args` and `ps e` show) in a
    thread, as fast as it can, while a command runs. `hits` lists where the key was seen."""

    def __init__(self, key: str) -> None:
        self.needles = [key.encode(), key.split("-")[-1].encode()]
        self.hits: list[str] = []
        self.samples = 0
        self.processes_seen: set[int] = set()
        self.args_seen: set[str] = set()   # distinct argv lines, to prove what was sampled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="key-leak-watch", daemon=True)
        self._me = os.getpid()

    def __enter__(self) -> KeyLeakWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()

    def sample(self) -> None:
        self.samples += 1
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == self._me:
                continue
            for kind in ("cmdline", "environ"):
                try:
                    with open(f"/proc/{entry.name}/{kind}", "rb") as fh:
                        data = fh.read()
                except OSError:
                    continue
                self.processes_seen.add(int(entry.name))
                if kind == "cmdline" and len(self.args_seen) < 5000:
                    self.args_seen.add(data.replace(b"\0", b" ").decode(errors="replace"))
                if any(n in data for n in self.needles):
                    shown = data.replace(b"\0", b" ") if kind == "cmdline" else b""
                    for needle in self.needles:  # a failing test must not print the key
                        shown = shown.replace(needle, b"<KEY>")
                    self.hits.append(f"pid {entry.name} {kind} {shown[:120]!r}")


# -- small helpers for reading a container's filesystem (as root, locally) -------------------------

def remote_dir(container: Any) -> Path:
    return Path(container.home) / ".handoff"


def key_file(container: Any) -> Path:
    return remote_dir(container) / "secrets" / "openrouter.key"


def run_as(container: Any, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run a command as the container's user (e.g. to prepare its remote state)."""
    return subprocess.run(["runuser", "-u", container.user, "--", *argv], capture_output=True,
                          text=True, check=True, cwd=container.home, timeout=60)


def wipe_remote_state(container: Any) -> None:
    shutil.rmtree(remote_dir(container), ignore_errors=True)


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()

