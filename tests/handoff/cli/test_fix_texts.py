"""The fix a message names is the right one (issue 22 #11): a file as --dest, spaces in
--host, a folder as --input, and verify's `--install` hint keeping the host it ran on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from handoff.cli import commands
from handoff.config.roles import get_role
from handoff.host.facts import Facts
from handoff.ops.verify import evaluate
from tests.support.workstation import Workstation


def test_a_file_as_dest_is_a_usage_error(ws: Workstation, tmp_path: Path,
                                         capfd: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert commands.fetch("s", None, dest=str(afile)) == 2
    err = capfd.readouterr().err
    assert "a file, not a folder" in err and "Errno" not in err and "resume" not in err


def test_spaces_in_host_are_named_not_blamed_on_ssh_config(ws: Workstation,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    assert commands.status("s t", None) == 2
    err = capfd.readouterr().err
    assert "separate several hosts with commas: --host s,t" in err and "ssh" not in err


def test_a_folder_as_input_says_so(ws: Workstation, tmp_path: Path,
                                   capfd: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data").mkdir()
    assert commands.launch("s", None, local_input=str(tmp_path / "data") + "/", remote_input=None,
                           flags={}) == 2
    err = capfd.readouterr().err.replace("\n", " ")
    assert "a folder, not a file" in err and "/*.jsonl'" in err and "no such file" not in err


def test_verify_install_hint_keeps_the_host(ws: Workstation) -> None:
    facts = Facts(python=sys.version_info[:3], executable=sys.executable, home="/h", uid=0,
                  modules={"aiohttp": False})
    verdict = evaluate(facts, get_role("generator"), {"python": "python3"}, "--host gen-1")
    [miss] = [c for c in verdict.missing if c.name == "module aiohttp"]
    assert miss.fix.startswith("fab verify --install --host gen-1 ("), miss.fix


def test_a_second_demo_keeps_its_results_apart(tmp_path: Path) -> None:
    """The demo's second run fetched into the first one's results and said "unchanged since
    the last fetch" for a new sandbox (issue 22 #14)."""
    from handoff.cli.demo import fresh_results

    results = tmp_path / "demo-results"
    assert fresh_results(results) is None  # nothing yet
    (results / "sbx-1" / "demo").mkdir(parents=True)
    (results / "sbx-1" / "demo" / "output.jsonl").write_text("{}\n")
    aside = fresh_results(results)
    assert aside == tmp_path / "demo-results.previous" and not results.exists()
    assert (aside / "sbx-1" / "demo" / "output.jsonl").read_text() == "{}\n"
    (results / "x").mkdir(parents=True)
    assert fresh_results(results) == aside and (aside / "x").is_dir()  # the one before dropped
