"""Code that runs ON the hosts, kept as real modules so ruff, mypy and the tests see it.

Each module here is a small stdlib-only script for the host's python (>= 3.10): it reads
its arguments from `sys.argv[1]` (`encode_args`: a Python literal, evaluated with no
builtins, so the host needs no parser; json's imports `re`, 5-6 ms of a probe), does its
work and prints one JSON object (read on the control side with `json.loads`, never
evaluated: the host is not trusted). It never
imports handoff (the host has none) nor any other module of this package: the control
side ships a module's *source* in one round trip, as `python -c SOURCE ARGS`
(`Session.run_code`), so what runs on the host is exactly the file below. ARGS never holds
a secret: it is visible in the host's process list while the script runs.

- `probe`: read-only facts for verify and deploy (python, modules, disk, releases, files).
- `jobs`: one job's state, its detached start, its graceful stop.
- `fetch_list`: the files of a job folder, with prefix hashes for resumed downloads.
- `install`: a venv under remote_dir with pip-installed modules (`verify --install`).

Locally the modules import like any other (the tests call their functions directly), and
this package's `__init__` stays import-free so that importing them costs nothing.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

PROBE = "probe"
JOBS = "jobs"
FETCH_LIST = "fetch_list"
INSTALL = "install"


def encode_args(args: dict[str, Any]) -> str:
    """`args` (plain data: dicts, lists, strings, numbers, booleans, None) as the literal
    a remote module's `main` evaluates."""
    if not _plain(args):  # a Path, a set, inf...: its repr would not evaluate the same
        raise RuntimeError(f"remote arguments must be plain data: {args!r:.200}")
    return repr(args)


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return abs(value) != float("inf") and value == value
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


@cache
def source(name: str) -> str:
    """The source text of remote module `name`, as shipped to `python -c`."""
    path = Path(__file__).with_name(f"{name}.py")
    if name.startswith("_") or not path.is_file():
        raise RuntimeError(f"no remote module {name!r} in {path.parent}")
    return path.read_text(encoding="utf-8")
