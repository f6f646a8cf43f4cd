"""What every format's files share: safetensors headers, temp files, the manifest.

A sample is written to a temp name and renamed (payload.atomic's naming, no fsync per
sample: it would cost more than the write), so a kill -9 leaves a temp file (cleaned at
the next start), never a half file under the final name. `read_header` also checks that
a safetensors file is exactly as long as its header says, which catches a file cut
short by a crash of the machine itself.

Each rank appends to its own manifest part; `merge_manifest` rebuilds `manifest.jsonl`
from every part under an exclusive lock with an atomic rename, keeping one entry per
id whose file exists. Every rank merges when it finishes, so whichever rank finishes
last leaves the complete manifest, without a barrier between ranks. (The speculators
format derives its manifest from its rows instead: see formats/speculators.py.)

No torch at import: the preflight and the formats' planning use these helpers too.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from payload import atomic

PARTS_DIR = "manifest.parts"
MANIFEST = "manifest.jsonl"
# The stored feature dtypes (`--feature-dtype`, after aliases): safetensors codes and widths.
ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float8_e4m3fn": "F8_E4M3"}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
ST_WIDTH = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "U8": 1, "F8_E4M3": 1}
TMP_MARK = atomic.TMP_MARK

TensorSpec = tuple[str, str, list[int]]  # (name, safetensors dtype code, shape)


def id_relpath(key: str, folder: str, suffix: str) -> str:
    """`folder/ab/<sha256(id)[:40]><suffix>`: deterministic from the id alone.

    Any rank of any resumed run finds the same file; hashed so any id is a safe file
    name; fanned out by two hex digits so a million samples do not sit in one folder.
    """
    h = hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]
    return f"{folder}/{h[:2]}/{h}{suffix}"


def write_atomically(final: Path, write: Callable[[Path], None]) -> int:
    """`write(temp)` then rename into place; returns the bytes written."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = atomic.temp_name(final)
    try:
        write(tmp)
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


def header_matches(header: dict[str, Any], want: dict[str, tuple[str, list[int]]]) -> bool:
    """The header names exactly these tensors, with these dtypes and shapes."""
    if set(header) - {"__metadata__"} != set(want):
        return False
    try:
        return all(header[name]["dtype"] == dt and list(header[name]["shape"]) == shape
                   for name, (dt, shape) in want.items())
    except (KeyError, TypeError):
        return False


def read_tensor_bytes(path: Path, header: dict[str, Any], start: int, name: str) -> bytes:
    """One tensor's raw bytes, read straight from the file (no torch needed)."""
    lo, hi = header[name]["data_offsets"]
    with path.open("rb") as fh:
        fh.seek(start + lo)
        return fh.read(hi - lo)


def safetensors_bytes(tensors: Iterable[TensorSpec], metadata: dict[str, str] | None = None,
                      ) -> int:
    """Exact size of a safetensors file: data plus its JSON header (8-byte aligned).

    The header lists the tensors in the order safetensors writes them (widest dtype
    first, then by name), because the offsets' digit counts change the header length.
    """
    specs = sorted(tensors, key=lambda x: (-ST_WIDTH[x[1]], x[0]))
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = metadata
    off = 0
    for name, dt, shape in specs:
        nbytes = ST_WIDTH[dt]
        for d in shape:
            nbytes *= d
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    n = len(json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    n += (-n) % 8
    return 8 + n + off


# safetensors' save_file writes `<dir>/.tmpXXXXXX` (6 random characters) beside its
# target and renames it; a kill -9 inside that write leaves it, under a name that says
# nothing about which sample or process it was.
_LIB_TMP = re.compile(r"^\.tmp[A-Za-z0-9_]{6}$")


def open_paths() -> set[str]:
    """Every path some process on this machine holds open (read from /proc/*/fd)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                for fd in os.scandir(f"/proc/{entry.name}/fd"):
                    with contextlib.suppress(OSError):
                        found.add(os.readlink(fd.path))
    return found


def clean_temp_files(out_dir: Path, owned_relpaths: set[str]) -> int:
    """Remove temp files left by killed runs for samples this process owns.

    Only owned samples: another rank may be writing its own temp files right now. A
    library temp file (`.tmpXXXXXX`) names no sample: it is removed when no process on
    this machine has it open (a live writer always has).
    """
    removed = 0
    folders = {str(Path(rel).parent) for rel in owned_relpaths}
    lib_temps: list[Path] = []
    for folder in folders:
        d = out_dir / folder
        if not d.is_dir():
            continue
        for p in d.iterdir():
            name = p.name
            if _LIB_TMP.match(name):
                lib_temps.append(p)
                continue
            if not (name.startswith(".") and TMP_MARK in name):
                continue
            final = name[1:name.index(TMP_MARK)]
            if f"{folder}/{final}" in owned_relpaths:
                with contextlib.suppress(OSError):
                    p.unlink()
                    removed += 1
    if lib_temps:
        busy = open_paths()
        for p in lib_temps:
            if str(p.resolve()) not in busy:
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
        write_manifest(out_dir, final.values())
        return len(final)


def write_manifest(out_dir: Path, entries: Iterable[dict[str, Any]]) -> None:
    with atomic.atomic_file(out_dir / MANIFEST) as fh:
        for e in entries:
            fh.write((json.dumps(e, ensure_ascii=False) + "\n").encode("utf-8"))


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    atomic.write_json(path, data, indent=2)
