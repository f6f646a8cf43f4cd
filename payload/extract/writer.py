"""Feature files, their validation on resume, and the manifest.

A sample is done iff its file exists under its final name AND its safetensors header
parses, names exactly our four tensors with the expected shapes and dtypes, and the
data section is exactly as long as the header says. Files are written to a temp name
and renamed, so a kill -9 leaves a temp file (cleaned at the next start), never a
half file under the final name; the length check also catches a file truncated by a
crash of the machine itself (no fsync per sample: it would cost more than the write).

Each rank appends to its own manifest part; `merge_manifest` rebuilds `manifest.jsonl`
from every part under an exclusive lock with an atomic rename, keeping one entry per
id whose file exists. Every rank merges when it finishes, so whichever rank finishes
last leaves the complete manifest, without a barrier between ranks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from payload import atomic

SAMPLES_DIR = "samples"
PARTS_DIR = "manifest.parts"
MANIFEST = "manifest.jsonl"
KEYS = ("input_ids", "loss_mask", "aux_hidden_states", "hidden_state")
ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
ID_DTYPE, MASK_DTYPE = "I64", "U8"
ID_BYTES, MASK_BYTES = 8, 1
TMP_MARK = atomic.TMP_MARK


def sample_relpath(key: str) -> str:
    """Deterministic from the id alone (any rank, any resumed run finds the same file).

    Hashed so any id is a safe file name; fanned out by two hex digits so a million
    samples do not sit in one directory.
    """
    h = hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]
    return f"{SAMPLES_DIR}/{h[:2]}/{h}.safetensors"


def temp_path(final: Path) -> Path:
    return atomic.temp_name(final)


def write_sample(final: Path, tensors: dict[str, Any]) -> int:
    """Write to a temp name, rename into place; returns the bytes written."""
    from safetensors.torch import save_file

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(final)
    try:
        save_file(tensors, str(tmp))
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return final.stat().st_size


def read_header(path: Path) -> tuple[dict[str, Any], int] | None:
    """(header, data start) or None when the file is not a complete safetensors file."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                return None
            n = int.from_bytes(raw, "little")
            if n > min(size - 8, 1 << 24):
                return None
            header = json.loads(fh.read(n))
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            return None
    if 8 + n + end != size:  # truncated (or grown): not the file we wrote
        return None
    return header, 8 + n


def validate(path: Path, hidden: int, dtype: str) -> int | None:
    """Number of tokens when `path` is a complete, well-formed sample file; else None."""
    parsed = read_header(path)
    if parsed is None:
        return None
    header = parsed[0]
    if set(header) - {"__metadata__"} != set(KEYS):
        return None
    try:
        t = int(header["input_ids"]["shape"][0])
        want = {
            "input_ids": (ID_DTYPE, [t]),
            "loss_mask": (MASK_DTYPE, [t]),
            "aux_hidden_states": (ST_DTYPES[dtype], [t, 3 * hidden]),
            "hidden_state": (ST_DTYPES[dtype], [t, hidden]),
        }
        for name, (dt, shape) in want.items():
            if header[name]["dtype"] != dt or list(header[name]["shape"]) != shape:
                return None
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return t if t > 0 else None


def count_supervised(path: Path) -> int:
    """Ones in the stored loss mask, read straight from the file (no torch needed)."""
    parsed = read_header(path)
    if parsed is None:
        raise ValueError(f"{path}: not a complete safetensors file")
    header, start = parsed
    lo, hi = header["loss_mask"]["data_offsets"]
    with path.open("rb") as fh:
        fh.seek(start + lo)
        data = fh.read(hi - lo)
    return sum(1 for b in data if b)


def file_bytes(num_tokens: int, hidden: int, dtype: str) -> int:
    """Exact size of one sample file: data plus safetensors' JSON header (8-byte aligned).

    The header lists the tensors in the order safetensors writes them (widest dtype
    first, then by name), because the offsets' digit counts change the header length.
    """
    t = num_tokens
    width = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    st = ST_DTYPES[dtype]
    tensors = [("aux_hidden_states", [t, 3 * hidden], st, width),
               ("hidden_state", [t, hidden], st, width),
               ("input_ids", [t], ID_DTYPE, ID_BYTES),
               ("loss_mask", [t], MASK_DTYPE, MASK_BYTES)]
    tensors.sort(key=lambda x: (-x[3], x[0]))
    header: dict[str, Any] = {}
    off = 0
    for name, shape, dt, w in tensors:
        nbytes = w
        for d in shape:
            nbytes *= d
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    n = len(json.dumps(header, separators=(",", ":")))
    n += (-n) % 8
    return 8 + n + off


def clean_temp_files(out_dir: Path, owned_relpaths: set[str]) -> int:
    """Remove temp files left by killed runs for samples this process owns.

    Only owned samples: another rank may be writing its own temp files right now.
    """
    removed = 0
    root = out_dir / SAMPLES_DIR
    if not root.is_dir():
        return 0
    for sub in root.iterdir():
        if not sub.is_dir():
            continue
        for p in sub.iterdir():
            name = p.name
            if not (name.startswith(".") and TMP_MARK in name):
                continue
            final = name[1:name.index(TMP_MARK)]
            if f"{SAMPLES_DIR}/{sub.name}/{final}" in owned_relpaths:
                with contextlib.suppress(OSError):
                    p.unlink()
                    removed += 1
    return removed


class ManifestPart:
    """This rank's append-only manifest part; a torn last line is ignored when merging."""

    def __init__(self, out_dir: Path, tag: str) -> None:
        d = out_dir / PARTS_DIR
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / f"{tag}.jsonl"
        self._fh = self.path.open("a", encoding="utf-8")
        # A kill mid-append leaves a torn last line; end it, or the first line of this run
        # would be glued to it and both lost when merging.
        if self._fh.tell() > 0:
            with self.path.open("rb") as fh:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    self._fh.write("\n")

    def add(self, rid: Any, relpath: str, num_tokens: int, num_supervised: int) -> None:
        line = json.dumps({"id": rid, "file": relpath, "num_tokens": num_tokens,
                           "num_supervised": num_supervised}, ensure_ascii=False)
        self._fh.write(line + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def iter_entries(path: Path) -> Iterator[dict[str, Any]]:
    try:
        fh = path.open("r", encoding="utf-8")
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a kill: its sample is re-entered on resume
            if isinstance(entry, dict) and "id" in entry and "file" in entry:
                yield entry


def read_manifest_keys(out_dir: Path) -> set[str]:
    keys = {str(e["id"]) for e in iter_entries(out_dir / MANIFEST)}
    parts = out_dir / PARTS_DIR
    if parts.is_dir():
        for p in parts.glob("*.jsonl"):
            keys.update(str(e["id"]) for e in iter_entries(p))
    return keys


@contextlib.contextmanager
def _locked(out_dir: Path) -> Iterator[None]:
    with (out_dir / ".manifest.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def merge_manifest(out_dir: Path) -> int:
    """Rebuild manifest.jsonl: one entry per id whose file exists; returns the entry count."""
    with _locked(out_dir):
        merged: dict[str, dict[str, Any]] = {}
        sources = [out_dir / MANIFEST]
        parts = out_dir / PARTS_DIR
        if parts.is_dir():
            sources += sorted(parts.glob("*.jsonl"), key=lambda p: (p.stat().st_mtime, p.name))
        for src in sources:
            for e in iter_entries(src):
                merged[str(e["id"])] = e
        final = {k: e for k, e in merged.items() if (out_dir / str(e["file"])).is_file()}
        with atomic.atomic_file(out_dir / MANIFEST) as fh:
            for e in final.values():
                fh.write((json.dumps(e, ensure_ascii=False) + "\n").encode("utf-8"))
        return len(final)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    atomic.write_json(path, data, indent=2)
