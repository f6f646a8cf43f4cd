"""Moving bytes: mkdir -p from what the probe saw, atomic uploads that leave nothing behind
on failure, downloads whole or resumed."""

from __future__ import annotations

from pathlib import Path

import pytest

from handoff.layout import parents
from handoff.testing.local import LocalFiles
from handoff.transfer import download, mkdirs, remove_leftovers, temp_prefix, upload_atomic


class _RecordingFiles:
    """Just enough of RemoteFiles to see which round trips mkdirs makes."""

    def __init__(self, existing: set[str]) -> None:
        self.existing = set(existing)
        self.calls: list[tuple[str, str]] = []

    def stat(self, path: str) -> object:
        self.calls.append(("stat", path))
        if path not in self.existing:
            raise FileNotFoundError(path)
        return object()

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        self.calls.append(("mkdir", path))
        self.existing.add(path)


def test_mkdirs_uses_what_the_probe_saw_and_stats_only_the_rest() -> None:
    folder = "/home/u/.handoff/releases/abc"
    known = {"/home/u": True, "/home/u/.handoff": False, "/home/u/.handoff/releases": False,
             folder: False}
    assert parents("~/.handoff/releases/abc")[0] == "~/.handoff/releases/abc"
    fresh = _RecordingFiles({"/home/u"})
    assert mkdirs(fresh, folder, known=known) is True  # type: ignore[arg-type]
    assert fresh.calls == [("mkdir", "/home/u/.handoff"), ("mkdir", "/home/u/.handoff/releases"),
                           ("mkdir", folder)]  # no stat at all
    unprobed = _RecordingFiles({"/home/u", "/home/u/.handoff"})
    assert mkdirs(unprobed, "/home/u/.handoff/secrets") is True  # type: ignore[arg-type]
    assert unprobed.calls == [("stat", "/home/u/.handoff/secrets"), ("stat", "/home/u/.handoff"),
                              ("mkdir", "/home/u/.handoff/secrets")]
    there = _RecordingFiles({"/home/u", "/home/u/.handoff"})
    assert mkdirs(there, "/home/u/.handoff", known={"/home/u/.handoff": True}) is False  # type: ignore[arg-type]
    assert there.calls == []


def test_upload_is_atomic_and_cleans_up_after_a_failure(tmp_path: Path) -> None:
    files = LocalFiles(tmp_path)
    final = str(tmp_path / "payload.pyz")
    upload_atomic(files, b"x" * 100_000, final)
    assert Path(final).read_bytes() == b"x" * 100_000 and Path(final).stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["payload.pyz"]

    class Broken(LocalFiles):
        def rename(self, src: str, dst: str) -> None:
            raise OSError("connection dropped")

    with pytest.raises(OSError, match="connection dropped"):
        upload_atomic(Broken(tmp_path), b"new", final)
    assert Path(final).read_bytes() == b"x" * 100_000  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["payload.pyz"]  # no temp left

    (tmp_path / f"{temp_prefix('payload.pyz')}dead01").write_text("half")
    assert remove_leftovers(files, str(tmp_path), temp_prefix("payload.pyz")) is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["payload.pyz"]


def test_download_whole_and_resumed(tmp_path: Path) -> None:
    remote = tmp_path / "remote.jsonl"
    remote.write_bytes(b"line1\nline2\n")
    files = LocalFiles(tmp_path)
    local = tmp_path / "out" / "copy.jsonl"
    download(files, str(remote), local, 0, 12, 1_000_000.0)
    assert local.read_bytes() == b"line1\nline2\n" and local.stat().st_mtime == 1_000_000.0
    remote.write_bytes(b"line1\nline2\nline3\n")
    download(files, str(remote), local, 12, 18, 2_000_000.0)
    assert local.read_bytes() == remote.read_bytes()
    assert [op for op, _ in files.calls] == ["read", "read"]
