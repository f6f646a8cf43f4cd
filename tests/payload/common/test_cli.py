"""The command entry (payload/cli.py) and how it ships: the zipapp runs `generate`, and a
payload without `extract` still runs the rest."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.payload.helpers import (
    REPO,
    assert_exactly_once,
    gen_args,
    payload_env,
    write_prompts,
)

pytestmark = pytest.mark.timeout(120)


def test_zipapp_entry_runs_generate(fake_factory, key_file, tmp_path):
    """The release is `payload.pyz`: the package zipped with a root __main__.py; nothing is\n    read from disk beside the modules."""
    import zipapp
    src = tmp_path / "src"
    (src / "payload").mkdir(parents=True)
    for path in (REPO / "payload").rglob("*.py"):
        dest = src / "payload" / path.relative_to(REPO / "payload")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(path.read_bytes())
    (src / "__main__.py").write_text("from payload.cli import main\nraise SystemExit(main())\n")
    pyz = tmp_path / "payload.pyz"
    zipapp.create_archive(src, pyz)
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 10)
    env = payload_env()
    env.pop("PYTHONPATH")
    proc = subprocess.run([os.sys.executable, str(pyz), *gen_args(fake, key_file, inp, out)],
                          cwd=tmp_path, env=env, text=True, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert_exactly_once(ids, out)


def test_extract_missing_is_a_clear_usage_error(monkeypatch, capsys):
    """A payload built without `extract` (or whose import fails) still runs `generate`."""
    import sys

    import payload
    from payload import cli
    monkeypatch.setitem(sys.modules, "payload.extract", None)  # makes the import fail
    # An earlier test may have imported it, and `from . import extract` reads the attribute first.
    monkeypatch.delattr(payload, "extract", raising=False)
    assert cli.main(["extract", "--input", "x"]) == 2
    assert "extract command is not available" in capsys.readouterr().err
    assert cli.main(["generate", "--help"]) == 0
