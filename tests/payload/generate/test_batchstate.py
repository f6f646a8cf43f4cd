"""The batch ledger (batches.json) and the Batch API's answers read field by field."""

from __future__ import annotations

from pathlib import Path

import pytest

from payload.errors import UsageError
from payload.generate.batchapi import ApiError, BatchInfo
from payload.generate.batchstate import Ledger, default_path


def test_the_ledger_round_trips_and_names_its_files(tmp_path: Path) -> None:
    path = default_path(tmp_path / "out.jsonl")
    assert path.name == "out.batches.json"
    ledger = Ledger.open(path, "http://127.0.0.1:1/api/v1", "m")
    e = ledger.new(3, 120)
    ledger.folder.mkdir()
    ledger.write_ids(e, [("7", 0), ("id with \"quotes\"\n", 40), ("9", 80)])
    e.step, e.file_id = "uploaded", "file-1"
    ledger.save()
    again = Ledger.load(path)
    assert again is not None and again.tag == ledger.tag and len(again.tag) == 12
    (entry,) = again.entries
    assert (entry.step, entry.file_id, entry.requests, entry.live) == ("uploaded", "file-1", 3, True)
    assert again.read_ids(entry) == [("7", 0), ("id with \"quotes\"\n", 40), ("9", 80)]
    assert ledger.folder == tmp_path / "out.batches"
    assert again.filename(entry) == f"handoff-{ledger.tag}-00000.jsonl"
    assert again.metadata(entry) == {"handoff": f"{ledger.tag}-00000"}
    assert again.summary()["unsent"] == 1 and again.summary()["live"] == 0


@pytest.mark.parametrize("text", ["{", '{"batches": [{"n": "x"}], "tag": "t"}', "[]",
                                  '{"tag": "t", "batches": [{"n": 0, "requests": 1, '
                                  '"bytes": 1, "step": "lost"}]}'])
def test_an_unreadable_ledger_is_refused_not_guessed(tmp_path: Path, text: str) -> None:
    path = tmp_path / "b.json"
    path.write_text(text)
    with pytest.raises(UsageError, match="is not readable"):
        Ledger.load(path)


def test_a_ledger_of_another_server_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    ledger = Ledger.open(path, "http://127.0.0.1:1/api/v1", "m")
    ledger.new(1, 1)
    ledger.save()
    with pytest.raises(UsageError, match=r"were submitted to http://127\.0\.0\.1:1/api/v1"):
        Ledger.open(path, "http://127.0.0.1:2/api/v1", "m")
    assert Ledger.open(path, "http://127.0.0.1:1/api/v1/", "m").tag == ledger.tag


def test_one_holder_at_a_time(tmp_path: Path) -> None:
    first = Ledger.open(tmp_path / "b.json", "u", "m")
    first.lock()
    try:
        with pytest.raises(UsageError, match="another process holds the batches"):
            Ledger.open(tmp_path / "b.json", "u", "m").lock()
    finally:
        first.unlock()
    second = Ledger.open(tmp_path / "b.json", "u", "m")
    second.lock()
    second.unlock()


def test_batch_info_reads_the_fields_it_uses() -> None:
    info = BatchInfo.from_json({
        "id": "batch_1", "status": "expired", "input_file_id": "file-a",
        "output_file_id": "file-o", "error_file_id": None, "created_at": 10,
        "expired_at": 99, "request_counts": {"total": 5, "completed": 3, "failed": -1},
        "metadata": {"handoff": "t-00001", "n": 3},
        "errors": {"data": [{"line": 2, "code": "bad", "message": "no"}]}})
    assert (info.id, info.status, info.terminal, info.input_file_id) == (
        "batch_1", "expired", True, "file-a")
    assert (info.total, info.completed, info.failed) == (5, 3, 0)
    assert (info.created_at, info.ended_at, info.error_file_id) == (10.0, 99.0, None)
    assert info.metadata == {"handoff": "t-00001"} and info.errors == ("line 2: bad no",)


@pytest.mark.parametrize("raw", [None, [], {"id": "b", "status": "exploded"},
                                 {"id": 5, "status": "completed"},
                                 {"id": "a\x1b[2Jb", "status": "completed"},
                                 {"id": "", "status": "completed"}])
def test_batch_info_refuses_what_is_not_a_batch(raw: object) -> None:
    with pytest.raises(ApiError):
        BatchInfo.from_json(raw)
