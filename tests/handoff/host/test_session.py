"""The session seam: quoting, the venv preference, remote modules through a session, the
local fake's files behaving as SFTP's (relative to home, exclusive create with its mode)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from handoff.errors import RemoteError
from handoff.host import remote_code
from handoff.host.session import sh_path
from handoff.testing.local import LocalSession
from tests.support.workstation import Workstation


def test_sh_path_keeps_home_expandable_and_quotes_the_rest() -> None:
    assert sh_path("~") == '"$HOME"'
    assert sh_path("~/a b/c") == "\"$HOME\"/'a b/c'"
    assert sh_path("/x;rm -rf /") == "'/x;rm -rf /'"
    out = subprocess.run(["sh", "-c", f"echo {sh_path('~/a b')}"], capture_output=True, text=True,
                         env={"HOME": "/h"}).stdout
    assert out == "/h/a b\n"


def test_run_code_prefers_the_venv_verify_made(ws: Workstation) -> None:
    [target] = ws.targets("a")
    with ws.connect(target) as s:
        facts = s.run_code(remote_code.PROBE, {"remote_dir": "~/.handoff"}, "probe")
        assert facts["executable"] == sys.executable
        venv_python = ws.remote_dir("a") / "venv" / "bin" / "python"
        venv_python.parent.mkdir(parents=True)
        venv_python.symlink_to(sys.executable)
        # Not yet: only a venv handoff made (its marker says so) is used.
        assert s.run_code(remote_code.PROBE, {"remote_dir": "~/.handoff"},
                          "probe")["executable"] == sys.executable
        (venv_python.parent.parent / ".handoff-venv").write_text("")
        again = s.run_code(remote_code.PROBE, {"remote_dir": "~/.handoff"}, "probe")
        assert again["executable"] == str(venv_python)


def test_run_code_failures_name_the_host_and_the_fix(ws: Workstation) -> None:
    [target] = ws.targets("a", flags={"python": "no-such-python3"})
    with ws.connect(target) as s, pytest.raises(RemoteError, match="a: python 'no-such-python3' not found"):
        s.run_code(remote_code.PROBE, {"remote_dir": "~/.handoff"}, "probe")


def test_paths_are_absolute_only_after_the_probe(ws: Workstation) -> None:
    from handoff.host.facts import gather

    [target] = ws.targets("a")
    with ws.connect(target) as s:
        with pytest.raises(RuntimeError, match="home unknown"):
            s.abs("~/x")
        gather(s, None)
        assert s.abs("~/x") == f"{ws.home('a')}/x" and s.abs("/etc") == "/etc"
        assert s.layout.job("g") == f"{ws.home('a')}/.handoff/jobs/g"


def test_local_files_act_like_sftp(tmp_path: Path, ws: Workstation) -> None:
    [target] = ws.targets("a")
    s = LocalSession(target, tmp_path / "home")
    files = s.files
    files.mkdir("d", 0o700)
    old = os.umask(0o077)
    try:
        with files.create("d/f", 0o644) as fh:  # the mode asked for, whatever the umask
            fh.write(b"data")
            fh.fsync()
    finally:
        os.umask(old)
    assert stat.S_IMODE(files.stat("d/f").mode) == 0o644 and files.stat("d/f").size == 4
    with pytest.raises(FileExistsError):
        files.create("d/f", 0o600)
    files.symlink("f", "d/l")
    files.rename("d/l", "d/m")
    assert files.listdir("d") == ["f", "m"] and (tmp_path / "home" / "d" / "m").readlink() == Path("f")
    assert b"".join(files.read_chunks(str(tmp_path / "home" / "d" / "f"), 1, 3)) == b"at"
    files.remove("d/f")
    with pytest.raises(FileNotFoundError):
        files.stat("d/f")


def test_local_commands_run_in_the_fake_home(tmp_path: Path, ws: Workstation) -> None:
    [target] = ws.targets("a")
    s = LocalSession(target, tmp_path / "h")
    res = s.exec("echo $HOME; pwd; cat")  # stdin is closed: cat ends at once
    assert res.ok and res.out.split() == [str(tmp_path / "h")] * 2
    assert s.exec("exit 3").rc == 3
    with pytest.raises(RemoteError, match="timed out"):
        s.exec("sleep 5", timeout=0.2)
