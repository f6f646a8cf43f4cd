"""The interpreter the sandbox containers run the payload with.

The workstation's Python may live under /root (pyenv), which the throwaway users cannot
read, so the containers share one venv made from the system `/usr/bin/python3` with
aiohttp installed. It is cached outside every home (`$HANDOFF_SANDBOX_CACHE`, default
`/var/cache/handoff-sandbox`) and keyed by interpreter version and requirements, so tests
and the demo pay pip once per machine, not once per run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from handoff.testing.sandbox._system import SandboxError, run

BASE_PYTHON = "/usr/bin/python3"
REQUIREMENTS = ("aiohttp>=3.9,<4",)
DEFAULT_CACHE = "/var/cache/handoff-sandbox"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def cache_dir() -> Path:
    return Path(os.environ.get("HANDOFF_SANDBOX_CACHE") or DEFAULT_CACHE)


def _base_version(base: str) -> str:
    return run([base, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"]).stdout.strip()


def remote_python(*, base: str = BASE_PYTHON) -> str:
    """Path of the shared venv's python, building the venv on first use.

    `$HANDOFF_SANDBOX_PYTHON` short-circuits everything (an interpreter you prepared, which
    the sandbox users must be able to run and which must import aiohttp).
    """
    override = os.environ.get("HANDOFF_SANDBOX_PYTHON")
    if override:
        return override
    if not os.access(base, os.X_OK):
        raise SandboxError(f"{base} is missing: the sandbox builds the containers' venv from it "
                           "(`apt-get install -y python3 python3-venv`)")
    version = _base_version(base)
    key = hashlib.sha256(f"{base} {version} {' '.join(REQUIREMENTS)}".encode()).hexdigest()[:12]
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    venv = root / f"venv-{key}"
    python = venv / "bin" / "python"
    if python.exists():
        return str(python)
    # One builder at a time across processes (parallel test sessions); the others wait and
    # then find the finished venv. Build under a temp name and rename: never a half venv.
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists():
            return str(python)
        tmp = root / f".venv-{key}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _build(base, tmp, version)
            _make_world_readable(tmp)
            os.rename(tmp, venv)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(python)


def _build(base: str, venv: Path, version: str) -> None:
    run([base, "-m", "venv", str(venv)], timeout=120)
    py = str(venv / "bin" / "python")
    pip = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          *REQUIREMENTS], capture_output=True, text=True, timeout=600, check=False)
    if pip.returncode == 0:
        return
    # Offline: the workstation's own aiohttp is usable when it was built for the same
    # Python minor version (same ABI), so copy its installed distributions over.
    if _copy_from_workstation(venv, version):
        return
    raise SandboxError(
        f"could not install {', '.join(REQUIREMENTS)} into the sandbox venv {venv} "
        f"(is PyPI reachable?): {pip.stderr.strip().splitlines()[-1:] or pip.stdout}. "
        f"Fix: make pip work for {base}, or set HANDOFF_SANDBOX_PYTHON to an interpreter "
        "that imports aiohttp and that unprivileged users can run."
    )


def _copy_from_workstation(venv: Path, version: str) -> bool:
    if version.rsplit(".", 1)[0] != "{}.{}".format(*sys.version_info[:2]):
        return False
    site = next(iter(venv.glob("lib/python*/site-packages")), None)
    if site is None:
        return False
    todo, seen = ["aiohttp"], set()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            if name == "aiohttp":
                return False
            continue  # an optional or marker-excluded requirement that is not installed
        for file in dist.files or []:
            origin = Path(str(dist.locate_file(file)))
            if not origin.is_file() or ".." in file.parts:
                continue
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            match = _NAME.match(requirement)
            if match:
                todo.append(match.group(0))
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        return run([str(venv / "bin" / "python"), "-c", "import aiohttp"], check=False).returncode == 0
    return False


def _make_world_readable(path: Path) -> None:
    for folder, dirs, files in os.walk(path):
        os.chmod(folder, 0o755)
        for name in files:
            target = os.path.join(folder, name)
            if not os.path.islink(target):
                os.chmod(target, os.stat(target).st_mode | 0o444)
        for name in dirs:
            target = os.path.join(folder, name)
            if not os.path.islink(target):
                os.chmod(target, 0o755)
