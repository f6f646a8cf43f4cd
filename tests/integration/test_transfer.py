"""Moving bytes over real sshd: a fetch cut mid-file resumes moving only the rest (counted
by the SFTP server itself), with progress lines; the bulk SFTP reader and writer against
OpenSSH's sftp-server (short answers, early stops, a file that ends early); AES-GCM is
what the connection negotiates, TCP_NODELAY is set, and the host key is checked as
strictly as before."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from handoff.ssh import connect
from tests.integration.conftest import explain, remote_dir, wait_until

MB = 1_000_000


def make_output(c: Any, size: int) -> bytes:
    """A job folder on the container holding an `output.jsonl` of `size` bytes."""
    job = remote_dir(c) / "jobs" / "generator"
    job.mkdir(parents=True)
    line = b'{"id": "%08d", "text": "' + b"x" * 100 + b'"}\n'
    data = b"".join(line % i for i in range(size // len(line % 0) + 1))[:size]
    (job / "output.jsonl").write_bytes(data)
    subprocess.run(["chown", "-R", c.user, str(remote_dir(c))], check=True)
    return data


def bytes_read(log: str, name: str) -> list[int]:
    """What the SFTP server says it read of each file named `name`, per open/close."""
    return [int(n) for n in re.findall(rf'close "[^"]*/{re.escape(name)}" bytes read (\d+)', log)]


@pytest.mark.serial  # 160 MB over SFTP within fab's 120 s: run alone (scripts/test's serial pass)
def test_a_cut_fetch_resumes_moving_only_the_rest(make_sandbox, fab, tmp_path: Path) -> None:
    sbx = make_sandbox(hosts=1, api=False, keyring="file", sftp_log=True)
    c = sbx.containers[0]
    data = make_output(c, 160 * MB)
    dest = tmp_path / "results"
    local = dest / c.name / "generator" / "output.jsonl"
    part = local.with_name(".output.jsonl.tmp-part")

    proc = fab.popen(sbx, "fetch", "--dest", str(dest))
    try:
        seen = wait_until(lambda: part.exists() and part.stat().st_size > 16 * MB, 60, 0.002)
        sbx.drop_connections(c.name)  # the link drops mid-file
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert seen, f"never saw the download in progress:\n{out}\n{err}"
    assert proc.returncode == 1 and "run fetch again to resume" in out, f"{out}\n{err}"
    have = part.stat().st_size
    assert 16 * MB < have < len(data) and not local.exists()  # never half a file as final
    assert part.read_bytes() == data[:have]

    r = fab.on(sbx, "fetch", "--dest", str(dest))
    assert r.rc == 0 and "1 file(s) fetched (1 resumed" in r.out, explain(r)
    # Whole lines only: the last line, cut (a job writing it), waits for a later fetch.
    assert local.read_bytes() == whole_lines(data) and not part.exists()
    # The server read only the rest for the resumed fetch (its last open of the file).
    assert bytes_read(sbx.sftp_log(c.name), "output.jsonl")[-1] == len(data) - have
    # Progress, as plain lines (not a terminal): the start, and the end with size and rate.
    rest = f"{(len(data) - have) / MB:.1f} MB"
    assert f"{c.name} ↓ generator/output.jsonl: fetching {rest}" in r.out, explain(r)
    assert re.search(rf"{c.name} ↓ generator/output.jsonl: {re.escape(rest)} in \d+\.\d s \(.+B/s\)", r.out)

    r = fab.on(sbx, "fetch", "--dest", str(dest))
    assert r.rc == 0 and "0 file(s) fetched" in r.out, explain(r)  # complete: nothing moves


@pytest.fixture
def session(make_sandbox) -> Any:
    """An SSHSession to a fresh one-host sandbox, as `fab` would open it."""
    from handoff.cli import commands
    from handoff.host.ssh_session import SSHSession

    sbx = make_sandbox(hosts=1, api=False, keyring="file")
    saved = dict(os.environ)
    os.environ.update(sbx.env())
    try:
        [target] = commands.targets_for(sbx.containers[0].name, None)
        with SSHSession(target) as s:
            yield sbx, s
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_bulk_sftp_against_openssh(session: Any) -> None:
    from handoff.ssh import sftp as sftpio

    sbx, s = session
    c = sbx.containers[0]
    data = os.urandom(3 * sftpio.REQUEST + 12345)
    path = str(c.home / "blob.bin")
    with s.files.create(path, 0o640, pipelined=True) as fh:
        fh.write(data[:1000])  # a small write, then one spanning many requests
        fh.write(memoryview(data)[1000:])
    assert (c.home / "blob.bin").read_bytes() == data
    assert (c.home / "blob.bin").stat().st_mode & 0o777 == 0o640

    sftp = s.files.sftp
    with sftp.open(path, "rb") as f:
        # Asking more than the server serves per answer: its short answers are asked again.
        got = b"".join(bytes(v) for v in sftpio.read(sftp, f.handle, 7, len(data), "t",
                                                     request=600_000, depth=3))
        assert got == data[7:]
        # A reader that stops early leaves the client in step: its next request works.
        stream = sftpio.read(sftp, f.handle, 0, len(data), "t")
        next(stream)
        stream.close()
        assert s.files.stat(path).size == len(data)
        with pytest.raises(OSError, match="ended early"):  # the file is shorter than asked
            for _ in sftpio.read(sftp, f.handle, 0, len(data) + 10, "t"):
                pass
    assert s.files.stat(path).size == len(data)
    # The bulk cipher: AES-GCM, as handoff.ssh.connect prefers, on both directions; and no Nagle
    # delay on the socket (every round trip would wait for a delayed ACK), nor a delayed ACK
    # of ours holding sshd's answers under its own Nagle (connect.QuickAcks, Linux).
    assert s.transport.remote_cipher == s.transport.local_cipher == "aes128-gcm@openssh.com"
    assert s.link.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert isinstance(s.link.sock, connect.QuickAcks) == hasattr(socket, "TCP_QUICKACK")


def test_fetch_refuses_a_changed_host_key_as_before(make_sandbox, fab, tmp_path: Path) -> None:
    """Bulk bytes ride the one checked connection: a changed key stops fetch before any byte."""
    sbx = make_sandbox(hosts=1, api=False, keyring="file", sftp_log=True)
    c = sbx.containers[0]
    make_output(c, 5 * MB)
    sbx.rotate_host_key(c.name)
    r = fab.on(sbx, "fetch", "--dest", str(tmp_path / "d"))
    assert r.rc != 0 and "host key" in r.text.lower(), explain(r)
    assert not (tmp_path / "d" / c.name / "generator").exists()
    assert "open " not in sbx.sftp_log(c.name)  # the server never served a file


def test_a_cut_upload_resumes_over_openssh(session: Any, tmp_path: Path) -> None:
    """A resumed upload over real sftp-server (issue 22 #9): the part file is continued from
    its end (explicit offsets after its size), its prefix proven by sha256 on the host."""
    from handoff.host.transfer import upload_resumable
    from handoff.ops.jobs.upload import _prefix_sha256

    sbx, s = session
    c = sbx.containers[0]
    data = os.urandom(5 << 20)
    local = tmp_path / "huge.jsonl"
    local.write_bytes(data)
    with s.files.create(str(c.home / ".huge.jsonl.tmp-part"), 0o644) as fh:
        fh.write(data[:2_000_000])  # what a cut upload left, as the login user
    final = str(c.home / "huge.jsonl")
    resumed = upload_resumable(s.files, local, final,
                               remote_sha256=lambda path, n: _prefix_sha256(s, path, n))
    assert resumed == 2_000_000
    assert (c.home / "huge.jsonl").read_bytes() == data
    assert not (c.home / ".huge.jsonl.tmp-part").exists()


# -- resume: only the rest moves, and a prefix that is not the host's never survives ---------------

HALF = 12 * MB


def plant_part(dest: Path, c: Any, data: bytes, n: int, alter_at: int | None = None) -> Path:
    """What a cut fetch leaves of the job's output.jsonl: its first `n` bytes in the part
    file, one byte changed at `alter_at` (a copy altered since, or a host file rewritten)."""
    part = dest / c.name / "generator" / ".output.jsonl.tmp-part"
    part.parent.mkdir(parents=True)
    prefix = bytearray(data[:n])
    if alter_at is not None:
        at = prefix.index(b"x", alter_at)  # inside a line's text: the ids stay the same
        prefix[at] = ord("y")
    part.write_bytes(prefix)
    return part


def whole_lines(data: bytes) -> bytes:
    """What a merge keeps of a file whose last line may be cut."""
    return data[:data.rindex(b"\n") + 1]


def test_a_resumed_fetch_moves_only_the_rest_and_merges_it(make_sandbox, fab, tmp_path: Path) -> None:
    """The SFTP server reads only the missing half; the merged file is the host's file."""
    sbx = make_sandbox(hosts=1, api=False, keyring="file", sftp_log=True)
    c = sbx.containers[0]
    data = make_output(c, 2 * HALF + 12345)
    dest = tmp_path / "results"
    part = plant_part(dest, c, data, HALF)

    r = fab.on(sbx, "fetch", "--dest", str(dest))
    assert r.rc == 0 and "1 file(s) fetched (1 resumed" in r.out, explain(r)
    assert "not resumed" not in r.out, explain(r)
    assert bytes_read(sbx.sftp_log(c.name), "output.jsonl") == [len(data) - HALF]  # nothing else
    local = dest / c.name / "generator" / "output.jsonl"
    assert local.read_bytes() == whole_lines(data) and not part.exists()
    merged = dest / "generator" / "output.jsonl"
    assert merged.read_bytes() == whole_lines(data)  # the last line is cut: left out
    lines = data.count(b"\n")
    assert f"{lines} answers + 0 failures = {lines} ids, each once" in " ".join(r.out.split()), explain(r)


def test_a_prefix_that_differs_at_its_end_is_fetched_whole(make_sandbox, fab, tmp_path: Path) -> None:
    """The probe (first and last MiB) sees it before a byte moves: the file comes whole, said."""
    sbx = make_sandbox(hosts=1, api=False, keyring="file", sftp_log=True)
    c = sbx.containers[0]
    data = make_output(c, 2 * HALF)
    dest = tmp_path / "results"
    plant_part(dest, c, data, HALF, alter_at=HALF - 1000)

    r = fab.on(sbx, "fetch", "--dest", str(dest))
    text = " ".join(r.out.split())
    assert r.rc == 0 and "not resumed" in text and "probe sha256" in text, explain(r)
    assert bytes_read(sbx.sftp_log(c.name), "output.jsonl") == [len(data)]
    assert (dest / c.name / "generator" / "output.jsonl").read_bytes() == whole_lines(data)
    assert (dest / "generator" / "output.jsonl").read_bytes() == whole_lines(data)


def test_a_prefix_that_differs_in_its_middle_is_caught_before_the_rename(
        make_sandbox, fab, tmp_path: Path) -> None:
    """The probe cannot see a byte 6 MB in; the whole-prefix sha256, computed on both sides
    while the rest moves, does: the resumed file is never renamed into place, it comes
    whole, and the merge holds the host's bytes (the index of the bad prefix is dropped)."""
    sbx = make_sandbox(hosts=1, api=False, keyring="file", sftp_log=True)
    c = sbx.containers[0]
    data = make_output(c, 2 * HALF)
    dest = tmp_path / "results"
    plant_part(dest, c, data, HALF, alter_at=HALF // 2)

    r = fab.on(sbx, "fetch", "--dest", str(dest))
    text = " ".join(r.out.split())
    assert r.rc == 0 and "not resumed" in text and "whole-prefix sha256" in text, explain(r)
    assert bytes_read(sbx.sftp_log(c.name), "output.jsonl") == [len(data) - HALF, len(data)]
    assert (dest / c.name / "generator" / "output.jsonl").read_bytes() == whole_lines(data)
    assert (dest / "generator" / "output.jsonl").read_bytes() == whole_lines(data)


def test_an_upload_cut_midway_resumes_moving_only_the_rest(session: Any, tmp_path: Path) -> None:
    """`fab launch --input`'s upload, cut by a dropped link, then run again: the part is
    continued (the server wrote only the rest) and the file is byte-identical."""
    from handoff.cli import commands
    from handoff.errors import HandoffError
    from handoff.host.ssh_session import SSHSession
    from handoff.host.transfer import upload_resumable
    from handoff.ops.jobs.upload import _prefix_sha256, _probe_sha256
    from handoff.threads import soon

    sbx, s = session
    c = sbx.containers[0]
    data = os.urandom(160 * MB)
    local = tmp_path / "big.jsonl"
    local.write_bytes(data)
    final, part = c.home / "big.jsonl", c.home / ".big.jsonl.tmp-part"

    def upload(s: Any, notes: list[str]) -> int:
        return upload_resumable(s.files, local, str(final), notes=notes,
                                remote_sha256=lambda path, n: _prefix_sha256(s, path, n),
                                remote_probe=lambda path, n: _probe_sha256(s, path, n))

    cut = soon(lambda: upload(s, []), "upload")
    seen = wait_until(lambda: part.exists() and part.stat().st_size > 16 * MB, 60, 0.002)
    sbx.drop_connections(c.name)
    with pytest.raises((OSError, HandoffError)):  # the link dropped (the session says so)
        cut.result(timeout=60)
    assert seen and not final.exists()
    have = part.stat().st_size
    assert 16 * MB < have < len(data) and part.read_bytes() == data[:have]

    [target] = commands.targets_for(c.name, None)
    notes: list[str] = []
    with SSHSession(target) as again:
        assert upload(again, notes) == have and notes == []
    assert final.read_bytes() == data and not part.exists()


def test_an_upload_part_that_is_not_the_files_prefix_is_uploaded_whole(
        session: Any, tmp_path: Path) -> None:
    """A part whose end differs fails the probe (nothing resumed); one whose middle differs
    passes it and fails the whole-prefix sha256 after the rest moved: both start over,
    say so, and the file on the host is byte-identical."""
    from handoff.host.transfer import upload_resumable
    from handoff.ops.jobs.upload import _prefix_sha256, _probe_sha256

    sbx, s = session
    c = sbx.containers[0]
    data = os.urandom(8 * MB)
    local = tmp_path / "in.jsonl"
    local.write_bytes(data)
    final, part = c.home / "in.jsonl", c.home / ".in.jsonl.tmp-part"
    for at, said in ((4 * MB - 10, "probe sha256"), (2 * MB, "whole sha256")):
        bad = bytearray(data[:4 * MB])
        bad[at] ^= 0xFF
        with s.files.create(str(part), 0o644) as fh:
            fh.write(bytes(bad))
        notes: list[str] = []
        resumed = upload_resumable(s.files, local, str(final), notes=notes,
                                   remote_sha256=lambda path, n: _prefix_sha256(s, path, n),
                                   remote_probe=lambda path, n: _probe_sha256(s, path, n))
        assert resumed == 0 and len(notes) == 1 and said in notes[0], notes
        assert final.read_bytes() == data and not part.exists()


def test_a_grown_host_file_moves_only_its_new_bytes_and_merges_only_its_new_lines(
        make_sandbox, fab, tmp_path: Path) -> None:
    """Fetching a running job again (issue 32 #10): the SFTP server reads only what the file
    grew by (from the copy's last whole line on), no prefix is hashed whole (the copy is the
    one this workstation wrote from that host file), the host's copy grows in place and the
    merged file, its link, with it; a fetch with nothing new moves nothing."""
    sbx = make_sandbox(hosts=1, api=False, keyring="file", sftp_log=True)
    c = sbx.containers[0]
    data = make_output(c, 2 * HALF + 12345)
    host_file = remote_dir(c) / "jobs" / "generator" / "output.jsonl"
    os.truncate(host_file, HALF)  # the job had written half, its last line cut
    dest = tmp_path / "results"
    local, merged = dest / c.name / "generator" / "output.jsonl", dest / "generator" / "output.jsonl"
    r = fab.on(sbx, "fetch", "--dest", str(dest))
    assert r.rc == 0 and local.read_bytes() == whole_lines(data[:HALF]), explain(r)
    inode, have = local.stat().st_ino, local.stat().st_size

    with host_file.open("ab") as fh:  # the job goes on, appending to the same file
        fh.write(data[HALF:])
    r = fab.on(sbx, "fetch", "--dest", str(dest))
    assert r.rc == 0 and "1 file(s) fetched (1 resumed" in r.out, explain(r)
    reads = bytes_read(sbx.sftp_log(c.name), "output.jsonl")
    assert reads[-1] == len(data) - have, reads  # the new bytes only
    assert local.stat().st_ino == inode and local.read_bytes() == whole_lines(data)
    assert os.path.samefile(local, merged)  # the merged file grew with it: no copy
    assert "not resumed" not in r.out, explain(r)

    r = fab.on(sbx, "fetch", "--dest", str(dest))
    assert r.rc == 0 and "0 file(s) fetched" in r.out, explain(r)  # the last line is still cut
