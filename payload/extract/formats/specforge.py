"""SpecForge 0.2.0's offline layout: one torch.save `.ckpt` per sample, post-norm.

`samples/ab/<sha>.ckpt`: `input_ids`, `loss_mask` int64 [T], `aux_hidden_state`
[1, T, 3H], `hidden_state` [1, T, H]; meta.json gets `eagle_aux_hidden_state_layer_ids`
(SpecForge counts layers from 0: HF index k is its id k-1). Its target head is the
lm_head alone, so the final state stored is the post-norm one.

`--compress gzip`: `samples/ab/<sha>.ckpt.gz`, the same torch.save archive as a gzip
stream, which SpecForge's `load_feature_file` reads (`gzip.open`, then `torch.load` of the
bytes). The file ends with a second, empty gzip member whose comment says what the file
holds (tokens, supervised tokens, dtype, width, and where the first member ends and how
long it is uncompressed): gzip readers see only the archive (an empty member adds no
bytes), and a resumed run checks a file from its last bytes, as it checks a `.ckpt` from
its zip directory, instead of decompressing every file again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from payload.extract.formats.base import FilePerSample
from payload.extract.tensors import ids_tensor, mask_tensor, torch_dtype
from payload.extract.tokens import Sample
from payload.extract.writer import DTYPE_BYTES, write_atomically

# zlib level 1: measured on bf16 features (BENCHMARKS.md, "Features: FP8 and gzip"), the
# higher levels save under a point more and write several times slower.
GZIP_LEVEL = 1
TAIL_TAG = "handoff-specforge-ckpt-gz/1"
# the describing member: gzip magic, deflate, FLG=FCOMMENT, mtime 0, XFL 0, OS unknown ...
_TAIL_HEADER = b"\x1f\x8b\x08\x10\x00\x00\x00\x00\x00\xff"
# ... the comment, its NUL, then an empty final deflate block, CRC32 0 and ISIZE 0
_TAIL_END = b"\x03\x00" + b"\x00" * 8
_TAIL_READ = 1024  # bytes read from the end of a file to find it (the comment is ~200)


def tail_member(info: dict[str, Any]) -> bytes:
    """An empty gzip member whose comment is `info` as JSON (ASCII: no 0x1f, no NUL)."""
    comment = json.dumps(info, separators=(",", ":"), sort_keys=True).encode("ascii")
    return _TAIL_HEADER + comment + b"\x00" + _TAIL_END


def read_tail(path: Path) -> tuple[dict[str, Any], int] | None:
    """(the describing member's JSON, where that member starts) when `path` is a gzip
    file that ends with one whose offsets agree with the file: the first member ends
    where the comment says, with the uncompressed length it says (gzip's ISIZE)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            magic = fh.read(3)
            fh.seek(max(0, size - _TAIL_READ))
            buf = fh.read()
    except OSError:
        return None
    at = buf.rfind(_TAIL_HEADER)
    if magic != b"\x1f\x8b\x08" or at < 4 or not buf.endswith(_TAIL_END):
        return None
    end = buf.find(b"\x00", at + len(_TAIL_HEADER))
    if end < 0 or end + 1 + len(_TAIL_END) != len(buf):
        return None
    try:
        info = json.loads(buf[at + len(_TAIL_HEADER):end].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    start = size - (len(buf) - at)
    if not isinstance(info, dict) or info.get("handoff") != TAIL_TAG:
        return None
    isize = int.from_bytes(buf[at - 4:at], "little")
    if info.get("csize") != start or not isinstance(info.get("isize"), int) \
            or info["isize"] % (1 << 32) != isize:
        return None
    return info, start


def zlib_bound(n: int) -> int:
    """zlib's compressBound: the most deflate can turn n bytes into (incompressible data)."""
    return n + (n >> 12) + (n >> 14) + (n >> 25) + 13


class SpecForge(FilePerSample):
    """SpecForge 0.2.0's offline features: what its OfflineManifestReader finds under
    `data.hidden_states_path` (every `*.ckpt`, walked and sorted) and opens with
    `torch.load(mmap=True)`; its normalizer maps `aux_hidden_state` to the draft's input
    and `hidden_state` to the target, which its TargetHead turns into logits with the
    lm_head alone: so the final state is the post-norm one."""

    name = "specforge"
    suffix = ".ckpt"
    # torch.save's zip container beyond the raw tensor bytes: ~2.3 KB measured (pickle,
    # records aligned to 64 bytes, central directory); a generous bound for the preflight.
    CKPT_OVERHEAD = 4096
    GZ_OVERHEAD = 10 + 8 + 512  # gzip header and trailer, the describing member

    def __init__(self, out: Path, hidden: int, dtype: str, compress: str | None = None) -> None:
        super().__init__(out, hidden, dtype, compress)
        if compress not in (None, "gzip"):
            raise RuntimeError(f"specforge: unknown compression {compress!r}")
        self.gzip = compress == "gzip"
        self.suffix = ".ckpt.gz" if self.gzip else ".ckpt"

    def _shapes(self, t: int) -> dict[str, tuple[Any, list[int]]]:
        import torch

        dt = torch_dtype(self.dtype)
        return {"input_ids": (torch.int64, [t]), "loss_mask": (torch.int64, [t]),
                "aux_hidden_state": (dt, [1, t, 3 * self.hidden]),
                "hidden_state": (dt, [1, t, self.hidden])}

    def sample_bytes(self, sample: Sample) -> int:
        """The `.ckpt`'s bound; gzip: what deflate makes of it at worst (its saving is not
        known before the features are: the preflight counts none)."""
        raw = sample.num_tokens * (self.bytes_per_token()) + self.CKPT_OVERHEAD
        return zlib_bound(raw) + self.GZ_OVERHEAD if self.gzip else raw

    def bytes_per_token(self) -> int:
        return 4 * self.hidden * DTYPE_BYTES[self.dtype] + 8 + 8

    def meta(self, layers: tuple[int, ...], vocab_size: int) -> dict[str, Any]:
        # SpecForge captures "layer id i" as the output of decoder layer i, which is HF's
        # output_hidden_states index i+1: the draft config needs ids k-1.
        return {"eagle_aux_hidden_state_layer_ids": [k - 1 for k in layers],
                "target_vocab_size": vocab_size}

    def keys(self) -> dict[str, str]:
        keys = {"input_ids": "int64 [T]", "loss_mask": "int64 [T]",
                "aux_hidden_state": f"{self.dtype} [1, T, 3H] (layers in order)",
                "hidden_state": f"{self.dtype} [1, T, H] (the final state, see final_state)"}
        if self.gzip:
            keys["file"] = ("samples/ab/<sha>.ckpt.gz: the torch.save archive as a gzip "
                            "stream, then an empty gzip member describing it")
        return keys

    def check(self, path: Path) -> tuple[int, int] | None:
        return self._check_gz(path) if self.gzip else self._check_ckpt(path)

    def _check_gz(self, path: Path) -> tuple[int, int] | None:
        found = read_tail(path)
        if found is None:
            return None
        info = found[0]
        t, sup = info.get("tokens"), info.get("supervised")
        if (info.get("dtype") != self.dtype or info.get("hidden") != self.hidden
                or not isinstance(t, int) or not isinstance(sup, int) or not 0 <= sup <= t
                or t <= 0):
            return None
        return t, sup

    def _check_ckpt(self, path: Path) -> tuple[int, int] | None:
        import torch

        try:
            # mmap: only the zip directory and the pickle are read, not the tensor pages
            data = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
        except Exception:  # a truncated zip, a half-written pickle: not done
            return None
        if not isinstance(data, dict) or "input_ids" not in data:
            return None
        try:
            t = int(data["input_ids"].shape[0])
            want = self._shapes(t)
            if t <= 0 or set(data) != set(want):
                return None
            for name, (dt, shape) in want.items():
                if data[name].dtype != dt or list(data[name].shape) != shape:
                    return None
            return t, int(data["loss_mask"].sum())
        except (AttributeError, TypeError, IndexError):
            return None

    def write(self, sample: Sample, aux: Any, final: Any, scale: Any = None) -> int:
        import torch

        if scale is not None:
            raise RuntimeError("specforge files hold no FP8 scales (config refuses fp8 here)")
        # clone(): torch.save writes a view's WHOLE storage, here the batch's [B, T, 3H]
        tensors = {"input_ids": ids_tensor(sample),
                   "loss_mask": mask_tensor(sample, torch.int64),
                   "aux_hidden_state": aux.unsqueeze(0).clone(),
                   "hidden_state": final.unsqueeze(0).clone()}

        def save(tmp: Path) -> None:
            with tmp.open("wb") as fh:  # a file object: the archive is named "archive"
                torch.save(tensors, fh)

        def save_gz(tmp: Path) -> None:
            import gzip

            with tmp.open("wb") as fh:
                # no file name and mtime 0 in the header: the same features, the same bytes
                with gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0,
                                   compresslevel=GZIP_LEVEL) as gz:
                    torch.save(tensors, gz)  # type: ignore[arg-type]  # a binary file
                    isize = gz.tell()  # the uncompressed length
                fh.write(tail_member({
                    "handoff": TAIL_TAG, "tokens": sample.num_tokens,
                    "supervised": int(tensors["loss_mask"].sum()), "dtype": self.dtype,
                    "hidden": self.hidden, "isize": isize, "csize": fh.tell()}))

        return write_atomically(self.out / self.relpath(sample.key),
                                save_gz if self.gzip else save)
