"""Where handoff finds its files on the workstation: the project directory, not the
package's own location.

The project directory is the folder holding the fabfile `fab` loaded (fabfile.py calls
`use_project`), else the current directory. Under it:
- `inventory/hosts.yml`: the inventory (`$HANDOFF_INVENTORY` overrides it);
- `roles/*.yml`: local roles, which override the default roles shipped with the package
  (`handoff/data/roles/`) file by file and may add new ones;
- `.handoff/`: the local state dir (`$HANDOFF_STATE_DIR` overrides it);
- `results/`: where `fab fetch` writes by default (`--dest` chooses another folder).

So an installed handoff (pip install, no checkout) works from any project folder, and a
checkout behaves the same as before: its root is the project directory.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DATA = Path(__file__).resolve().parents[1] / "data"

_project: Path | None = None


def use_project(folder: Path | str) -> None:
    """Make `folder` the project directory (the fabfile's folder) for this process."""
    global _project
    _project = Path(folder).resolve()


def project_dir() -> Path:
    return _project if _project is not None else Path.cwd()


def inventory_path() -> Path:
    env = os.environ.get("HANDOFF_INVENTORY")
    if env:
        return Path(env).expanduser().resolve()
    return project_dir() / "inventory" / "hosts.yml"


def state_dir() -> Path:
    env = os.environ.get("HANDOFF_STATE_DIR")
    path = Path(env).expanduser() if env else project_dir() / ".handoff"
    return path.resolve()


def results_dir() -> Path:
    """`fab fetch`'s default destination: `results/` in the project folder (git-ignored), from
    whichever folder below it the command runs, as the inventory and the state dir are."""
    return project_dir() / "results"


def roles_dirs() -> list[Path]:
    """Where roles are looked up, first match wins: the project's `roles/`, then the
    defaults shipped with the package."""
    local = project_dir() / "roles"
    shipped = PACKAGE_DATA / "roles"
    if local.is_dir() and local.resolve() != shipped:
        return [local, shipped]
    return [shipped]


def demo_prompts() -> Path:
    """The prompts `fab demo` launches on (shipped with the package)."""
    return PACKAGE_DATA / "prompts.jsonl"
