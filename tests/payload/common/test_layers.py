"""The payload's layers, written down and enforced (docs/architecture.md, "The payload").

Lowest first: the common modules in `payload/` (each may import only those before it),
then the two engines `payload.generate` and `payload.extract` (each may import the
common modules and its own package, never the other engine), then the command entry
(`payload.cli`, `payload.__main__`) on top. Inside `generate` the modules are ordered
too (its `__init__` lists them): a module imports only those before it. The payload
never imports `handoff` (it ships alone as `payload.pyz`).

Every import counts, including the lazy ones inside functions. A new module must be given
a place here; the test fails until it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PAYLOAD = REPO / "payload"

COMMON = ["errors", "defaults", "redact", "units", "atomic", "report", "records", "keyfile"]
ENGINES = ["generate", "extract"]
TOP = ["cli", "__main__"]
GENERATE = ["client", "outage", "limiter", "budget", "systematic", "journal", "inputs",
            "turns", "preflight", "progress", "settings", "stop", "recorder", "attempts", "smoke", "run"]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, module: str | None = None, source: str | None = None
            ) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, lazy ones included; `from
    payload import x` counts as importing `payload.x`."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: list[tuple[str, int]] = []
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if base in ("payload", "payload.generate", "payload.extract"):
                found += [(f"{base}.{a.name}", node.lineno) for a in node.names]
            else:
                found.append((base, node.lineno))
    return found


def place(module: str) -> tuple[str, int] | None:
    """(layer, position in it) of a payload module: "common", "generate", "extract" or
    "top"; None for the package itself (its version only)."""
    parts = module.split(".")
    if parts == ["payload"]:
        return None
    name = parts[1]
    if name in COMMON:
        return ("common", COMMON.index(name))
    if name == "generate":
        if len(parts) == 2:
            return ("generate", -1)
        assert parts[2] in GENERATE, (
            f"payload.generate.{parts[2]} has no place: add it to GENERATE in {__file__}")
        return ("generate", GENERATE.index(parts[2]))
    if name == "extract":
        return ("extract", -1)  # extract's own order is its package's business
    if name in TOP:
        return ("top", TOP.index(name))
    raise AssertionError(f"{module} has no layer: add it to {__file__}")


def allowed(me: tuple[str, int], it: tuple[str, int]) -> str | None:
    """None if `me` may import `it`, else why not."""
    (my_layer, my_pos), (its_layer, its_pos) = me, it
    if my_layer == "top":
        return None if its_layer != "top" or its_pos < my_pos else "not below it"
    if my_layer in ENGINES:
        if its_layer == "common":
            return None
        if its_layer == my_layer:
            return None if my_layer == "extract" or its_pos < my_pos else "not before it"
        return ("one engine never imports the other" if its_layer in ENGINES
                else "an engine never imports the command entry")
    # common
    return None if its_layer == "common" and its_pos < my_pos else "not below it"


def payload_modules() -> list[Path]:
    return sorted(p for p in PAYLOAD.rglob("*.py") if "__pycache__" not in p.parts)


def violations(paths: list[Path], planted: dict[str, str] | None = None) -> list[str]:
    """Every import that breaks the order; `planted` adds modules given as {name: source}."""
    bad = []
    files = [(p, module_name(p), None) for p in paths]
    files += [(PAYLOAD / "planted.py", m, src) for m, src in (planted or {}).items()]
    for path, me, source in files:
        my_place = place(me)
        for target, line in imports(path, me, source):
            where = f"{path.relative_to(REPO)}:{line}: {me} imports {target}"
            if target == "handoff" or target.startswith("handoff."):
                bad.append(f"{where}: the payload never imports handoff")
                continue
            if not target.startswith("payload.") or my_place is None:
                continue
            their_place = place(target)
            if their_place is None or target == me:
                continue
            why = allowed(my_place, their_place)
            if why is not None:
                bad.append(f"{where}: {why}")
    return bad


def test_every_import_points_down() -> None:
    assert violations(payload_modules()) == []


def test_a_planted_upward_import_fails() -> None:
    """The check is not vacuous: the orchestrator imported from the client, the CLI from a
    common module, the extractor from the generator, handoff from anywhere: all caught."""
    client = (PAYLOAD / "generate" / "client.py").read_text()
    records = (PAYLOAD / "records.py").read_text()
    found = violations([], planted={
        "payload.generate.client": client + "\nfrom payload.generate.run import run\n",
        "payload.records": records + "\ndef f():\n    from payload import cli\n",
        "payload.generate.budget": "from payload.extract import formats\n",
        "payload.units": "import handoff.console\n"})
    assert len(found) == 4, found
    assert any("imports payload.generate.run: not before it" in v for v in found)
    assert any("imports payload.cli: not below it" in v for v in found)
    assert any("one engine never imports the other" in v for v in found)
    assert any("never imports handoff" in v for v in found)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_engine_never_imports_the_other(engine: str) -> None:
    other = next(e for e in ENGINES if e != engine)
    for path in (PAYLOAD / engine).rglob("*.py"):
        assert not [t for t, _ in imports(path) if t.startswith(f"payload.{other}")], path
