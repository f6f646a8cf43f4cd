"""speculators' rows on their own (no model): numbering under the lock, holes, broken and
duplicate files, stable row numbers, and the dataset that matches the files."""

from __future__ import annotations

import shutil
from array import array
from pathlib import Path

import pytest

from payload.extract.formats.speculators import HS_DIR, PENDING_DIR, RowStore, hs_relpath
from payload.extract.tokens import Sample
from tests.payload.extract.helpers import read_features

H = 8


def sample(rid, t: int) -> Sample:
    return Sample(rid, str(rid), array("i", [(7 * i + len(str(rid))) % 50 for i in range(t)]),
                  prompt_len=2, sup_end=t - 1)


def write(out: Path, *samples: Sample) -> None:
    import torch

    store = RowStore(out, H, "float32")
    for s in samples:
        t = s.num_tokens
        store.write_pending(s, torch.randn(t, 3 * H), torch.randn(t, H))


def ids_by_row(out: Path) -> dict[int, str]:
    return {f["row"]: key for key, f in read_features(out, "speculators").items()}


def test_rows_are_numbered_by_the_last_writer_to_leave(tmp_path: Path) -> None:
    a, b = RowStore(tmp_path, H, "float32"), RowStore(tmp_path, H, "float32")
    a.open(dry=False)
    b.open(dry=False)
    write(tmp_path, sample("x", 5), sample(3, 6))
    assert "other ranks still write" in (b.close() or "")
    assert not (tmp_path / HS_DIR).exists()
    assert "2 rows (2 added)" in (a.close() or "")
    assert ids_by_row(tmp_path) == {0: "3", 1: "x"}  # pending files go in id order
    c = RowStore(tmp_path, H, "float32")
    c.open(dry=True)  # --preflight-only: no lock, reads the rows
    assert c.done("x") and c.done("3") and not c.done("y")
    assert c.close() is None


def test_new_rows_are_appended_and_old_ones_keep_their_numbers(tmp_path: Path) -> None:
    write(tmp_path, sample("b", 4), sample("d", 5))
    RowStore(tmp_path, H, "float32").finalize()
    write(tmp_path, sample("a", 6), sample("c", 7))
    line = RowStore(tmp_path, H, "float32").finalize()
    assert "4 rows (2 added)" in line
    assert ids_by_row(tmp_path) == {0: "b", 1: "d", 2: "a", 3: "c"}


def test_broken_and_duplicate_files_leave_dense_rows(tmp_path: Path) -> None:
    write(tmp_path, *(sample(f"s{i}", 4 + i) for i in range(5)))
    store = RowStore(tmp_path, H, "float32")
    store.finalize()
    before = ids_by_row(tmp_path)
    # a row cut short by a machine crash, a rerun of a done id, leftovers of kills
    victim = tmp_path / hs_relpath(1)
    victim.write_bytes(victim.read_bytes()[:-10])
    dup_key = before[3]
    write(tmp_path, sample(dup_key, 4 + 3))
    (tmp_path / ".dataset.tmp-123").mkdir()
    pending_dir = (tmp_path / store.pending_relpath("zz")).parent
    pending_dir.mkdir(parents=True, exist_ok=True)
    (pending_dir / ".zz.safetensors.tmp-1-2").write_bytes(b"half")
    line = store.finalize()
    assert "4 rows (0 added, moved 1, removed broken 1, removed duplicates 1)" in line
    after = ids_by_row(tmp_path)
    assert after == {0: before[0], 1: before[4], 2: before[2], 3: before[3]}  # last row moved
    assert not store.done(before[1])  # the broken one is redone by the next run
    assert store.done(before[4])
    assert not (tmp_path / PENDING_DIR).exists()
    assert not list(tmp_path.glob(".dataset*"))


def test_a_file_of_another_shape_is_not_a_row(tmp_path: Path) -> None:
    write(tmp_path, sample("a", 4))
    RowStore(tmp_path, H, "float32").finalize()
    other = RowStore(tmp_path, H + 1, "float32")
    assert not other.done("a")
    assert RowStore(tmp_path, H, "bfloat16").read(tmp_path / hs_relpath(0)) is None


def test_the_dataset_is_rebuilt_when_it_was_lost(tmp_path: Path) -> None:
    write(tmp_path, sample("a", 4), sample("b", 5))
    store = RowStore(tmp_path, H, "float32")
    store.finalize()
    (tmp_path / "state.json").unlink()  # a kill during the dataset swap
    for p in tmp_path.glob("data-*.arrow"):
        p.unlink()
    store.finalize()
    assert ids_by_row(tmp_path) == {0: "a", 1: "b"}


@pytest.mark.parametrize("missing", ["manifest", "rows listed"])
def test_the_index_survives_a_stale_manifest(tmp_path: Path, missing: str) -> None:
    write(tmp_path, sample("a", 4), sample("b", 5), sample("c", 6))
    RowStore(tmp_path, H, "float32").finalize()
    if missing == "manifest":
        (tmp_path / "manifest.jsonl").unlink()
    else:  # rows renamed in, manifest not yet rewritten
        shutil.copy(tmp_path / hs_relpath(2), tmp_path / hs_relpath(3))
        (tmp_path / hs_relpath(2)).unlink()
    store = RowStore(tmp_path, H, "float32")
    store.open(dry=True)
    assert all(store.done(k) for k in "abc")
