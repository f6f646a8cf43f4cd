"""The control plane's layers, written down and enforced: a module imports only from its own
layer's package or from layers below it. This is what keeps shared types below their users
(no `Skipped` imported up from a plan, no `Facts` from verify) and the graph acyclic.

Every import counts, including the lazy ones inside functions. A new module must be given
a layer here; the test fails until it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HANDOFF = REPO / "handoff"

# Lowest first. Within a layer, modules do not import each other (except within a package).
LAYERS: list[tuple[str, set[str]]] = [
    ("code that runs on the hosts (stdlib only)", {"remote_code"}),
    ("foundations", {"errors", "defaults", "yamlfile"}),
    ("workstation paths, output, remote layout", {"paths", "console", "layout", "flags"}),
    ("local state, roles, transfer progress", {"state", "roles", "progress"}),
    ("inventory, host keys, ssh_config", {"inventory", "hostkeys", "sshconfig"}),
    ("ssh connections, bulk SFTP", {"ssh", "sftpio"}),
    ("targets", {"targets"}),
    ("the session seam", {"session"}),
    ("running on many hosts", {"parallel"}),
    ("host facts, moving bytes", {"facts", "transfer"}),
    ("child keys: the management API, the record beside a key", {"keyapi"}),
    ("plans and their executor", {"plan"}),
    ("operations, grouped by what they act on", {"verify", "releases", "secrets", "jobs", "trust"}),
    ("merging a job's fetched shards into one dataset", {"merge"}),
    ("fetching jobs' outputs", {"fetch"}),
    ("plans composed of several operations", {"deploy"}),
    ("command entry points; how fab runs them", {"commands", "cli"}),
    ("test support (the fake API, the sandbox, the local session)", {"testing"}),
    ("the demo: the commands against the test sandbox", {"demo"}),
]
TOP = {"__init__"}  # handoff/__init__.py: the version, imports nothing


def layer_of(module: str) -> int:
    """`handoff.jobs.state` -> the layer of `jobs`."""
    name = module.split(".")[1] if module.count(".") else "__init__"
    for i, (_, names) in enumerate(LAYERS):
        if name in names:
            return i
    if name in TOP:
        return -1
    raise AssertionError(f"handoff.{name} has no layer: add it to LAYERS in {__file__}")


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def handoff_imports(path: Path, module: str | None = None) -> list[tuple[str, int]]:
    """(imported handoff module, line) for every import in the file, lazy ones included."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("handoff")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if base == "handoff":  # `from handoff import x`: x is a module
                found += [(f"handoff.{a.name}", node.lineno) for a in node.names]
            elif base.startswith("handoff."):
                found.append((base, node.lineno))
    return found


def modules() -> list[Path]:
    return sorted(p for p in HANDOFF.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_has_a_layer() -> None:
    for path in modules():
        layer_of(module_name(path))


def test_no_import_runs_upward() -> None:
    upward = []
    for path in modules():
        module = module_name(path)
        mine = layer_of(module)
        own_package = module.split(".")[:2]
        for imported, line in handoff_imports(path):
            if imported.split(".")[:2] == own_package:
                continue  # inside one package (handoff.jobs.*, handoff.testing.*)
            theirs = layer_of(imported)
            if theirs >= mine:
                upward.append(f"{path.relative_to(REPO)}:{line}: {module} ({LAYERS[mine][0]}) imports "
                              f"{imported} ({LAYERS[theirs][0]})")
    assert upward == [], "\n".join(upward)


def test_test_support_is_imported_only_by_the_demo() -> None:
    users = {module_name(p) for p in modules()
             for imported, _ in handoff_imports(p) if imported.startswith("handoff.testing")}
    product = {u for u in users if not u.startswith("handoff.testing")}
    assert product == {"handoff.demo"}


def test_remote_code_imports_nothing_of_handoff() -> None:
    for path in (HANDOFF / "remote_code").glob("*.py"):
        assert handoff_imports(path) == [], path


def test_the_payload_never_imports_handoff() -> None:
    for path in sorted((REPO / "payload").rglob("*.py")):
        assert handoff_imports(path) == [], path


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """Not vacuous: lazy imports inside a function, `from handoff import x` and relative
    imports are all seen, and one of them running upward is caught."""
    fake = tmp_path / "state.py"
    fake.write_text("import handoff.errors\n"
                    "def f():\n    from handoff.commands import deploy\n"
                    "    from handoff import plan, console\n    from . import paths\n")
    got = handoff_imports(fake, "handoff.state")
    assert [m for m, _ in got] == ["handoff.errors", "handoff.commands", "handoff.plan",
                                   "handoff.console", "handoff.paths"]
    mine = layer_of("handoff.state")
    assert [m for m, _ in got if layer_of(m) >= mine] == ["handoff.commands", "handoff.plan"]
