"""The resume index and the single writer's files: the fast path and its fallback, torn
tails, `--retry-failed`'s rewrite, the compact id set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from payload.generate.journal import (
    drop_failures,
    encode_record,
    id_hash,
    load_index,
    truncate_torn_tail,
)

pytestmark = pytest.mark.timeout(30)


def write_records(path: Path, ids: list, *, cost: float = 0.01) -> None:
    with path.open("wb") as fh:
        for i in ids:
            fh.write(encode_record({"id": i, "usage": {"prompt_tokens": 2,
                                                       "completion_tokens": 3, "cost": cost},
                                    "response": "x" * 50, "messages": []}))


def test_resume_index_fast_path_fallback_and_torn_tail(tmp_path):
    out, err = tmp_path / "o.jsonl", tmp_path / "o.errors.jsonl"
    write_records(out, [1, "a", 'q"uo\\te', "ünï"])
    with out.open("ab") as fh:
        # Written by something else: id not first. The full-parse fallback still finds it.
        fh.write(json.dumps({"response": "y", "id": 77, "usage": {"cost": 1.0}}).encode()
                 + b"\n")
        fh.write(b'{"id": 5, "usage": {"cost": 0.01}, "resp')  # torn by kill -9
    err.write_bytes(encode_record({"id": 9, "error": {"status": 400}, "attempts": 1}))
    index = load_index(out, err)
    assert index.truncated_bytes > 0 and out.read_bytes().endswith(b"\n")
    keys = ("1", "a", 'q"uo\\te', "ünï", "77")
    assert len(index.done) == 5 and all(id_hash(k) in index.done for k in keys)
    assert len(index.failed) == 1 and id_hash("9") in index.failed
    assert index.cost == pytest.approx(1.04)
    assert (index.prompt_tokens, index.completion_tokens) == (8, 12)


def test_truncate_keeps_complete_files(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"a\nb\n")
    assert truncate_torn_tail(p) == 0
    p.write_bytes(b"no newline at all")
    assert truncate_torn_tail(p) == 17 and p.read_bytes() == b""


def test_drop_failures_rewrites_atomically(tmp_path):
    err = tmp_path / "o.errors.jsonl"
    err.write_bytes(b"".join(encode_record({"id": i, "error": {}, "attempts": 1})
                             for i in range(10)))
    assert drop_failures(err, lambda key: int(key) % 2 == 0) == 5
    assert [json.loads(x)["id"] for x in err.read_text().splitlines()] == [1, 3, 5, 7, 9]
    assert not list(tmp_path.glob("*.tmp"))


def test_idset_is_exact_across_merges():
    from payload.generate.journal import IdSet
    ids = IdSet()
    ids.MERGE_AT = 100  # type: ignore[misc]
    for i in range(1050):
        ids.add(id_hash(str(i)))
    assert len(ids) == 1050
    assert all(id_hash(str(i)) in ids for i in range(1050))
    assert not any(id_hash(str(i)) in ids for i in range(1050, 3000))


def test_the_index_counts_answers_by_provider_and_finish_reason(tmp_path):
    """From the short prefix the payload writes (decoded once per distinct value), from a
    full parse of a record written by something else, and per turn with --turns all."""
    out, err = tmp_path / "o.jsonl", tmp_path / "o.errors.jsonl"
    with out.open("wb") as fh:
        for i in range(6):
            fh.write(encode_record({"id": i, "usage": {"cost": 0.01},
                                    "finish_reason": "length" if i < 2 else "stop",
                                    "provider": "A" if i % 2 else "B", "response": "x",
                                    "messages": []}))
        fh.write(encode_record({"id": "t", "usage": {"cost": 0.03}, "finish_reason": "stop",
                                "provider": "A", "turns": [
                                    {"index": 2, "finish_reason": "length", "provider": "B"},
                                    {"index": 4, "finish_reason": "stop", "provider": "A"}],
                                "response": "y", "messages": []}))
        fh.write(json.dumps({"response": "z", "id": 99, "usage": {},
                             "provider": "C", "finish_reason": "stop"}).encode() + b"\n")
        fh.write(encode_record({"id": "old", "usage": {}, "response": "w", "messages": []}))
    index = load_index(out, err)
    assert len(index.done) == 9
    assert index.by_provider == {"A": 4, "B": 4, "C": 1, "unknown": 1}
    assert index.by_finish_reason == {"length": 3, "stop": 6, "unknown": 1}
    assert index.cost == pytest.approx(0.09)
