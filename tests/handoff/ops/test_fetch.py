"""`fab fetch` on fake hosts: whole files, complete files skipped, append-only files resumed
from a verified prefix, a changed prefix fetched whole; the fetch policy itself."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from handoff.cli import commands
from handoff.ops import fetch
from handoff.ops.fetch import fetch_job
from handoff.ops.local_copies import append_only
from tests.support.workstation import Workstation


def test_fetch_resumes_only_append_only_files() -> None:
    assert append_only("output.jsonl") and append_only("output.errors.jsonl")
    assert append_only("log") and append_only("features/manifest.jsonl")
    assert not append_only("status.json") and not append_only("features/x.safetensors")


def make_job(ws: Workstation, label: str, job: str = "generator") -> Path:
    jd = ws.remote_dir(label) / "jobs" / job
    (jd / "features").mkdir(parents=True)
    (jd / "output.jsonl").write_bytes(b'{"id": 1}\n{"id": 2}\n')
    (jd / "status.json").write_text('{"state": "running"}')
    (jd / "features" / "a.bin").write_bytes(os.urandom(3000))
    (jd / "pid").write_text("123\n")  # never fetched
    (jd / ".status.json.tmp-1-2").write_text("half")  # a temp file being written: never fetched
    return jd


def test_fetch_whole_then_skip_then_resume(ws: Workstation, tmp_path: Path,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    jd = make_job(ws, "a")
    dest = tmp_path / "results"
    assert commands.fetch("a", None, dest=str(dest)) == 0
    local = dest / "a" / "generator"
    got = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert got == ["features/a.bin", "output.jsonl", "status.json"]
    for rel in got:
        assert (local / rel).read_bytes() == (jd / rel).read_bytes()
    assert "3 file(s) fetched (0 resumed" in capfd.readouterr().out

    assert commands.fetch("a", None, dest=str(dest)) == 0  # all complete: nothing moves
    assert "0 file(s) fetched" in capfd.readouterr().out

    with (jd / "output.jsonl").open("ab") as fh:  # the job went on: only the rest moves
        fh.write(b'{"id": 3}\n')
    [target] = ws.targets("a")
    with ws.connect(target) as session:
        done = fetch_job(session, "generator", local)
        reads = [path for op, path in session.files.calls if op == "read"]  # type: ignore[attr-defined]
    assert (done.fetched, done.resumed, done.skipped) == (1, 1, 2)
    assert done.nbytes == len(b'{"id": 3}\n') and reads == [f"{jd}/output.jsonl"]
    assert (local / "output.jsonl").read_bytes() == (jd / "output.jsonl").read_bytes()


def test_a_local_copy_that_is_not_a_prefix_is_fetched_whole(ws: Workstation, tmp_path: Path) -> None:
    jd = make_job(ws, "a")
    local = tmp_path / "r" / "a" / "generator"
    local.mkdir(parents=True)
    (local / "output.jsonl").write_bytes(b'{"id": 9}\n')  # same length prefix, other bytes
    [target] = ws.targets("a")
    with ws.connect(target) as session:
        done = fetch_job(session, "generator", local)
    assert done.resumed == 0 and (local / "output.jsonl").read_bytes() == (jd / "output.jsonl").read_bytes()
    assert not [p for p in local.rglob("*") if ".tmp-" in p.name]  # no temp file left behind


def test_a_download_leaves_the_index_of_its_lines_for_the_merge(ws: Workstation, tmp_path: Path) -> None:
    """The lines are indexed as they land, and the index is kept once the download is renamed
    into place, whole or resumed: the merge then reads no line of the file again."""
    from handoff.ops import merge_index

    jd = make_job(ws, "a")
    local = tmp_path / "r" / "a" / "generator"
    [target] = ws.targets("a")
    for grown in (b"", b'{"id": 3}\n{"id": 4}\n'):  # whole, then resumed (only the rest moves)
        with (jd / "output.jsonl").open("ab") as fh:
            fh.write(grown)
        with ws.connect(target) as session:
            done = fetch_job(session, "generator", local)
        assert done.resumed == (1 if grown else 0)
        idx = merge_index.load(local / "output.jsonl")
        size = (jd / "output.jsonl").stat().st_size
        assert idx is not None and idx.length == size and len(idx.starts) == (4 if grown else 2)


def test_a_prefix_written_here_and_untouched_needs_no_whole_prefix_hash(
        ws: Workstation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cut download's part, resumed untouched from the same host file, resumes on its probe
    alone: neither side hashes the whole prefix. Changed since in its middle (where the probe
    does not look), or the host file replaced by another with the same ends, the whole
    prefix is proven again and the difference caught: the file comes whole, said."""
    import time

    from handoff.errors import RemoteError
    from handoff.host.transfer import partial
    from handoff.ops import fetch as fetching
    from handoff.ops import merge_index
    from tests.support.files import CutFiles

    proofs: list[list[str]] = []

    class Recorded(fetching.Proof):
        def __init__(self, s: Any, resumed: dict[str, tuple[str, Path, int]]) -> None:
            proofs.append(sorted(resumed))
            super().__init__(s, resumed)

    monkeypatch.setattr(fetching, "Proof", Recorded)
    jd = ws.remote_dir("a") / "jobs" / "generator"
    jd.mkdir(parents=True)
    data = b"".join(b'{"id":"p%d","response":"%s"}\n' % (i, b"x" * 990) for i in range(5000))
    (jd / "output.jsonl").write_bytes(data)
    local = tmp_path / "r" / "a" / "generator"
    final, part = local / "output.jsonl", partial(local / "output.jsonl")
    [target] = ws.targets("a")
    cut = 3_500_000  # past the probe's 2 MiB: the middle is only seen by a whole-prefix hash

    def cut_fetch() -> None:
        final.unlink(missing_ok=True)
        merge_index.drop(final)
        with ws.connect(target) as session:
            session._files = CutFiles(ws.home("a"), cut=cut)  # type: ignore[attr-defined]
            with pytest.raises(RemoteError, match="run fetch again to resume"):
                fetch_job(session, "generator", local)
        # Whole lines only: the line the cut fell in is left for the resume.
        assert part.stat().st_size == data.rfind(b"\n", 0, cut) + 1

    def fetch() -> Any:
        with ws.connect(target) as session:
            return fetch_job(session, "generator", local)

    cut_fetch()
    done = fetch()
    assert (done.resumed, done.restarted, proofs) == (1, [], [])  # the probe alone
    assert final.read_bytes() == data and not part.exists()

    cut_fetch()
    time.sleep(0.02)  # the change lands on a later clock tick than the cut's last write
    changed = bytearray(part.read_bytes())
    changed[changed.index(b"x", cut // 2)] = ord("y")
    part.write_bytes(changed)  # same size, same inode: only the mtime says it changed
    done = fetch()
    assert proofs == [["output.jsonl"]] and done.resumed == 0
    assert "whole-prefix sha256" in done.restarted[0] and final.read_bytes() == data

    cut_fetch()
    other = bytearray(data)
    other[other.index(b"x", cut // 2)] = ord("z")
    (jd / ".new").write_bytes(other)
    os.replace(jd / ".new", jd / "output.jsonl")  # another host file, with the same ends
    done = fetch()
    assert proofs[-1] == ["output.jsonl"] and done.resumed == 0
    assert "whole-prefix sha256" in done.restarted[0] and final.read_bytes() == other


def test_fetch_of_a_job_never_launched_fails_the_host(ws: Workstation, tmp_path: Path,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    assert commands.fetch("a", None, dest=str(tmp_path / "r")) == 1
    assert "no job under" in capfd.readouterr().out and not (tmp_path / "r" / "a").exists()
    assert commands.fetch("a", None, job="B3", dest=str(tmp_path / "r")) == 1
    assert "no job 'B3'" in capfd.readouterr().out and not (tmp_path / "r" / "a").exists()


def test_a_cut_fetch_resumes_from_what_it_got(ws: Workstation, tmp_path: Path) -> None:
    """Cut mid-file, the next fetch asks the host to prove the part is a prefix, then moves
    only the rest; a part that is no longer a prefix (the file was rewritten) is refetched."""
    from handoff.errors import RemoteError
    from handoff.host.transfer import partial
    from tests.support.files import CutFiles

    jd = make_job(ws, "a")
    big = os.urandom(2_500_000)
    (jd / "features" / "a.bin").write_bytes(big)  # not append-only: resumes from its part too
    local = tmp_path / "r" / "a" / "generator"
    others = len((jd / "output.jsonl").read_bytes()) + len((jd / "status.json").read_bytes())
    [target] = ws.targets("a")
    with ws.connect(target) as session:  # (the small files come first, then a.bin is cut)
        session._files = CutFiles(ws.home("a"), cut=others + 1_000_000)  # type: ignore[attr-defined]
        with pytest.raises(RemoteError, match=r"fetching generator/features/a\.bin failed.*run fetch again to resume"):
            fetch_job(session, "generator", local)
    part = partial(local / "features" / "a.bin")
    assert part.stat().st_size == 1_000_000 and not (local / "features" / "a.bin").exists()

    with ws.connect(target) as session:
        session._files = rest = CutFiles(ws.home("a"))  # type: ignore[attr-defined]
        done = fetch_job(session, "generator", local)
    assert (done.resumed, done.fetched, done.skipped) == (1, 1, 2)  # the small ones are complete
    assert rest.sent == len(big) - 1_000_000 and done.nbytes == rest.sent  # only the rest moved
    assert (local / "features" / "a.bin").read_bytes() == big and not part.exists()

    part.write_bytes(b"not the host's bytes")  # a part the host cannot prove: fetched whole
    (local / "features" / "a.bin").unlink()
    with ws.connect(target) as session:
        done = fetch_job(session, "generator", local)
    assert done.resumed == 0 and (local / "features" / "a.bin").read_bytes() == big


def test_a_grown_file_moves_only_its_new_whole_lines_into_the_linked_merge(
        ws: Workstation, tmp_path: Path) -> None:
    """One host's copy kept whole is linked as the merged dataset, not copied. A fetch of the
    grown host file appends only the new bytes to that copy in place (no private copy of the
    prefix: issue 32 #10), only whole lines (the line the job is writing waits for the next
    fetch), and the merge after it checks them: a repeated id makes the merge write its own
    file without it, the host's copy keeping what the host has."""
    jd = make_job(ws, "a")
    dest = tmp_path / "results"
    assert commands.fetch("a", None, dest=str(dest)) == 0
    local, merged = dest / "a" / "generator" / "output.jsonl", dest / "generator" / "output.jsonl"
    assert merged.read_bytes() == (jd / "output.jsonl").read_bytes()
    assert os.path.samefile(local, merged)  # linked: 1 GB costs no second copy
    inode = local.stat().st_ino

    with (jd / "output.jsonl").open("ab") as fh:
        fh.write(b'{"id": 3}\n{"id": 4, "respo')  # the job is writing id 4
    assert commands.fetch("a", None, dest=str(dest)) == 0
    assert local.stat().st_ino == inode and os.path.samefile(local, merged)  # grown in place
    assert merged.read_bytes() == b'{"id": 1}\n{"id": 2}\n{"id": 3}\n'  # whole lines only

    with (jd / "output.jsonl").open("ab") as fh:
        fh.write(b'nse": "x"}\n{"id": 2}\n{"id": 5}\n')  # id 4 ends; id 2 again (a bad host)
    assert commands.fetch("a", None, dest=str(dest)) == 0
    assert local.read_bytes() == (jd / "output.jsonl").read_bytes() and local.stat().st_ino == inode
    assert [json.loads(line)["id"] for line in merged.read_text().splitlines()] == [1, 2, 3, 4, 5]
    assert not os.path.samefile(local, merged)  # the merge wrote its own file, without it


def test_a_grown_multi_host_merge_appends_only_the_new_lines(
        ws: Workstation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hosts' shards merged once; then one host's output grows: the merge appends its new
    lines to the merged file (same file, its first bytes untouched) and scans no line it
    merged before; a merged file changed by hand since is merged again whole."""
    from handoff.ops import merge as merging

    for label, first in (("a", 1), ("b", 100)):
        jd = make_job(ws, label)
        (jd / "output.jsonl").write_bytes(b"".join(b'{"id": %d}\n' % i for i in range(first, first + 3)))
        (jd / "job.json").write_text(json.dumps({"shard": f"{'ab'.index(label)}/2"}))
    dest = tmp_path / "results"
    assert commands.fetch("a,b", None, dest=str(dest)) == 0
    merged = dest / "generator" / "output.jsonl"
    before, inode = merged.read_bytes(), merged.stat().st_ino
    assert before.count(b"\n") == 6

    scanned: list[int] = []
    real_scan = merging._scan

    def counting(path: Path, seen: Any, m: Any, skip: Any = None, idx: Any = None, first: int = 0,
                 **kw: Any) -> Any:
        got = real_scan(path, seen, m, skip, idx, first, **kw)
        if path.name == "output.jsonl":
            scanned.append(len((idx or merging.merge_index.current(path)).starts) - first)
        return got

    monkeypatch.setattr(merging, "_scan", counting)
    with (ws.remote_dir("a") / "jobs" / "generator" / "output.jsonl").open("ab") as fh:
        fh.write(b'{"id": 4}\n{"id": 101}\n')  # a new id, and one b already has
    assert commands.fetch("a,b", None, dest=str(dest)) == 0
    after = merged.read_bytes()
    assert merged.stat().st_ino == inode and after.startswith(before)  # appended in place
    assert after[len(before):] == b'{"id": 4}\n' and scanned == [2, 0]  # only the new lines read
    manifest = json.loads((dest / "generator" / "merge.json").read_text())
    assert (manifest["answers"], manifest["duplicates"]) == (7, 1)

    merged.write_bytes(after.replace(b'{"id": 4}\n', b""))  # edited by hand: merged whole again
    with (ws.remote_dir("b") / "jobs" / "generator" / "output.jsonl").open("ab") as fh:
        fh.write(b'{"id": 103}\n')
    scanned.clear()
    assert commands.fetch("a,b", None, dest=str(dest)) == 0
    assert scanned == [5, 4] and merged.read_bytes().count(b"\n") == 8


def test_fetch_from_a_subfolder_writes_its_default_dest_in_the_project_folder(
        ws: Workstation, monkeypatch: pytest.MonkeyPatch) -> None:
    """From a subfolder `fab fetch` wrote ./results there (not git-ignored) while the
    inventory and the state dir resolve from the project folder (issue 32 #11)."""
    from handoff.config import paths

    make_job(ws, "a")
    below = paths.project_dir() / "notebooks" / "week1"
    below.mkdir(parents=True)
    monkeypatch.chdir(below)
    assert commands.fetch("a", None) == 0
    assert (paths.project_dir() / "results" / "a" / "generator" / "output.jsonl").is_file()
    assert not (below / "results").exists()


def test_one_room_for_every_file_of_a_fetch(tmp_path: Path) -> None:
    """Issue 31, finding 8: the free space less the margin is shared by every file (of every
    host): files that each fit the free space at their turn never fill it between them."""
    room = fetch.Room(tmp_path)
    assert room.keep >= 1 << 30 and room.left == max(0, room.free - room.keep)
    small = fetch.Room(tmp_path, keep=max(0, room.free - 1000))
    half = small.left // 2 + 1
    assert small.take(half) and not small.take(half) and small.take(small.left)
    assert small.left == 0 and not small.take(1)
    assert "keeps" in small.refusal(10) and "free" in small.refusal(10)


def test_a_file_no_job_could_have_written_is_implausible(tmp_path: Path) -> None:
    entry = fetch.Entry("big.bin", 1 << 40, 0.0, tmp_path / "big.bin")
    assert fetch.implausible(entry) is None  # the listing said nothing of its blocks
    assert "sparse" in str(fetch.implausible(fetch.Entry("x", 1 << 30, 0.0, tmp_path, allocated=4096)))
    assert "filesystem" in str(fetch.implausible(fetch.Entry("x", 1 << 40, 0.0, tmp_path,
                                                           allocated=1 << 40, fs_bytes=1 << 39)))
    assert fetch.implausible(fetch.Entry("x", 1 << 30, 0.0, tmp_path, allocated=(1 << 30) // 4)) is None
    assert fetch.implausible(fetch.Entry("x", 1 << 19, 0.0, tmp_path, allocated=0)) is None  # small


def test_the_stall_floor_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fetch.MIN_RATE_ENV, raising=False)
    assert fetch.stall_floor() == (fetch.MIN_RATE, fetch.STALL_S)
    monkeypatch.setenv(fetch.MIN_RATE_ENV, "20000/3")
    assert fetch.stall_floor() == (20000.0, 3.0)
    monkeypatch.setenv(fetch.MIN_RATE_ENV, "fast")
    assert fetch.stall_floor() == (fetch.MIN_RATE, fetch.STALL_S)
