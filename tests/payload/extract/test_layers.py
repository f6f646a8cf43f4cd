"""The extract package's layers, written down and enforced: a module imports only from
layers below its own (or, inside one sub-package, from modules that do not import it
back), and the import graph has no circle. Every import counts: lazy ones inside
functions and those under TYPE_CHECKING too (a circle there still ties two modules).

The order is the one payload/extract/__init__.py's docstring states. A new module must be
given a layer here; the test fails until it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.payload.extract.helpers import REPO

EXTRACT = REPO / "payload" / "extract"
PKG = "payload.extract"

# Lowest first. Modules of one layer do not import each other, except inside a package.
LAYERS: list[tuple[str, set[str]]] = [
    ("records to tokens and masks", {"tokens"}),
    ("a sample's tensors, batches and files", {"tensors", "batching", "writer"}),
    ("the output formats", {"formats"}),
    ("flags, the disk preflight, the run's reports", {"config", "preflight", "status",
                                                       "progress"}),
    ("model backends", {"backends"}),
    ("the run's stages", {"pipeline"}),
    ("the subcommand's entry (add_arguments, run)", {"__init__"}),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_of(module: str) -> str:
    """`payload.extract.formats.base` -> `formats`; the package itself -> `__init__`."""
    rest = module.removeprefix(PKG).lstrip(".")
    return rest.split(".")[0] if rest else "__init__"


def layer_of(module: str) -> int:
    name = top_of(module)
    for i, (_, names) in enumerate(LAYERS):
        if name in names:
            return i
    raise AssertionError(f"{module} has no layer: add it to LAYERS in {__file__}")


def extract_imports(path: Path, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(imported payload.extract module, line) for every import, lazy ones included."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith(PKG)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if not base.startswith(PKG):
                continue
            # `from payload.extract import formats`: names may be modules of that package
            known = {module_name(p) for p in modules()}
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            found += [(m, node.lineno) for m in subs] if subs else [(base, node.lineno)]
    return found


def modules() -> list[Path]:
    return sorted(p for p in EXTRACT.rglob("*.py") if "__pycache__" not in p.parts)


def graph() -> dict[str, list[tuple[str, int]]]:
    return {module_name(p): extract_imports(p, module_name(p), p.name == "__init__.py")
            for p in modules()}


def upward(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    bad = []
    for module, imports in edges.items():
        mine = layer_of(module)
        for imported, line in imports:
            if top_of(imported) == top_of(module) and top_of(module) != "__init__":
                continue  # inside one package (formats.*, backends.*): the circle check
            theirs = layer_of(imported)
            if theirs >= mine:
                bad.append(f"{module}:{line} ({LAYERS[mine][0]}) imports {imported} "
                           f"({LAYERS[theirs][0]})")
    return bad


def circles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Every import circle, each as the path that closes it (depth-first search)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for nxt, _ in edges.get(m, []):
            if nxt == m:
                continue
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    return found


def test_every_module_has_a_layer() -> None:
    for path in modules():
        layer_of(module_name(path))


def test_no_import_runs_upward() -> None:
    bad = upward(graph())
    assert bad == [], "\n".join(bad)


def test_no_circle() -> None:
    assert circles(graph()) == []


def test_extract_never_imports_the_generator() -> None:
    for path in modules():
        text = path.read_text()
        assert "payload.generate" not in text and "from ..generate" not in text, path


def test_the_checks_see_a_planted_circle_and_an_upward_import() -> None:
    """Not vacuous: the old formats.py <-> rows.py circle (a lazy import one way, a
    direct one the other) is caught, and so is a format importing the pipeline."""
    edges = graph()
    edges["payload.extract.formats.base"] = [
        *edges["payload.extract.formats.base"], ("payload.extract.formats.speculators", 1)]
    assert ["payload.extract.formats.base", "payload.extract.formats.speculators",
            "payload.extract.formats.base"] in circles(edges)
    edges["payload.extract.formats.native"] = [("payload.extract.pipeline", 7)]
    assert any("formats.native:7" in line for line in upward(edges))
