"""Merging a job's fetched shards (handoff.ops.merge): every id exactly once, answers winning over
failures, lines still being written left out, the count checked against the shards' totals
once all are finished, partial merges named as such, and a rerun with nothing new a no-op."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from handoff.config import shards
from handoff.config.shards import ShardLayout
from handoff.ops.merge import ERRORS, OUTPUT, ShardCopy, merge
from payload.records import shard_of


def shard(root: Path, host: str, spec: str | None, state: str, total: int, answers: list[object],
          failures: list[object] = (), tail: bytes = b"") -> ShardCopy:  # type: ignore[assignment]
    folder = root / host / "B3"
    folder.mkdir(parents=True)
    with (folder / OUTPUT).open("wb") as fh:
        for i in answers:
            fh.write(json.dumps({"id": i, "usage": {"cost": 0.001}, "response": f"answer {i}"}).encode() + b"\n")
        fh.write(tail)
    with (folder / ERRORS).open("w") as fh:
        for i in failures:
            fh.write(json.dumps({"id": i, "error": {"status": 400}, "attempts": 1}) + "\n")
    (folder / "status.json").write_text(json.dumps({"state": state, "total": total}))
    (folder / "job.json").write_text(json.dumps({"job": "B3", "shard": spec}))
    return ShardCopy(host, folder)


def ids(path: Path) -> list[str]:
    return [str(json.loads(line)["id"]) for line in path.read_text().splitlines()]


def layout(*launches: tuple[tuple[str, ...], bool], prompts: int | None = None) -> ShardLayout:
    """A job's layout as `fab launch` records it: each launch its hosts and whether sharded."""
    return ShardLayout("B3", tuple(shards.new_launch(list(hosts), sharded=sharded,
                                                     input_sha256="x", prompts=prompts)
                                   for hosts, sharded in launches))


def owned(i: int, n: int, count: int, start: int = 1) -> list[int]:
    """The first `count` integer ids from `start` whose shard (payload.records.shard_of) is i/n."""
    found: list[int] = []
    k = start
    while len(found) < count:
        if shard_of(str(k), n) == i:
            found.append(k)
        k += 1
    return found


def test_two_finished_shards_merge_complete_and_each_id_once(tmp_path: Path) -> None:
    one, two = owned(0, 2, 3), owned(1, 2, 2)
    a = shard(tmp_path, "a", "0/2", "finished", 3, one[:2], failures=[one[2]])
    b = shard(tmp_path, "b", "1/2", "finished", 2, [str(two[0]), two[1]])
    job = layout((("a", "b"), True), prompts=5)
    m = merge("B3", [b, a], tmp_path, job)  # any order: written in launch order
    out = tmp_path / "B3"
    assert ids(out / OUTPUT) == [str(k) for k in (*one[:2], *two)] and ids(out / ERRORS) == [str(one[2])]
    assert (m.answers, m.failures, m.expected, m.problem, m.partial) == (4, 1, 5, None, [])
    assert "complete: all 5 ids of the job" in m.describe()
    assert json.loads((out / OUTPUT).read_text().splitlines()[0])["response"] == f"answer {one[0]}"
    again = merge("B3", [a, b], tmp_path, job)  # nothing new: files left as they are
    assert again.unchanged and (again.answers, again.failures) == (4, 1)


def test_duplicates_torn_lines_and_answers_over_failures(tmp_path: Path) -> None:
    # Both hosts ran the whole input (--no-shard): id 2 answered twice, id 3 failed here but
    # answered there.
    a = shard(tmp_path, "a", None, "running", 10, [1, 2], failures=[3], tail=b'{"id": 9, "usa')
    b = shard(tmp_path, "b", None, "stopped", 10, [2, 3])
    m = merge("B3", [a, b], tmp_path, layout((("a", "b"), False)))
    assert ids(tmp_path / "B3" / OUTPUT) == ["1", "2", "3"] and ids(tmp_path / "B3" / ERRORS) == []
    assert (m.duplicates, m.torn, m.expected) == (2, 1, None)
    assert m.partial == ["not finished on a running, b stopped"] and m.problem is None
    assert "lines still being written left out" in m.describe() and "partial:" in m.describe()


def test_a_missing_shard_is_partial_and_a_wrong_count_is_an_error(tmp_path: Path) -> None:
    a = shard(tmp_path, "a", "0/3", "finished", 2, owned(0, 3, 2))
    c = shard(tmp_path, "c", "2/3", "finished", 1, owned(2, 3, 1))
    m = merge("B3", [a, c], tmp_path, layout((("a", "b", "c"), True), prompts=4))
    assert m.partial == ["shard of b (1/3) not fetched"] and m.expected is None and m.problem is None
    short = shard(tmp_path / "x", "a", None, "finished", 3, [1, 2])  # finished, yet 2 of 3 ids
    m = merge("B3", [short], tmp_path / "x", layout((("a",), False), prompts=3))
    assert m.expected == 3 and m.problem is not None and "holds 2 ids but the job has 3" in m.problem


def test_no_shard_runs_count_each_id_once(tmp_path: Path) -> None:
    """--no-shard: every host did the whole input; the merge holds it once."""
    a = shard(tmp_path, "a", None, "finished", 2, [1, 2])
    b = shard(tmp_path, "b", None, "finished", 2, [2, 1])
    m = merge("B3", [a, b], tmp_path, layout((("a", "b"), False), prompts=2))
    assert (m.answers, m.duplicates, m.expected, m.problem) == (2, 2, 2, None)


def test_a_host_cannot_replace_another_hosts_answers(tmp_path: Path) -> None:
    """Issue 31, finding 3: host a appends forged copies of b's records and says, in its
    job.json, that it is shard 1/2 (to be merged first). The merge takes the hosts in launch
    order and refuses every record outside the returning host's shard, naming the host."""
    one, two = owned(0, 2, 3), owned(1, 2, 3)
    b = shard(tmp_path, "b", "1/2", "finished", 3, two)
    forged = [json.dumps({"id": k, "response": "FORGED"}) for k in two]
    a = shard(tmp_path, "a", "1/2", "finished", 3, one,
              tail=("\n".join(forged) + "\n").encode())
    job = layout((("a", "b"), True), prompts=6)
    m = merge("B3", [b, a], tmp_path, job)
    kept = [json.loads(line) for line in (tmp_path / "B3" / OUTPUT).read_text().splitlines()]
    assert sorted(str(r["id"]) for r in kept) == sorted(str(k) for k in (*one, *two))
    assert all(r["response"] != "FORGED" for r in kept)
    assert m.foreign == {"a": 3} and m.problem is not None and "a (3)" in m.problem
    assert "REFUSED" in m.describe()
    # The same merge again (nothing new) still says so.
    again = merge("B3", [b, a], tmp_path, job)
    assert again.unchanged and again.foreign == {"a": 3} and again.problem is not None


def test_a_hosts_answers_from_an_earlier_launch_are_its_own(tmp_path: Path) -> None:
    """A job relaunched over more hosts: a's output keeps what it answered as shard 0/2;
    those ids are a's in the first launch, so they are merged, not refused."""
    first, now = owned(0, 2, 2), owned(0, 3, 1, start=100)
    a = shard(tmp_path, "a", "0/3", "finished", 3, [*first, *now])
    m = merge("B3", [a], tmp_path, layout((("a", "b"), True), (("a", "b", "c"), True)))
    assert m.foreign == {} and m.answers == 3


def test_a_job_launched_elsewhere_is_never_called_complete(tmp_path: Path) -> None:
    """No layout on this workstation: the hosts are merged by name (never by their
    job.json), and the merge says its completeness cannot be told."""
    b = shard(tmp_path, "b", "0/2", "finished", 1, [2])
    a = shard(tmp_path, "a", "1/2", "finished", 1, [1])
    m = merge("B3", [b, a], tmp_path)
    assert m.hosts == ["a", "b"] and ids(tmp_path / "B3" / OUTPUT) == ["1", "2"]
    assert m.expected is None and "not launched from this workstation" in m.describe()


@pytest.mark.parametrize("bomb", ["[" * 100_000 + "]" * 100_000,
                                  '{"state": "finished", "total": 1' + "0" * 5000 + "}",
                                  '{"shard": "0/100000000000", "hosts": 1e15}'])
def test_a_bomb_in_a_copys_status_or_job_file_is_a_note(tmp_path: Path, bomb: str) -> None:
    """Issue 31, finding 7: a 100,000-deep JSON, a 5000-digit number, a shard count of 1e11:
    read bounded, that copy's note; the merge goes on (no RecursionError, no 2 GB set)."""
    a = shard(tmp_path, "a", "0/1", "finished", 1, [1])
    (a.folder / "status.json").write_text(bomb)
    (a.folder / "job.json").write_text(bomb)
    m = merge("B3", [a], tmp_path, layout((("a",), False), prompts=1))
    assert ids(tmp_path / "B3" / OUTPUT) == ["1"]
    assert m.notes and all(note.startswith("a: ") for note in m.notes)


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_lines_of_every_shape_are_kept_or_counted_as_a_line_by_line_reading_would(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_copy: bool) -> None:
    """The merge maps each file and writes runs of kept lines as slices; what it keeps and
    counts must be what reading line by line gives: long lines with `id` first (read from
    their head) or later (parsed whole), compact and spaced JSON, integer ids, blank lines,
    unreadable lines, duplicates across hosts, and a torn last line. Both with the kernel's
    copy_file_range and without it (not every OS has it)."""
    if not kernel_copy:
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    long = "x" * 5000
    lines_a = [
        json.dumps({"id": "a1", "response": long}, separators=(",", ":")),  # head read
        json.dumps({"response": long, "id": "a2"}),  # id last: parsed whole
        "", "   ",  # blank: left out, not counted
        json.dumps({"id": 7, "response": "int id"}),
        "not json at all",  # unreadable
        json.dumps({"id": "a1", "response": "again"}),  # duplicate within the host
        '{"id":"' + "k" * 600 + '","response":"id longer than the head"}',
    ]
    lines_b = [json.dumps({"id": "a2", "response": "dup on b"}),
               json.dumps({"id": "b1", "response": long}, separators=(",", ":"))]
    for host, lines, tail in (("a", lines_a, b'{"id":"torn","resp'), ("b", lines_b, b"")):
        folder = tmp_path / host / "B3"
        folder.mkdir(parents=True)
        (folder / OUTPUT).write_bytes("\n".join(lines).encode() + b"\n" + tail)
        (folder / ERRORS).write_text(json.dumps({"id": "b1", "error": "lost"}) + "\n"
                                     + json.dumps({"id": "e1", "error": "x"}) + "\n")
        (folder / "status.json").write_text(json.dumps({"state": "running", "total": 9}))
        (folder / "job.json").write_text(json.dumps({"job": "B3", "shard": f"{host == 'b':d}/2"}))
    m = merge("B3", [ShardCopy("a", tmp_path / "a" / "B3"), ShardCopy("b", tmp_path / "b" / "B3")],
              tmp_path)
    kept = (tmp_path / "B3" / OUTPUT).read_text().splitlines()
    assert kept == [lines_a[0], lines_a[1], lines_a[4], lines_a[7], lines_b[1]]
    assert ids(tmp_path / "B3" / ERRORS) == ["e1"]  # b1 answered; e1 once (both hosts have it)
    assert (m.answers, m.failures, m.unreadable, m.torn) == (5, 1, 1, 1)
    assert m.duplicates == 2 + 1 + 2  # a1 and a2 again; e1 again; b1 failed but answered (x2)


def test_one_copy_kept_whole_is_linked_and_a_copy_with_lines_left_out_is_written(
        tmp_path: Path) -> None:
    whole = shard(tmp_path / "w", "a", "0/1", "finished", 2, [1, 2])
    merge("B3", [whole], tmp_path / "w")
    assert os.path.samefile(whole.folder / OUTPUT, tmp_path / "w" / "B3" / OUTPUT)
    cut = shard(tmp_path / "c", "a", "0/1", "running", 3, [1, 2], tail=b'{"id": 3')
    m = merge("B3", [cut], tmp_path / "c")
    assert m.torn == 1 and ids(tmp_path / "c" / "B3" / OUTPUT) == ["1", "2"]
    assert not os.path.samefile(cut.folder / OUTPUT, tmp_path / "c" / "B3" / OUTPUT)


def test_a_giant_line_without_its_id_first_is_unreadable_not_parsed(tmp_path: Path) -> None:
    """A host's 20 MB line whose id comes last would be parsed whole (RSS ~ its size several
    times): past MAX_PARSED_LINE it is left out as unreadable, the other lines merged."""
    from handoff.ops import merge_index

    big = '{"response": "' + "x" * (merge_index.MAX_PARSED_LINE + 1000) + '", "id": "big"}'
    a = shard(tmp_path, "a", None, "finished", 2, [1], tail=(big + "\n").encode())
    m = merge("B3", [a], tmp_path, layout((("a",), False)))
    assert ids(tmp_path / "B3" / OUTPUT) == ["1"] and m.unreadable == 1


def test_a_merge_never_holds_fewer_answers_than_the_last_one(tmp_path: Path) -> None:
    """Issue 32 #3: a copy here that lost lines (a host whose outputs were cut, a copy
    deleted by hand) never takes answers out of the merged file: they are kept from it."""
    one, two = owned(0, 2, 4), owned(1, 2, 3)
    job = layout((("a", "b"), True), prompts=7)
    a = shard(tmp_path, "a", "0/2", "finished", 4, one)
    b = shard(tmp_path, "b", "1/2", "finished", 3, two)
    first = merge("B3", [a, b], tmp_path, job)
    assert first.ids == 7 and first.problem is None
    (b.folder / OUTPUT).write_text(json.dumps({"id": two[0], "response": "again"}) + "\n")
    again = merge("B3", [a, b], tmp_path, job)
    held = ids(tmp_path / "B3" / OUTPUT)
    assert sorted(held) == sorted(str(k) for k in one + two) and len(held) == 7
    assert again.carried == 2 and again.problem is None and "2 answers kept from the last merge" \
        in again.describe()
    (b.folder / OUTPUT).unlink()
    (b.folder / ERRORS).unlink()
    third = merge("B3", [a], tmp_path, job)  # b's copy gone altogether
    assert sorted(ids(tmp_path / "B3" / OUTPUT)) == sorted(held) and third.carried == 3
    # Answers come back in b's copy: each id once, nothing carried any more.
    b = shard(tmp_path / "again", "b", "1/2", "finished", 3, two)
    fourth = merge("B3", [a, ShardCopy("b", b.folder)], tmp_path, job)
    assert sorted(ids(tmp_path / "B3" / OUTPUT)) == sorted(held) and fourth.carried == 0
    assert fourth.ids == 7 and fourth.problem is None


def test_another_input_starts_the_merge_over(tmp_path: Path) -> None:
    """Answers of an earlier input (the job launched anew under its name) are not kept."""
    a = shard(tmp_path, "a", None, "finished", 2, [1, 2])
    merge("B3", [a], tmp_path, layout((("a",), False), prompts=2))
    (a.folder / OUTPUT).write_text(json.dumps({"id": 7}) + "\n")
    other = ShardLayout("B3", (shards.new_launch(["a"], sharded=False, input_sha256="y", prompts=1),))
    m = merge("B3", [a], tmp_path, other)
    assert ids(tmp_path / "B3" / OUTPUT) == ["7"] and m.carried == 0 and m.problem is None


def test_a_last_fetched_copy_stands_in_for_a_host_not_fetched_now(tmp_path: Path) -> None:
    one, two = owned(0, 2, 2), owned(1, 2, 2)
    job = layout((("a", "b"), True), prompts=4)
    a = shard(tmp_path, "a", "0/2", "running", 2, one[:1])
    b = shard(tmp_path, "b", "1/2", "running", 2, two)
    stale = ShardCopy("b", b.folder, stale="its fetch failed: connection refused")
    m = merge("B3", [a, stale], tmp_path, job)
    assert m.ids == 3 and m.problem is None
    assert any(p.startswith("b not fetched now (its fetch failed: connection refused): its last "
                            "fetched copy, from ") for p in m.partial), m.partial
    (b.folder / "status.json").write_text(json.dumps({"state": "finished", "total": 2}))
    (a.folder / "status.json").write_text(json.dumps({"state": "finished", "total": 2}))
    with (a.folder / OUTPUT).open("a") as fh:
        fh.write(json.dumps({"id": one[1]}) + "\n")
    done = merge("B3", [ShardCopy("a", a.folder), ShardCopy("b", b.folder, stale="not asked")],
                 tmp_path, job)
    assert done.partial == [] and done.expected == 4 and done.ids == 4  # it had finished: complete
    assert any("(it had finished)" in n for n in done.notes), done.notes
