"""Merging a job's fetched shards (handoff.merge): every id exactly once, answers winning over
failures, lines still being written left out, the count checked against the shards' totals
once all are finished, partial merges named as such, and a rerun with nothing new a no-op."""

from __future__ import annotations

import json
from pathlib import Path

from handoff.merge import ERRORS, OUTPUT, ShardCopy, merge


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


def test_two_finished_shards_merge_complete_and_each_id_once(tmp_path: Path) -> None:
    a = shard(tmp_path, "a", "0/2", "finished", 3, [1, 3], failures=[5])
    b = shard(tmp_path, "b", "1/2", "finished", 2, ["2", 4])
    m = merge("B3", [b, a], tmp_path)  # any order: written shard 0 first
    out = tmp_path / "B3"
    assert ids(out / OUTPUT) == ["1", "3", "2", "4"] and ids(out / ERRORS) == ["5"]
    assert (m.answers, m.failures, m.expected, m.problem, m.partial) == (4, 1, 5, None, [])
    assert "complete: all 5 ids of the job" in m.describe()
    assert json.loads((out / OUTPUT).read_text().splitlines()[0])["response"] == "answer 1"
    again = merge("B3", [a, b], tmp_path)  # nothing new: files left as they are
    assert again.unchanged and (again.answers, again.failures) == (4, 1)


def test_duplicates_torn_lines_and_answers_over_failures(tmp_path: Path) -> None:
    # A job relaunched over other hosts: id 2 answered twice, id 3 failed here but answered there.
    a = shard(tmp_path, "a", "0/2", "running", 10, [1, 2], failures=[3], tail=b'{"id": 9, "usa')
    b = shard(tmp_path, "b", "1/2", "stopped", 10, [2, 3])
    m = merge("B3", [a, b], tmp_path)
    assert ids(tmp_path / "B3" / OUTPUT) == ["1", "2", "3"] and ids(tmp_path / "B3" / ERRORS) == []
    assert (m.duplicates, m.torn, m.expected) == (2, 1, None)
    assert m.partial == ["not finished on a running, b stopped"] and m.problem is None
    assert "lines still being written left out" in m.describe() and "partial:" in m.describe()


def test_a_missing_shard_is_partial_and_a_wrong_count_is_an_error(tmp_path: Path) -> None:
    a = shard(tmp_path, "a", "0/3", "finished", 2, [1, 2])
    c = shard(tmp_path, "c", "2/3", "finished", 1, [3])
    m = merge("B3", [a, c], tmp_path)
    assert m.partial == ["shard 1/3 not fetched"] and m.expected is None and m.problem is None
    short = shard(tmp_path / "x", "a", None, "finished", 3, [1, 2])  # finished, yet 2 of 3 ids
    m = merge("B3", [short], tmp_path / "x")
    assert m.expected == 3 and m.problem is not None and "holds 2 ids but its shards' totals say 3" in m.problem


def test_no_shard_runs_count_each_id_once(tmp_path: Path) -> None:
    """--no-shard: every host did the whole input; the merge holds it once."""
    a = shard(tmp_path, "a", None, "finished", 2, [1, 2])
    b = shard(tmp_path, "b", None, "finished", 2, [2, 1])
    m = merge("B3", [a, b], tmp_path)
    assert (m.answers, m.duplicates, m.expected, m.problem) == (2, 2, 2, None)
