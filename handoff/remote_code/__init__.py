"""Code that runs ON the hosts, kept as real modules so ruff, mypy and the tests see it.

Each module here is a small stdlib-only script for the host's python (>= 3.10): it reads
one JSON object from `sys.argv[1]`, does its work and prints one JSON object. It never
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

PROBE = "probe"
JOBS = "jobs"
FETCH_LIST = "fetch_list"
INSTALL = "install"


@cache
def source(name: str) -> str:
    """The source text of remote module `name`, as shipped to `python -c`."""
    path = Path(__file__).with_name(f"{name}.py")
    if name.startswith("_") or not path.is_file():
        raise RuntimeError(f"no remote module {name!r} in {path.parent}")
    return path.read_text(encoding="utf-8")
