"""speculators' dataset dir and token_freq.pt, rebuilt from the row files alone.

speculators 0.9.0 reads `load_from_disk(OUT)`: an HF datasets dir with `input_ids`,
`loss_mask` (int64) and `seq_len` per row, row i being `hidden_states/hs_{i}`'s sample;
with `--draft-vocab-size` it maps its draft vocab from `token_freq.pt`
(`{token id: count}` over supervised tokens). Both are derived: written from the row
files' own token ids and supervised spans (8 bytes a token of reading), under the
rows' exclusive lock (speculators.py), swapped in so that a reader never sees a mix.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from payload import atomic
from payload.extract.writer import TMP_MARK

TOKEN_FREQ = "token_freq.pt"
DATASET_TMP = ".dataset" + TMP_MARK
_CHUNK_TOKENS = 1 << 26  # rows per Arrow chunk stay far below list<int64>'s 2^31 offsets


class RowSource(Protocol):
    """What the dataset needs of one row file (speculators.RowFile)."""

    @property
    def path(self) -> Path: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def lo(self) -> int: ...
    @property
    def hi(self) -> int: ...
    @property
    def ids_at(self) -> int: ...


def fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_dataset(out: Path, rows: Sequence[RowSource]) -> int:
    """The HF datasets dir (what `load_from_disk(OUT)` reads) and token_freq.pt, from
    the rows' own token ids and spans; swapped in with state.json moved last."""
    import datasets
    import pyarrow as pa
    import torch

    datasets.disable_progress_bars()  # a nohup log wants no tqdm bars
    ids, masks, freq = _columns(rows)
    list_type = pa.list_(pa.int64())
    seq = datasets.List(datasets.Value("int64"))
    features = datasets.Features({"input_ids": seq, "loss_mask": seq,
                                  "seq_len": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict(
        {"input_ids": pa.chunked_array(ids, type=list_type),
         "loss_mask": pa.chunked_array(masks, type=list_type),
         "seq_len": pa.array([f.num_tokens for f in rows], type=pa.int64())},
        features=features)
    ds.set_format(type="torch")  # speculators compares rows with torch.equal
    tmp = out / f"{DATASET_TMP}{os.getpid()}"
    ds.save_to_disk(str(tmp))
    _swap_in(out, tmp)
    # {token id: count} over supervised tokens, as speculators' own prepare step saves it
    buf = io.BytesIO()
    torch.save({int(i): int(c) for i, c in enumerate(freq.tolist()) if c}, buf)
    atomic.write_bytes(out / TOKEN_FREQ, buf.getvalue())
    return sum(f.num_tokens for f in rows)

def _columns(rows: Sequence[RowSource]) -> tuple[list[Any], list[Any], Any]:
    """input_ids and loss_mask as Arrow list chunks (read from the row files), and the
    supervised token counts; chunked so no chunk outgrows list<int64>'s offsets."""
    import numpy as np
    import pyarrow as pa

    ids_chunks: list[Any] = []
    mask_chunks: list[Any] = []
    freq = np.zeros(0, dtype=np.int64)
    start = 0
    while start < len(rows):
        stop, total = start + 1, rows[start].num_tokens
        while stop < len(rows) and total + rows[stop].num_tokens <= _CHUNK_TOKENS:
            total += rows[stop].num_tokens
            stop += 1
        flat = np.empty(total, dtype=np.int64)
        mask = np.zeros(total, dtype=np.int64)
        offsets = np.zeros(stop - start + 1, dtype=np.int32)
        at = 0
        for i, f in enumerate(rows[start:stop]):
            with f.path.open("rb") as fh:
                fh.seek(f.ids_at)
                flat[at:at + f.num_tokens] = np.frombuffer(fh.read(8 * f.num_tokens),
                                                            dtype="<i8")
            mask[at + f.lo:at + f.hi] = 1
            at += f.num_tokens
            offsets[i + 1] = at
        ids_chunks.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)))
        mask_chunks.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask)))
        counts = np.bincount(flat[mask == 1])
        if len(counts) > len(freq):
            freq = np.pad(freq, (0, len(counts) - len(freq)))
        freq[:len(counts)] += counts
        start = stop
    return ids_chunks, mask_chunks, freq

def _swap_in(out: Path, tmp: Path) -> None:
    """Replace the dataset files in OUT by tmp's: state.json (which names the arrow
    files) goes first and comes back last, so a reader never sees a mix."""
    (out / "state.json").unlink(missing_ok=True)
    new = sorted(p.name for p in tmp.iterdir())
    for old in out.glob("data-*.arrow"):
        if old.name not in new:
            old.unlink()
    for name in new:
        if name != "state.json":
            os.replace(tmp / name, out / name)
    os.replace(tmp / "state.json", out / "state.json")
    tmp.rmdir()
    fsync_dir(out)
