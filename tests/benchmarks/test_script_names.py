"""A benchmark runs as `python benchmarks/NAME.py`, which puts benchmarks/ first on sys.path:
a script named like a package the code imports would be imported instead of it
(benchmarks/datasets.py once broke the speculators format's `import datasets` in
benchmarks/extract.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_no_benchmark_script_shadows_an_importable_module() -> None:
    stems = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if p.stem != "__init__")
    shadowing = [stem for stem in stems if importlib.util.find_spec(stem) is not None]
    assert stems and shadowing == []
