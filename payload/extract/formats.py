"""The output formats: one pipeline, each trainer's own layout written directly.

The pipeline (read, own, resume, preflight, forward, write) is the same for every
format; a `Format` decides only what a sample's file is called and holds, how a file
found on resume is checked, what the disk preflight counts and what is left to do
when a rank ends. No converter runs afterwards: for Kimi-K2.5 (H=7168) a second copy
of the features would be terabytes on a disk that is already the limit.

| format | per sample | final state | also |
|---|---|---|---|
| native | `samples/ab/<sha>.safetensors`: `input_ids` int64 [T], `loss_mask` uint8 [T], `aux_hidden_states` [T,3H], `hidden_state` [T,H] | post-norm | manifest.jsonl |
| specforge | `samples/ab/<sha>.ckpt` (torch.save, SpecForge 0.2 offline): `input_ids`, `loss_mask` int64 [T], `aux_hidden_state` [1,T,3H], `hidden_state` [1,T,H] | post-norm (its target head is the lm_head alone) | meta `eagle_aux_hidden_state_layer_ids` (HF index k -> k-1) |
| speculators | `hidden_states/hs_{row}.safetensors`: `token_ids` int64 [T], `hidden_states` [T,4,H] (3 aux layers, then the final state) + an HF datasets dir (`input_ids`, `loss_mask` int64, `seq_len`) | PRE-norm (its trainer applies the target's norm) | `token_freq.pt`, meta `target_layer_ids` |

Importing this module is torch-free (config.py reads its tables); torch is imported
where a sample is written or a `.ckpt` checked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from payload.extract.writer import (
    DTYPE_BYTES,
    ST_DTYPES,
    ManifestPart,
    clean_temp_files,
    header_matches,
    id_relpath,
    merge_manifest,
    read_header,
    read_manifest_keys,
    read_tensor_bytes,
    safetensors_bytes,
    write_atomically,
)

if TYPE_CHECKING:
    from payload.extract.tokens import Conversation, Sample

PRENORM, POSTNORM = "prenorm", "postnorm"
FINAL_STATES = (PRENORM, POSTNORM)
FORMATS = ("native", "specforge", "speculators")
# The final state each trainer computes its teacher logits from; `--final-state`'s default.
NEEDS_FINAL_STATE = {"native": POSTNORM, "specforge": POSTNORM, "speculators": PRENORM}
SAMPLES_DIR = "samples"


def ids_tensor(sample: Sample) -> Any:
    import torch

    return torch.frombuffer(sample.input_ids, dtype=torch.int32).to(torch.long)


def mask_tensor(sample: Sample, dtype: Any) -> Any:
    """1 on the supervised span [prompt_len, sup_end), 0 elsewhere."""
    import torch

    t = sample.num_tokens
    mask = torch.zeros(t, dtype=dtype)
    mask[sample.prompt_len:min(sample.sup_end, t)] = 1
    return mask


class Format(ABC):
    """One output layout. One instance per run, used by the pipeline's stages in order:
    `open` → `done` per owned id → `clean_temp_files` → `write`/`record` per sample → `close`.
    """

    name: str
    # What aux index N (the last layer) holds: HF's post-norm tuple entry (native) or the
    # last decoder layer's raw output, as the trainers' own capture stores it.
    raw_last_layer: bool = True

    def __init__(self, out: Path, hidden: int, dtype: str) -> None:
        self.out = out
        self.hidden = hidden
        self.dtype = dtype

    # -- planning (the preflight; no torch) --------------------------------------------
    @abstractmethod
    def sample_bytes(self, sample: Sample) -> int:
        """Bytes of the sample's own file (the preflight rounds it up to a block)."""

    def shared_bytes(self, sample: Sample) -> int:
        """Bytes the sample adds to files shared by all samples (a dataset's columns)."""
        return 0

    def fixed_bytes(self, vocab_size: int) -> int:
        """Bytes of the shared files themselves, whatever the samples (headers, maps)."""
        return 0

    @abstractmethod
    def bytes_per_token(self) -> int:
        """The theoretical bytes a token costs on disk (features + ids + mask)."""

    def meta(self, layers: tuple[int, ...], vocab_size: int) -> dict[str, Any]:
        """Keys this format adds to meta.json (trainer-side settings and conventions)."""
        return {}

    @abstractmethod
    def keys(self) -> dict[str, str]:
        """What each stored tensor is, for meta.json."""

    # -- the run -----------------------------------------------------------------------
    @abstractmethod
    def open(self, tag: str, *, dry: bool) -> None:
        """Before the resume checks; `dry` (--preflight-only) must write nothing."""

    @abstractmethod
    def done(self, conv: Conversation) -> bool:
        """Whether this id's sample is already on disk, complete (resume by id)."""

    @abstractmethod
    def relpath(self, key: str) -> str:
        """Where a new sample for this id is written (relative to the output dir)."""

    def clean_temp_files(self, keys: list[str]) -> int:
        return clean_temp_files(self.out, {self.relpath(k) for k in keys})

    @abstractmethod
    def write(self, sample: Sample, aux: Any, final: Any) -> int:
        """Write one sample (aux [T, 3H], final [T, H], CPU); returns its bytes.

        Runs on the writer threads, several at once (distinct samples).
        """

    @abstractmethod
    def record(self, sample: Sample) -> None:
        """After `write`, under the pipeline's lock: list the sample."""

    @abstractmethod
    def close(self) -> str | None:
        """When this rank ends (finished, stopped, failed): settle what lists the
        samples; returns a line for the log, if there is something to say."""


class _FilePerSample(Format):
    """native and specforge: one file per id at a path derived from the id; each rank
    lists its samples in its manifest part, merged into manifest.jsonl at the end."""

    suffix = ""

    def __init__(self, out: Path, hidden: int, dtype: str) -> None:
        super().__init__(out, hidden, dtype)
        self._part: ManifestPart | None = None
        self._listed: set[str] = set()

    def relpath(self, key: str) -> str:
        return id_relpath(key, SAMPLES_DIR, self.suffix)

    def open(self, tag: str, *, dry: bool) -> None:
        self._listed = read_manifest_keys(self.out)
        self._part = None if dry else ManifestPart(self.out, tag)

    @abstractmethod
    def check(self, path: Path) -> tuple[int, int] | None:
        """(tokens, supervised tokens) when `path` is a complete file of this run's shape."""

    def done(self, conv: Conversation) -> bool:
        rel = self.relpath(conv.key)
        path = self.out / rel
        found = self.check(path) if path.exists() else None
        if found is None:
            return False
        if self._part is not None and conv.key not in self._listed:
            self._part.add(conv.id, rel, *found)  # renamed, killed before its manifest line
        return True

    def record(self, sample: Sample) -> None:
        assert self._part is not None, "write() in a dry run"
        self._part.add(sample.id, self.relpath(sample.key), sample.num_tokens,
                       sample.num_supervised)

    def close(self) -> str | None:
        if self._part is None:
            return None
        self._part.close()
        merge_manifest(self.out)
        return None


class Native(_FilePerSample):
    name = "native"
    raw_last_layer = False  # index N is HF's post-norm tuple entry, as documented
    suffix = ".safetensors"
    ID_DTYPE, MASK_DTYPE = "I64", "U8"

    def _specs(self, t: int) -> list[tuple[str, str, list[int]]]:
        st = ST_DTYPES[self.dtype]
        return [("input_ids", self.ID_DTYPE, [t]), ("loss_mask", self.MASK_DTYPE, [t]),
                ("aux_hidden_states", st, [t, 3 * self.hidden]),
                ("hidden_state", st, [t, self.hidden])]

    def sample_bytes(self, sample: Sample) -> int:
        return safetensors_bytes(self._specs(sample.num_tokens))

    def bytes_per_token(self) -> int:
        return 4 * self.hidden * DTYPE_BYTES[self.dtype] + 8 + 1

    def keys(self) -> dict[str, str]:
        return {"input_ids": "int64 [T]", "loss_mask": "uint8 [T]",
                "aux_hidden_states": f"{self.dtype} [T, 3H] (layers in order)",
                "hidden_state": f"{self.dtype} [T, H] (the final state, see final_state)"}

    def check(self, path: Path) -> tuple[int, int] | None:
        parsed = read_header(path)
        if parsed is None:
            return None
        header, start = parsed
        try:
            t = int(header["input_ids"]["shape"][0])
        except (KeyError, TypeError, ValueError, IndexError):
            return None
        if t <= 0 or not header_matches(header, {n: (d, s) for n, d, s in self._specs(t)}):
            return None
        mask = read_tensor_bytes(path, header, start, "loss_mask")
        return t, sum(1 for b in mask if b)

    def write(self, sample: Sample, aux: Any, final: Any) -> int:
        import torch
        from safetensors.torch import save_file

        tensors = {"input_ids": ids_tensor(sample), "loss_mask": mask_tensor(sample, torch.uint8),
                   "aux_hidden_states": aux, "hidden_state": final}
        return write_atomically(self.out / self.relpath(sample.key),
                                lambda tmp: save_file(tensors, str(tmp)))


class SpecForge(_FilePerSample):
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

    def _shapes(self, t: int) -> dict[str, tuple[Any, list[int]]]:
        import torch

        dt = {"bfloat16": torch.bfloat16, "float16": torch.float16,
              "float32": torch.float32}[self.dtype]
        return {"input_ids": (torch.int64, [t]), "loss_mask": (torch.int64, [t]),
                "aux_hidden_state": (dt, [1, t, 3 * self.hidden]),
                "hidden_state": (dt, [1, t, self.hidden])}

    def sample_bytes(self, sample: Sample) -> int:
        return sample.num_tokens * (self.bytes_per_token()) + self.CKPT_OVERHEAD

    def bytes_per_token(self) -> int:
        return 4 * self.hidden * DTYPE_BYTES[self.dtype] + 8 + 8

    def meta(self, layers: tuple[int, ...], vocab_size: int) -> dict[str, Any]:
        # SpecForge captures "layer id i" as the output of decoder layer i, which is HF's
        # output_hidden_states index i+1: the draft config needs ids k-1.
        return {"eagle_aux_hidden_state_layer_ids": [k - 1 for k in layers],
                "target_vocab_size": vocab_size}

    def keys(self) -> dict[str, str]:
        return {"input_ids": "int64 [T]", "loss_mask": "int64 [T]",
                "aux_hidden_state": f"{self.dtype} [1, T, 3H] (layers in order)",
                "hidden_state": f"{self.dtype} [1, T, H] (the final state, see final_state)"}

    def check(self, path: Path) -> tuple[int, int] | None:
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

    def write(self, sample: Sample, aux: Any, final: Any) -> int:
        import torch

        # clone(): torch.save writes a view's WHOLE storage, here the batch's [B, T, 3H]
        tensors = {"input_ids": ids_tensor(sample),
                   "loss_mask": mask_tensor(sample, torch.int64),
                   "aux_hidden_state": aux.unsqueeze(0).clone(),
                   "hidden_state": final.unsqueeze(0).clone()}

        def save(tmp: Path) -> None:
            with tmp.open("wb") as fh:  # a file object: the archive is named "archive"
                torch.save(tensors, fh)

        return write_atomically(self.out / self.relpath(sample.key), save)


class Speculators(Format):
    """speculators 0.9.0's offline data: see rows.py for the rows and the dataset."""

    name = "speculators"

    def __init__(self, out: Path, hidden: int, dtype: str) -> None:
        from payload.extract.rows import RowStore

        super().__init__(out, hidden, dtype)
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
        return 4 * self.hidden * DTYPE_BYTES[self.dtype] + 8 + 16

    def meta(self, layers: tuple[int, ...], vocab_size: int) -> dict[str, Any]:
        # vLLM (speculators' capture) numbers layers as HF's output_hidden_states does;
        # the trainer's --target-layer-ids are the three aux ids, the 4th slot is implicit.
        return {"target_layer_ids": list(layers), "target_vocab_size": vocab_size}

    def keys(self) -> dict[str, str]:
        return {"token_ids": "int64 [T] (hidden_states/hs_{row}.safetensors)",
                "hidden_states": f"{self.dtype} [T, 4, H]: the 3 aux layers, then the final "
                                 "state (see final_state)",
                "dataset": "input_ids int64 [T], loss_mask int64 [T], seq_len (row = hs_{row})"}

    def open(self, tag: str, *, dry: bool) -> None:
        self.rows.open(dry=dry)

    def done(self, conv: Conversation) -> bool:
        return self.rows.done(conv.key)

    def write(self, sample: Sample, aux: Any, final: Any) -> int:
        return self.rows.write_pending(sample, aux, final)

    def record(self, sample: Sample) -> None:
        """Nothing to list yet: the pending file describes itself; rows come at close."""

    def close(self) -> str | None:
        return self.rows.close()


_CLASSES: dict[str, type[Format]] = {"native": Native, "specforge": SpecForge,
                                     "speculators": Speculators}


def make(name: str, out: Path, hidden: int, dtype: str) -> Format:
    return _CLASSES[name](out, hidden, dtype)
