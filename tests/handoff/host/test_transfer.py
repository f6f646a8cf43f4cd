"""Moving bytes: mkdir -p from what the probe saw, atomic uploads that leave nothing behind
on failure, downloads whole or resumed (in place, or from what a cut download left)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from handoff.config.layout import parents
from handoff.host.transfer import (
    completes,
    download,
    is_partial,
    mkdirs,
    partial,
    remove_leftovers,
    temp_prefix,
    upload_atomic,
)
from handoff.testing.local import LocalFiles
from tests.support.files import CutFiles


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


def test_download_whole_then_in_place(tmp_path: Path) -> None:
    remote = tmp_path / "remote.jsonl"
    remote.write_bytes(b"line1\nline2\n")
    files = LocalFiles(tmp_path)
    local = tmp_path / "out" / "copy.jsonl"
    download(files, str(remote), local, 0, 12, 1_000_000.0)
    assert local.read_bytes() == b"line1\nline2\n" and local.stat().st_mtime == 1_000_000.0
    assert not partial(local).exists()
    remote.write_bytes(b"line1\nline2\nline3\n")
    download(files, str(remote), local, 12, 18, 2_000_000.0, in_place=True)
    assert local.read_bytes() == remote.read_bytes() and local.stat().st_mtime == 2_000_000.0
    assert [op for op, _ in files.calls] == ["read", "read"]


def test_a_cut_download_leaves_a_part_that_resumes_with_only_the_rest(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    remote = tmp_path / "features.bin"
    remote.write_bytes(data)
    local = tmp_path / "out" / "features.bin"
    cut = CutFiles(tmp_path, cut=1_234_567)
    with pytest.raises(OSError, match="connection dropped"):
        download(cut, str(remote), local, 0, len(data), 5.0)
    assert not local.exists()  # never half a file under the final name
    part = partial(local)
    assert part.read_bytes() == data[:1_234_567] and completes(part) == local
    rest = CutFiles(tmp_path)
    download(rest, str(remote), local, part.stat().st_size, len(data), 5.0)
    assert rest.sent == len(data) - 1_234_567  # only the rest moved
    assert local.read_bytes() == data and not part.exists() and local.stat().st_mtime == 5.0


def test_a_part_shorter_than_the_proven_prefix_is_refused(tmp_path: Path) -> None:
    remote = tmp_path / "r.bin"
    remote.write_bytes(b"x" * 100)
    local = tmp_path / "out" / "r.bin"
    local.parent.mkdir()
    partial(local).write_bytes(b"x" * 10)
    with pytest.raises(OSError, match="fewer than the 50 bytes"):
        download(LocalFiles(tmp_path), str(remote), local, 50, 100, 0.0)
    assert partial(local).read_bytes() == b"x" * 10 and not local.exists()


def test_only_partial_names_complete_a_file(tmp_path: Path) -> None:
    assert completes(tmp_path / ".output.jsonl.tmp-part") == tmp_path / "output.jsonl"
    assert completes(tmp_path / ".output.jsonl.tmp-123-456") is None  # payload.atomic's
    assert completes(tmp_path / "output.jsonl") is None
    assert is_partial(partial(tmp_path / "x").name)


def test_a_cut_upload_leaves_a_part_that_resumes_with_only_the_rest(tmp_path: Path) -> None:
    """An interrupted `launch --input huge.jsonl` left `.huge.jsonl.tmp-…` and the next upload
    restarted from zero (issue 22 #9): uploads resume as fetch does, by size + prefix sha256."""
    import hashlib

    from handoff.host.session import RemoteWriter
    from handoff.host.transfer import upload_resumable

    data = os.urandom(3 << 20)
    local = tmp_path / "huge.jsonl"
    local.write_bytes(data)
    host = tmp_path / "host"
    host.mkdir()
    final = str(host / "huge.jsonl")
    (host / f"{temp_prefix('huge.jsonl')}dead01").write_text("an older random temp")

    def sha(path: str, n: int) -> str:
        return hashlib.sha256(Path(path).read_bytes()[:n]).hexdigest()

    class Cut(LocalFiles):
        """The link drops after `cut` bytes written."""

        def __init__(self, home: Path, cut: int | None = None) -> None:
            super().__init__(home)
            self.cut, self.written = cut, 0

        def _wrap(self, fh: RemoteWriter) -> RemoteWriter:
            outer = self

            class W(RemoteWriter):
                def write(self, chunk) -> None:  # type: ignore[no-untyped-def]
                    if outer.cut is not None and outer.written + len(chunk) > outer.cut:
                        fh.write(chunk[:outer.cut - outer.written])
                        outer.written = outer.cut
                        raise OSError("connection dropped")
                    outer.written += len(chunk)
                    fh.write(chunk)

                def fsync(self) -> None:
                    fh.fsync()

                def close(self) -> None:
                    fh.close()

            return W()

        def create(self, path: str, mode: int, *, pipelined: bool = False) -> RemoteWriter:
            return self._wrap(super().create(path, mode, pipelined=pipelined))

        def append(self, path: str, *, pipelined: bool = False) -> RemoteWriter:
            return self._wrap(super().append(path, pipelined=pipelined))

    with pytest.raises(OSError, match="connection dropped"):
        upload_resumable(Cut(host, cut=1_500_000), local, final, remote_sha256=sha)
    part = host / ".huge.jsonl.tmp-part"
    assert not Path(final).exists() and part.stat().st_size == 1_500_000
    assert not (host / f"{temp_prefix('huge.jsonl')}dead01").exists()  # leftovers removed
    rest = Cut(host)
    assert upload_resumable(rest, local, final, remote_sha256=sha) == 1_500_000
    assert rest.written == len(data) - 1_500_000  # only the rest moved
    assert Path(final).read_bytes() == data and not part.exists()
    assert Path(final).stat().st_mode & 0o777 == 0o644

    # A part that is not a prefix of this file (another file, same name) starts over.
    part.write_bytes(b"something else entirely")
    again = Cut(host)
    assert upload_resumable(again, local, final, remote_sha256=sha) == 0
    assert again.written == len(data) and Path(final).read_bytes() == data
