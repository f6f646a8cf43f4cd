"""benchmarks/deploy.py writes only its own `## Deploy` section of BENCHMARKS.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("bench_deploy", REPO / "benchmarks" / "deploy.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_deploy"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_section_is_appended_then_replaced_leaving_other_sections(tmp_path: Path) -> None:
    bench = _module()
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\n## Generator\n\nkeep me\n")
    bench.write_section("first figures", path)
    assert path.read_text() == "# Benchmarks\n\n## Generator\n\nkeep me\n\n## Deploy\n\nfirst figures\n"
    path.write_text(path.read_text() + "\n## Extractor\n\nkeep me too\n")
    bench.write_section("second figures", path)
    text = path.read_text()
    assert "first figures" not in text and "second figures" in text
    assert text.index("## Generator") < text.index("## Deploy") < text.index("## Extractor")
    assert text.count("keep me") == 2


def test_report_ratios_are_paired_per_rep() -> None:
    bench = _module()
    fab = bench.Tool("fab deploy", [], {}, REPO, lambda c: REPO, fresh=[1.0, 2.0, 1.0],
                     noop=[0.9, 1.0, 1.1])
    peer = bench.Tool("pyinfra", [], {}, REPO, lambda c: REPO, fresh=[3.0, 4.0, 2.5],
                      noop=[2.0, 2.0, 2.0])
    bench.LOAD[:] = [0.5, 0.7]
    run = bench.SizeRun(8, [fab, peer], startup=[0.4, 0.4, 0.4], status=[0.5, 0.6, 0.7],
                        status_jobs=6, status_records=48)
    text = bench.report([run], 3, "cmd")
    # per-rep ratios 3.0, 2.0, 2.5 -> median 2.5 (the ratio of medians would say 3.0)
    assert "### 8 hosts" in text and "| 2.5× |" in text
    assert "2.5× faster (target ≥2×: met)" in text
    assert "fresh deploy to 8 hosts: 1.00 s (target ≤3 s: met)" in text
    assert "no-op redeploy to 8 hosts: 1.00 s (target ≤2 s: met)" in text
    assert "`fab status` over 8 hosts with 6 jobs each: 0.60 s (target ≤2 s: met; all 48 jobs read)" in text
    run.status_records = 8  # a status that reads one job per host says so
    assert "8 of the 48 jobs read" in bench.report([run], 3, "cmd")
