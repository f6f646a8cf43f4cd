"""The layers of both packages, written down and enforced.

A module imports only from its own package (without a circle) or from packages in layers
below its own; packages side by side in one layer do not import each other. This is what
keeps shared types below their users (no `Skipped` imported up from a plan, no `Facts` from
verify) and the whole graph acyclic. Every import counts, the lazy ones inside functions
included.

Both packages are written down here the same way, lowest first: a list of layers (each
naming its packages or top-level modules) and, per package, its rows (its modules and
subpackages in order; inside a package a module imports only from a lower row). A new
package or module must be given a place, and the test fails until it is. The payload: the
common modules one by one, the features `generate` and `extract` above them (which never
import each other), the command line on top; and the payload never imports `handoff` (it
is zipped and shipped alone). Imports under `if TYPE_CHECKING:` count as well: a circle
there still ties two modules together.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Lowest first; each layer: (what it is, its packages or top-level modules).
HANDOFF_LAYERS: list[tuple[str, set[str]]] = [
    ("foundations: errors, defaults, console output, threads",
     {"__init__", "errors", "defaults", "console", "threads"}),
    ("config: workstation paths, files, flags, inventory, roles, layout, state, keyring", {"config"}),
    ("ssh: ssh_config, host keys, endpoints and routes, connections, bulk SFTP", {"ssh"}),
    ("host: targets, the Session seam and its SSH side, facts, transfers, remote code", {"host"}),
    ("run: plans, their executor, running on many hosts", {"run"}),
    ("ops: the operations; testing: the fake API, the sandbox, the local session",
     {"ops", "testing"}),
    ("cli: the commands, how fab runs them, the demo", {"cli"}),
]
# Inside a package, its modules (and subpackages) in the same way, lowest first: a module
# imports from its own row's package-mates only through a lower row (or within its own
# subpackage). A package without a row list here only has to be free of circles.
HANDOFF_WITHIN: dict[str, list[set[str]]] = {
    "config": [{"yamlfile", "os_keyring"}, {"paths", "layout", "flags"}, {"templates"}, {"state", "roles"},
               {"inventory", "shards"}],
    "ssh": [{"config_scan"}, {"ssh_config", "known_hosts", "sftp"}, {"certificates"},
            {"hostkeys"}, {"endpoint"}, {"auth"}, {"connect"}],
    "host": [{"remote_code", "progress", "untrusted"}, {"targets"}, {"session"},
             {"ssh_session", "facts", "transfer"}, {"keyrecord"}],
    "run": [{"parallel"}, {"plan"}],
    # the operations do not import each other: what one needs of another (the management
    # key for a launch's limits) the command hands it (Plan.private, a callable)
    "ops": [{"keyapi", "merge_index", "local_copies"}, {"verify", "releases", "secrets", "jobs", "trust", "merge"},
            {"fetch", "report"}, {"deploy"}],
    "testing": [{"fakekeys", "local", "fakerun"}, {"fakeapi"}, {"sandbox"}],
    "cli": [{"commands", "program"}, {"demo"}],
}
# The payload, lowest first: the common modules one by one (each imports only those before
# it), the two features (which do not import each other), the command line on top. Every
# module must be named (a new common module too: the test fails until it is).
PAYLOAD_COMMON = ["errors", "defaults", "redact", "units", "atomic", "report", "records",
                  "keyfile"]
PAYLOAD_LAYERS: list[tuple[str, set[str]]] = [
    ("the package itself (its version only)", {"__init__"}),
    *[(f"common: {name}", {name}) for name in PAYLOAD_COMMON],
    ("the features, which do not import each other", {"generate", "extract"}),
    ("the command line", {"cli"}),
    ("`python -m payload`", {"__main__"}),
]
# Inside each feature its modules, lowest first, as its `__init__` docstring lists them.
# "__init__" is the package module itself: generate's imports nothing of generate (its
# modules may import it); extract's is the subcommand's entry, on top. Inside a subpackage
# (extract's formats/, backends/) only circles are checked.
PAYLOAD_WITHIN: dict[str, list[set[str]]] = {
    "generate": [{"__init__"}, *({m} for m in [
        "sse", "client", "streaming", "batchapi", "outage", "evidence", "slots", "limiter", "budget", "systematic",
        "journal", "inputs", "turns", "batchstate", "preflight", "progress", "settings", "stop",
        "recorder", "attempts", "batch", "smoke", "run"])],
    "extract": [
        {"rendering"},                                    # the completion form
        {"conversations"},                                # records to conversations
        {"tokens"},                                       # conversations to tokens and masks
        {"tensors", "batching", "writer"},                # a sample's tensors, batches, files
        {"feature_dtype"},                                # how features are stored (FP8)
        {"formats"},                                      # the output formats
        {"config", "preflight", "status", "progress", "metrics"},  # flags, preflight, reports
        {"backends"},                                     # model backends
        {"meta", "writing"},                              # meta.json, writing a batch
        {"pipeline"},                                     # the run's stages
        {"__init__"},                                     # the subcommand (add_arguments, run)
    ],
}
# Circles known and being removed elsewhere; each entry is one pair, to delete once gone.
# Import circles tolerated while a split is under way (none now): each entry is a pair of
# modules; test_every_known_circle_is_still_there fails once its circle is gone.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def module_name(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(path: Path, module: str, top: str, exists: Iterable[str] = ()) -> list[tuple[str, int]]:
    """(imported module of package `top`, line) for every import in the file, the lazy ones
    included; `from pkg import name` counts as importing the module `pkg.name` when there is
    one (`exists`), else `pkg` itself."""
    known = set(exists)
    package = module if is_package(path) else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names
                      if a.name == top or a.name.startswith(top + ".")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this package
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if base != top and not base.startswith(top + "."):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub if sub in known or base == top else base, node.lineno))
    return list(dict.fromkeys(found))


def modules(top: str, root: Path = REPO) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / top).rglob("*.py"))
            if "__pycache__" not in p.parts}


def unit_of(module: str) -> str:
    """`handoff.ops.jobs.state` -> `ops`; `handoff` itself -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_index(unit: str, layers: list[tuple[str, set[str]]], top: str) -> int:
    for i, (_, names) in enumerate(layers):
        if unit in names:
            return i
    raise AssertionError(f"{top}.{unit} has no layer: add it to the layers in {__file__}")


def row_of(package: str, name: str, rows: list[set[str]]) -> int:
    for i, names in enumerate(rows):
        if name in names:
            return i
    raise AssertionError(f"{package}.{name} has no row: add it to the package's rows in {__file__}")


def part_of(module: str) -> str:
    """`handoff.ops.jobs.state` -> `jobs` (its part of package `ops`); a package's own
    module (`handoff.ops`) -> `__init__`."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def upward(top: str, layers: list[tuple[str, set[str]]], root: Path = REPO,
           within: dict[str, list[set[str]]] | None = None) -> list[str]:
    """Every import of a module in the same or a higher layer's other package; inside a
    package with rows (`within`), of a module in the same or a higher row. The package's
    own module (`__init__`) is checked only where its rows place it."""
    found = modules(top, root)
    bad = []
    for module, path in found.items():
        mine = unit_of(module)
        level = layer_index(mine, layers, top)
        for imported, line in imports(path, module, top, found):
            theirs = unit_of(imported)
            if theirs == mine and (mine != "__init__" or module == imported):
                rows = (within or {}).get(mine)
                a, b = part_of(module), part_of(imported)
                placed = rows and ("__init__" not in (a, b)
                                   or any("__init__" in r for r in rows))
                if placed and a != b:  # two parts of one package with rows
                    here, there = row_of(mine, a, rows), row_of(mine, b, rows)
                    if there >= here:
                        bad.append(f"{path.relative_to(root)}:{line}: {module} (row {here + 1} "
                                   f"of {top}.{mine}) imports {imported} (row {there + 1})")
                continue  # otherwise inside one package: the circle check covers it
            other = layer_index(theirs, layers, top)
            if other >= level:
                bad.append(f"{path.relative_to(root)}:{line}: {module} ({layers[level][0]}) "
                           f"imports {imported} ({layers[other][0]})")
    return bad


def circles(top: str, root: Path = REPO, allowed: set[frozenset[str]] | None = None) -> list[list[str]]:
    """The module-level import cycles of package `top` (strongly connected components of
    more than one module, or a module importing itself), minus the allowed pairs."""
    found = modules(top, root)
    graph = {m: {i for i, _ in imports(p, m, top, found) if i in found and i != m}
             for m, p in found.items()}
    for pair in allowed or set():
        a, b = sorted(pair)
        graph.get(a, set()).discard(b)
        graph.get(b, set()).discard(a)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_handoff_package_has_a_layer() -> None:
    for module in modules("handoff"):
        layer_index(unit_of(module), HANDOFF_LAYERS, "handoff")


def test_handoff_has_a_handful_of_top_level_modules() -> None:
    top = sorted(p.stem for p in (REPO / "handoff").glob("*.py"))
    assert top == ["__init__", "console", "defaults", "errors", "threads"]


def test_every_payload_module_has_a_layer() -> None:
    for module in modules("payload"):
        layer_index(unit_of(module), PAYLOAD_LAYERS, "payload")


@pytest.mark.parametrize(("top", "within"), [("handoff", HANDOFF_WITHIN),
                                             ("payload", PAYLOAD_WITHIN)])
def test_every_part_of_a_package_with_rows_has_a_row(top: str, within: dict) -> None:
    for module in modules(top):
        parts = module.split(".")
        if len(parts) > 2 and parts[1] in within:
            row_of(parts[1], parts[2], within[parts[1]])


def test_no_handoff_import_runs_upward() -> None:
    bad = upward("handoff", HANDOFF_LAYERS, within=HANDOFF_WITHIN)
    assert bad == [], "\n".join(bad)


def test_no_payload_import_runs_upward() -> None:
    bad = upward("payload", PAYLOAD_LAYERS, within=PAYLOAD_WITHIN)
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("top", ["handoff", "payload"])
def test_no_import_circle(top: str) -> None:
    found = circles(top, allowed=KNOWN_CIRCLES)
    assert found == [], "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_known_circle_is_still_there() -> None:
    """An allowance outlives its circle only until this test fails: then delete it."""
    for pair in KNOWN_CIRCLES:
        top = next(iter(pair)).split(".")[0]
        assert any(pair <= set(c) for c in circles(top)), (
            f"{' <-> '.join(sorted(pair))} is no longer a circle: delete it from KNOWN_CIRCLES")


def test_test_support_is_imported_only_by_the_demo() -> None:
    found = modules("handoff")
    users = {m for m, p in found.items()
             for i, _ in imports(p, m, "handoff", found) if i.startswith("handoff.testing")}
    assert {u for u in users if not u.startswith("handoff.testing")} == {"handoff.cli.demo"}


def test_remote_code_imports_nothing_of_handoff() -> None:
    for path in (REPO / "handoff" / "host" / "remote_code").glob("*.py"):
        assert imports(path, module_name(path), "handoff") == [], path


def handoff_imports(root: Path = REPO) -> list[str]:
    """Every import of handoff in the payload, as `file:line: module imports what`."""
    return [f"{path.relative_to(root)}:{line}: {module} imports {imported}"
            for module, path in modules("payload", root).items()
            for imported, line in imports(path, module, "handoff")]


def test_the_payload_never_imports_handoff() -> None:
    bad = handoff_imports()
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize(("feature", "other"), [("generate", "extract"), ("extract", "generate")])
def test_generate_and_extract_never_import_each_other(feature: str, other: str) -> None:
    """Beside the layer check (peers of one layer), by name too: not even a string that
    imports the other feature (importlib) nor a relative `..other` import."""
    found = modules("payload")
    for module, path in found.items():
        if unit_of(module) == feature:
            assert not [i for i, _ in imports(path, module, "payload", found)
                        if unit_of(i) == other], path
            text = path.read_text()
            assert f"payload.{other}" not in text and f"from ..{other}" not in text, path


# --- the checker itself: not vacuous ----------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    """Lazy imports inside a function, `from handoff import x`, `from pkg import module`,
    relative imports and those under `if TYPE_CHECKING:` are all seen."""
    _tree(tmp_path, {"handoff/__init__.py": "", "handoff/config/__init__.py": "",
                     "handoff/config/state.py": "", "handoff/config/paths.py": "",
                     "handoff/cli/__init__.py": "", "handoff/cli/commands.py": "",
                     "handoff/config/x.py": (
                         "import handoff.errors\n"
                         "def f():\n    from handoff.cli.commands import deploy\n"
                         "    from handoff import run, console\n"
                         "    from handoff.config import state\n    from . import paths\n"
                         "from typing import TYPE_CHECKING\n"
                         "if TYPE_CHECKING:\n    from handoff.run.plan import Plan\n")})
    path = tmp_path / "handoff/config/x.py"
    got = imports(path, "handoff.config.x", "handoff", modules("handoff", tmp_path))
    assert [m for m, _ in got] == ["handoff.errors", "handoff.cli.commands", "handoff.run",
                                   "handoff.console", "handoff.config.state",
                                   "handoff.config.paths",
                                   "handoff.run.plan"]


def test_the_checker_fails_on_a_planted_upward_import(tmp_path: Path) -> None:
    _tree(tmp_path, {"handoff/__init__.py": "", "handoff/errors.py": "",
                     "handoff/config/__init__.py": "",
                     "handoff/config/state.py": "def f():\n    from handoff.ops import deploy\n",
                     "handoff/ops/__init__.py": "", "handoff/ops/deploy.py": "import handoff.errors\n",
                     "handoff/testing/__init__.py": "",
                     "handoff/testing/local.py": "from handoff.ops import deploy\n"})
    bad = upward("handoff", HANDOFF_LAYERS, tmp_path)
    assert len(bad) == 2, bad
    assert upward("handoff", HANDOFF_LAYERS, tmp_path, HANDOFF_WITHIN) == bad
    assert bad[0].startswith("handoff/config/state.py:2: handoff.config.state (config")
    assert "imports handoff.ops.deploy (ops" in bad[0]
    assert bad[1].startswith("handoff/testing/local.py:1:")  # a peer package of the same layer


def test_the_checker_fails_on_an_import_up_the_rows_of_a_package(tmp_path: Path) -> None:
    _tree(tmp_path, {"handoff/__init__.py": "", "handoff/ops/__init__.py": "",
                     "handoff/ops/jobs/__init__.py": "", "handoff/ops/secrets/__init__.py": "",
                     "handoff/ops/jobs/status.py": "def f():\n    from handoff.ops.secrets import x\n",
                     "handoff/ops/jobs/state.py": "from handoff.ops import keyapi\n",
                     "handoff/ops/keyapi.py": "from handoff.ops.jobs import state\n",
                     "handoff/ops/deploy.py": "from handoff.ops import secrets\n"})
    bad = upward("handoff", HANDOFF_LAYERS, tmp_path, HANDOFF_WITHIN)
    assert [b.split(": ", 1)[0] for b in bad] == ["handoff/ops/jobs/status.py:2",
                                                  "handoff/ops/keyapi.py:1"], bad
    assert "(row 2 of handoff.ops) imports handoff.ops.secrets (row 2)" in bad[0]


def test_the_checker_fails_on_a_planted_circle(tmp_path: Path) -> None:
    _tree(tmp_path, {"payload/__init__.py": "", "payload/extract/__init__.py": "",
                     "payload/extract/a.py": "from payload.extract import b\n",
                     "payload/extract/b.py": "def f():\n    from .c import x\n",
                     "payload/extract/c.py": "from payload.extract.a import y\n",
                     "payload/extract/d.py": "from payload.extract import a\n"})
    assert circles("payload", tmp_path) == [["payload.extract.a", "payload.extract.b",
                                             "payload.extract.c"]]
    pair = {frozenset({"payload.extract.a", "payload.extract.b"})}
    assert circles("payload", tmp_path, pair) == []  # an allowance lifts exactly its pair


def test_the_payload_checker_fails_on_features_importing_each_other(tmp_path: Path) -> None:
    _tree(tmp_path, {"payload/__init__.py": "", "payload/records.py": "",
                     "payload/generate/__init__.py": "", "payload/extract/__init__.py": "",
                     "payload/generate/run.py": "from payload import records\n",
                     "payload/extract/rows.py": "from payload.generate import run\n",
                     "payload/keyfile.py": "from payload.cli import main\n",
                     "payload/cli.py": "from payload.extract import rows\n"})
    bad = upward("payload", PAYLOAD_LAYERS, tmp_path)
    assert [b.split(":")[0] for b in bad] == ["payload/extract/rows.py", "payload/keyfile.py"]


def _payload_copy(root: Path, planted: dict[str, str]) -> None:
    """The real payload under `root`, with lines appended to some of its modules."""
    shutil.copytree(REPO / "payload", root / "payload",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in planted.items():
        path = root / "payload" / name
        path.write_text((path.read_text() if path.exists() else "") + text)


def test_the_payload_checker_fails_on_planted_upward_imports(tmp_path: Path) -> None:
    """Not vacuous on the real tree: generate's client importing its orchestrator (up
    generate's rows), a common module importing the command line lazily, one common module
    importing a later one, generate importing extract, extract's formats importing its
    pipeline under TYPE_CHECKING (up extract's rows), a module of extract importing the
    package's entry, and handoff imported from a common module: all caught."""
    _payload_copy(tmp_path, {
        "generate/client.py": "\nfrom payload.generate.run import run\n",
        "records.py": "\ndef f():\n    from payload import cli\n",
        "units.py": "\nfrom payload import records\n",
        "generate/budget.py": "\nfrom payload.extract import formats\n",
        "extract/formats/native.py": ("\nfrom typing import TYPE_CHECKING\n"
                                      "if TYPE_CHECKING:\n    from ..pipeline import Run\n"),
        "extract/tokens.py": "\nfrom payload.extract import add_arguments\n",
        "atomic.py": "\nimport handoff.console\n"})
    bad = upward("payload", PAYLOAD_LAYERS, tmp_path, PAYLOAD_WITHIN)
    want = ["payload.generate.client (row ", "imports payload.generate.run (row ",
            "payload.records (common: records) imports payload.cli (the command line)",
            "payload.units (common: units) imports payload.records (common: records)",
            "payload.generate.budget (the features, which do not import each other) imports "
            "payload.extract.formats (the features",
            "payload.extract.formats.native (row 6 of payload.extract) imports "
            "payload.extract.pipeline (row 10)",
            "payload.extract.tokens (row 3 of payload.extract) imports payload.extract (row 11)"]
    assert len(bad) == 6, "\n".join(bad)
    for text in want:
        assert any(text in line for line in bad), (text, bad)
    assert upward("payload", PAYLOAD_LAYERS, tmp_path) != []  # the layers alone see some
    assert [line.split(": ", 1)[1] for line in handoff_imports(tmp_path)] == [
        "payload.atomic imports handoff.console"]


def test_the_payload_checker_fails_on_a_planted_circle_in_the_real_tree(tmp_path: Path) -> None:
    """The old formats <-> rows kind of circle (a lazy import one way, a direct one the
    other), planted inside extract's formats/ (where rows do not apply), is caught."""
    assert circles("payload") == []
    _payload_copy(tmp_path, {
        "extract/formats/base.py": "\ndef f():\n    from payload.extract.formats import speculators\n"})
    speculators = (tmp_path / "payload/extract/formats/speculators.py").read_text()
    assert "from payload.extract.formats.base import" in speculators or (
        "from .base import" in speculators)
    found = circles("payload", tmp_path)
    assert any({"payload.extract.formats.base", "payload.extract.formats.speculators"} <= set(c)
               for c in found), found
    assert upward("payload", PAYLOAD_LAYERS, tmp_path, PAYLOAD_WITHIN) == []  # a circle only


def test_the_session_protocol_and_the_local_session_do_not_pull_in_paramiko() -> None:
    """`handoff.host.session` is the seam alone: the local session (and any code that only
    needs the protocol) imports without paramiko; the SSH side is handoff.host.ssh_session."""
    code = ("import sys, handoff.testing.local, handoff.host.session; "
            "print('paramiko' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "False"

