"""speculators 0.9.0's layout: dense, stable rows, resumable across ranks, shards and kill -9.

speculators 0.9.0 reads `load_from_disk(OUT)` (columns `input_ids`, `loss_mask` int64,
`seq_len`) and, for dataset row i, `OUT/hidden_states/hs_{i}.safetensors`, whose
`token_ids` must equal row i's `input_ids`. Row numbers are therefore global to the
output dir and dense: no hole, no duplicate, and `hs_{i}` is row i's sample.

Ranks do not talk to each other, and a kill -9 between taking a row number and
writing its file would leave a hole; so rows are not numbered while extracting:

1. A rank writes each sample as a *pending* file named after its id
   (`pending/ab/<sha>.safetensors`; temp name + rename, as every format). The file is
   already in its final form (`token_ids`, `hidden_states` [T,4,H]) and carries its id
   (JSON) and its supervised span in the safetensors metadata, so it describes itself:
   nothing else has to survive a crash.
2. Rows are numbered only while no rank writes: each rank holds a SHARED lock on
   `.rows.lock` for its whole run; when it ends it drops it and tries the EXCLUSIVE
   lock without waiting. Only the last rank to end gets it (an earlier one fails and
   leaves the work to that one), and the ranks of a new launch wait for it before they
   start. The kernel drops a dead process's locks: kill -9 never leaves one behind.
3. `finalize`, under the exclusive lock: every `hs_{row}` file is checked (a broken one
   is deleted and its id is redone by the next run; a duplicate id keeps its lowest
   row); holes are closed by moving the highest rows down; each valid pending file is
   renamed to the next row, in a seeded hash order of the ids (`row_order`: so a
   `--train-data-ratio` split is a random sample) (`os.rename`: no copy). Then the dataset is
   rebuilt from the rows (8 bytes a token of reading), and token_freq.pt and
   manifest.jsonl (id -> row) are rewritten. Every step is idempotent, so a kill -9 in
   the middle leaves files the next finalize (any rerun) completes.

Existing rows keep their numbers across resumed runs (new ones are appended); only a
row whose file was damaged changes hands (the last row takes its place). The dataset
dir and token_freq.pt are written by speculators_dataset.py.

`--feature-dtype fp8` is hs-connectors 0.9.0's FP8 layout (feature_dtype.py):
`hidden_states` float8_e4m3fn [T,4,H] and `hidden_states_scales` float32 [T,1,1], what
its FP8 connector writes and its `FP8Transfer` (`--hidden-states-backend fp8`) reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from payload.errors import UsageError
from payload.extract.feature_dtype import FP8, SCALES_KEY
from payload.extract.formats.base import Format
from payload.extract.formats.speculators_dataset import (
    DATASET_TMP,
    TOKEN_FREQ,
    fsync_dir,
    write_dataset,
)
from payload.extract.tensors import ids_tensor
from payload.extract.writer import (
    DTYPE_BYTES,
    MANIFEST,
    ST_DTYPES,
    TMP_MARK,
    header_matches,
    id_relpath,
    iter_entries,
    read_header,
    safetensors_bytes,
    write_atomically,
    write_manifest,
)

if TYPE_CHECKING:
    from payload.extract.tokens import Conversation, Sample

HS_DIR = "hidden_states"
PENDING_DIR = "pending"
LOCK_NAME = ".rows.lock"
_HS_NAME = re.compile(r"^hs_(\d+)\.safetensors$")


ROW_SEED = "handoff-rows-v1"


def row_order(key: str) -> str:
    """The order new rows are numbered in: sha256(ROW_SEED + "\\x1f" + id), a fixed seeded
    hash. speculators' `--train-data-ratio` makes the first rows the training split and
    the rest validation; in id order the validation split would be "the ids that sort
    last" (biased when ids encode their source), in hash order it is a random sample."""
    return hashlib.sha256(f"{ROW_SEED}\x1f{key}".encode()).hexdigest()


def _span(text: str) -> tuple[int, int]:
    lo, hi = text.split(":")
    return int(lo), int(hi)


def hs_relpath(row: int) -> str:
    return f"{HS_DIR}/hs_{row}.safetensors"


@dataclass(frozen=True)
class RowFile:
    """A complete feature file (a row, or a pending sample), as its header describes it."""

    path: Path
    rid: Any  # the record's id, with its JSON type
    num_tokens: int
    spans: tuple[tuple[int, int], ...]  # the supervised spans [lo, hi)
    ids_at: int  # file offset of the token_ids data

    @property
    def key(self) -> str:
        return str(self.rid)

    @property
    def num_supervised(self) -> int:
        return sum(hi - lo for lo, hi in self.spans)


@dataclass
class Tally:
    """What a finalize did, for its log line."""

    added: int = 0
    moved: int = 0
    broken: int = 0
    duplicates: int = 0

    def __str__(self) -> str:
        extra = "".join(f", {k} {v}" for k, v in (("moved", self.moved),
                                                  ("removed broken", self.broken),
                                                  ("removed duplicates", self.duplicates)) if v)
        return f"{self.added} added{extra}"


def move(src: Path, dst: Path) -> None:
    """The one way a feature file changes name here (a rename: no copy)."""
    os.rename(src, dst)


class RowStore:
    """The rows of one output dir: pending files, row files, and their numbering."""

    def __init__(self, out: Path, hidden: int, dtype: str) -> None:
        for module in ("datasets", "pyarrow"):
            try:
                __import__(module)
            except ImportError:
                raise UsageError(f"--format speculators writes an HF datasets dir and needs "
                                 f"`{module}`: pip install 'datasets>=4' (it brings pyarrow), "
                                 "or pip install '.[extractor]'") from None
        self.out = out
        self.hidden = hidden
        self.dtype = dtype
        self._lock_fd: int | None = None
        self._index: dict[str, int] = {}

    # -- one file ---------------------------------------------------------------------
    @property
    def fp8(self) -> bool:
        return self.dtype == FP8

    def _want(self, t: int) -> dict[str, tuple[str, list[int]]]:
        want = {"token_ids": ("I64", [t]),
                "hidden_states": (ST_DTYPES[self.dtype], [t, 4, self.hidden])}
        if self.fp8:
            want[SCALES_KEY] = ("F32", [t, 1, 1])
        return want

    @staticmethod
    def _metadata(sample: Sample) -> dict[str, str]:
        t = sample.num_tokens
        spans = ",".join(f"{lo}:{min(hi, t)}" for lo, hi in sample.spans if lo < min(hi, t))
        return {"id": json.dumps(sample.id, ensure_ascii=False),
                "loss_mask": spans or f"{sample.prompt_len}:{sample.prompt_len}"}

    def file_bytes(self, sample: Sample) -> int:
        specs = [(n, d, s) for n, (d, s) in self._want(sample.num_tokens).items()]
        return safetensors_bytes(specs, self._metadata(sample))

    def read(self, path: Path) -> RowFile | None:
        """The file's description when it is complete and of this output's shape."""
        parsed = read_header(path)
        if parsed is None:
            return None
        header, start = parsed
        try:
            meta = header["__metadata__"]
            t = int(header["token_ids"]["shape"][0])
            rid = json.loads(meta["id"])
            spans = tuple(_span(part) for part in meta["loss_mask"].split(","))
            ids_at = start + int(header["token_ids"]["data_offsets"][0])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            return None
        ordered = all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
        if (t <= 0 or not ordered or not all(0 <= lo <= hi <= t for lo, hi in spans)
                or not header_matches(header, self._want(t))):
            return None
        if not isinstance(rid, (str, int)) or isinstance(rid, bool):
            return None
        return RowFile(path, rid, t, spans, ids_at)

    def pending_relpath(self, key: str) -> str:
        return id_relpath(key, PENDING_DIR, ".safetensors")

    def write_pending(self, sample: Sample, aux: Any, final: Any, scale: Any = None) -> int:
        import torch
        from safetensors.torch import save_file

        t = sample.num_tokens
        if (scale is not None) != self.fp8:
            raise RuntimeError(f"speculators {self.dtype} rows: scales {scale is not None}")
        tensors = {"token_ids": ids_tensor(sample),
                   "hidden_states": torch.cat([aux, final], dim=-1).view(t, 4, self.hidden)}
        if scale is not None:
            tensors[SCALES_KEY] = scale.reshape(t, 1, 1).contiguous()
        meta = self._metadata(sample)
        return write_atomically(self.out / self.pending_relpath(sample.key),
                                lambda tmp: save_file(tensors, str(tmp), metadata=meta))

    # -- a rank's run -----------------------------------------------------------------
    def open(self, *, dry: bool) -> None:
        """Join the writers (shared lock; waits while a finalize runs), then read which
        ids have rows. A dry run (--preflight-only) takes no lock and writes nothing."""
        if not dry:
            fd = os.open(self.out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_SH)
            self._lock_fd = fd
        self._index = self._read_index()

    def _row_numbers(self) -> dict[int, Path]:
        hs = self.out / HS_DIR
        if not hs.is_dir():
            return {}
        found = {}
        for entry in os.scandir(hs):
            m = _HS_NAME.match(entry.name)
            if m:
                found[int(m.group(1))] = Path(entry.path)
        return found

    def _read_index(self) -> dict[str, int]:
        """id -> row: from manifest.jsonl when it lists exactly the rows on disk, else
        from the files' own headers (a finalize was cut short)."""
        on_disk = self._row_numbers()
        listed = {int(e["row"]): str(e["id"]) for e in iter_entries(self.out / MANIFEST)
                  if isinstance(e.get("row"), int)}
        if set(listed) == set(on_disk):
            return {key: row for row, key in listed.items()}
        index: dict[str, int] = {}
        for row, path in on_disk.items():
            f = self.read(path)
            if f is not None:
                index.setdefault(f.key, row)
        return index

    def done(self, key: str) -> bool:
        row = self._index.get(key)
        if row is not None:
            f = self.read(self.out / hs_relpath(row))
            if f is not None and f.key == key:
                return True
        f = self.read(self.out / self.pending_relpath(key))
        return f is not None and f.key == key

    def close(self) -> str | None:
        """Leave the writers; the last one to leave numbers the rows (see the docstring)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return ("speculators rows: other ranks still write to this output dir; "
                        "the last one to end numbers the rows")
            return self.finalize()
        finally:
            os.close(fd)  # also drops the exclusive lock

    # -- numbering the rows (exclusive lock held) -------------------------------------
    def finalize(self) -> str:
        """Number the rows, then rewrite what is derived from them (see the docstring)."""
        (self.out / HS_DIR).mkdir(parents=True, exist_ok=True)
        tally = Tally()
        rows = self._valid_rows(tally)
        pending = self._valid_pending({f.key for f in rows.values()}, tally)
        ordered = self._renumber(rows, pending, tally)
        fsync_dir(self.out / HS_DIR)
        self._remove_leftovers()
        tokens = write_dataset(self.out, ordered)
        write_manifest(self.out, ({"id": f.rid, "file": hs_relpath(r), "row": r,
                                   "num_tokens": f.num_tokens,
                                   "num_supervised": f.num_supervised}
                                  for r, f in enumerate(ordered)))
        self._index = {f.key: r for r, f in enumerate(ordered)}
        return (f"speculators rows: {len(ordered)} rows ({tally}), {tokens} tokens; "
                f"dataset, {TOKEN_FREQ} and {MANIFEST} written")

    def _valid_rows(self, tally: Tally) -> dict[int, RowFile]:
        """The row files that are complete, one per id (the lowest row wins)."""
        rows: dict[int, RowFile] = {}
        for row, path in self._row_numbers().items():
            f = self.read(path)
            if f is None:
                path.unlink()  # cut short by a crash: its id is redone by the next run
                tally.broken += 1
            else:
                rows[row] = f
        seen: set[str] = set()
        for row in sorted(rows):
            if rows[row].key in seen:
                rows.pop(row).path.unlink()
                tally.duplicates += 1
            else:
                seen.add(rows[row].key)
        return rows

    def _valid_pending(self, have: set[str], tally: Tally) -> list[RowFile]:
        """The complete pending files of ids that have no row yet, in row order (a seeded
        hash of the id: see `row_order`)."""
        pending = []
        for path in self._pending_files():
            f = self.read(path)
            if f is None or f.key in have:
                path.unlink()  # broken, or already a row (a rerun of a done id)
                tally.broken += f is None
                tally.duplicates += f is not None
                continue
            have.add(f.key)
            pending.append(f)
        return sorted(pending, key=lambda f: row_order(f.key))

    def _renumber(self, rows: dict[int, RowFile], pending: list[RowFile],
                  tally: Tally) -> list[RowFile]:
        """Close the holes with the highest rows, then append the pending files."""
        n = len(rows)
        holes = [r for r in range(n) if r not in rows]
        beyond = sorted((r for r in rows if r >= n), reverse=True)
        for hole, src in zip(holes, beyond, strict=True):
            dst = self.out / hs_relpath(hole)
            move(rows[src].path, dst)
            rows[hole] = replace(rows.pop(src), path=dst)
            tally.moved += 1
        for f in pending:
            dst = self.out / hs_relpath(len(rows))
            move(f.path, dst)
            rows[len(rows)] = replace(f, path=dst)
            tally.added += 1
        return [rows[r] for r in range(len(rows))]

    def _pending_files(self) -> list[Path]:
        root = self.out / PENDING_DIR
        if not root.is_dir():
            return []
        return sorted(p for p in root.glob("*/*.safetensors") if not p.name.startswith("."))

    def _remove_leftovers(self) -> None:
        """Temp files of killed writers and of a killed finalize: no one writes now."""
        root = self.out / PENDING_DIR
        if root.is_dir():
            for sub in root.iterdir():
                if not sub.is_dir():
                    continue
                for p in sub.iterdir():
                    if p.name.startswith(".") and TMP_MARK in p.name:
                        p.unlink()
                with contextlib.suppress(OSError):
                    sub.rmdir()  # empty now: every pending file became a row
            with contextlib.suppress(OSError):
                root.rmdir()
        for p in self.out.iterdir():
            if p.name.startswith(DATASET_TMP):
                shutil.rmtree(p, ignore_errors=True)


class Speculators(Format):
    """speculators 0.9.0's offline data: the rows (RowStore, above) and the dataset."""

    name = "speculators"

    def __init__(self, out: Path, hidden: int, dtype: str, compress: str | None = None) -> None:
        super().__init__(out, hidden, dtype, compress)
        self.rows = RowStore(out, hidden, dtype)

    def relpath(self, key: str) -> str:
        return self.rows.pending_relpath(key)

    def sample_bytes(self, sample: Sample) -> int:
        return self.rows.file_bytes(sample)

    def shared_bytes(self, sample: Sample) -> int:
        # the dataset's input_ids and loss_mask (int64 each), seq_len and list offsets
        return 16 * sample.num_tokens + 24

    def fixed_bytes(self, vocab_size: int) -> int:
        # Arrow schema and HF json files (~2 KB seen), token_freq.pt (<= ~16 B an id)
        return 64 * 1024 + 16 * vocab_size

    def bytes_per_token(self) -> int:
        scales = 4 if self.rows.fp8 else 0  # one float32 a token
        return 4 * self.hidden * DTYPE_BYTES[self.dtype] + scales + 8 + 16

    def meta(self, layers: tuple[int, ...], vocab_size: int) -> dict[str, Any]:
        # vLLM (speculators' capture) numbers layers as HF's output_hidden_states does;
        # the trainer's --target-layer-ids are the three aux ids, the 4th slot is implicit.
        # hidden_states_backend: its `--hidden-states-backend` (fp8 dequantizes on load).
        return {"target_layer_ids": list(layers), "target_vocab_size": vocab_size,
                "hidden_states_backend": "fp8" if self.rows.fp8 else "file",
                "row_order": f"new rows by sha256('{ROW_SEED}' + 0x1f + id), appended"}

    def keys(self) -> dict[str, str]:
        keys = {"token_ids": "int64 [T] (hidden_states/hs_{row}.safetensors)",
                "hidden_states": f"{self.dtype} [T, 4, H]: the 3 aux layers, then the final "
                                 "state (see final_state)",
                "dataset": "input_ids int64 [T], loss_mask int64 [T], seq_len (row = hs_{row})"}
        if self.rows.fp8:
            keys[SCALES_KEY] = ("float32 [T, 1, 1]: one scale per token over its 4 x H "
                                "values; the state is hidden_states x scale (hs-connectors)")
        return keys

    def open(self, tag: str, *, dry: bool) -> None:
        self.rows.open(dry=dry)

    def done(self, conv: Conversation) -> bool:
        return self.rows.done(conv.key)

    def write(self, sample: Sample, aux: Any, final: Any, scale: Any = None) -> int:
        return self.rows.write_pending(sample, aux, final, scale)

    def record(self, sample: Sample) -> None:
        """Nothing to list yet: the pending file describes itself; rows come at close."""

    def close(self) -> str | None:
        return self.rows.close()
