"""The payload zipapp: reproducible bytes, only payload/**/*.py, runnable, built from the
installed payload package; and the release steps on a host (a local fake session)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from handoff.ops import releases

REPO = Path(__file__).resolve().parents[3]


def test_build_is_reproducible_and_sha_named() -> None:
    a = releases.build_bytes()
    b = releases.build_bytes()
    assert a == b
    rel = releases.build()
    assert rel.data == a and len(rel.sha12) == 12 and rel.sha256.startswith(rel.sha12)


def test_entries_sorted_fixed_metadata_python_only(tmp_path: Path) -> None:
    pkg = tmp_path / "payload"
    shutil.copytree(REPO / "payload", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "__pycache__").mkdir(exist_ok=True)
    (pkg / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (pkg / "notes.txt").write_text("not shipped")
    first = releases.build_bytes(pkg)
    # touching files (new mtimes) and changing permissions must not change the bytes
    for p in pkg.rglob("*.py"):
        os.utime(p, (1_000_000_000, 1_000_000_000))
        p.chmod(0o600)
    assert releases.build_bytes(pkg) == first
    zf = zipfile.ZipFile(io.BytesIO(first))
    names = zf.namelist()
    assert names[0] == "__main__.py" and names[1:] == sorted(names[1:])
    assert all(n.startswith("payload/") and n.endswith(".py") for n in names[1:])
    assert all(i.date_time == (1980, 1, 1, 0, 0, 0) for i in zf.infolist())
    assert {i.external_attr >> 16 & 0o777 for i in zf.infolist()} == {0o644}
    assert zf.read("__main__.py").decode() == releases.MAIN
    # a content change changes the sha
    (pkg / "__init__.py").write_text((pkg / "__init__.py").read_text() + "\n# changed\n")
    assert releases.build_bytes(pkg) != first


def test_pyz_runs_the_payload_cli(tmp_path: Path) -> None:
    pyz = tmp_path / "payload.pyz"
    pyz.write_bytes(releases.build_bytes())
    proc = subprocess.run([sys.executable, str(pyz), "--help"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "generate" in proc.stdout and "smoke" in proc.stdout
