"""SpecForge 0.2.0's offline layout: one torch.save `.ckpt` per sample, post-norm.

`samples/ab/<sha>.ckpt`: `input_ids`, `loss_mask` int64 [T], `aux_hidden_state`
[1, T, 3H], `hidden_state` [1, T, H]; meta.json gets `eagle_aux_hidden_state_layer_ids`
(SpecForge counts layers from 0: HF index k is its id k-1). Its target head is the
lm_head alone, so the final state stored is the post-norm one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from payload.extract.formats.base import FilePerSample
from payload.extract.tensors import ids_tensor, mask_tensor, torch_dtype
from payload.extract.tokens import Sample
from payload.extract.writer import DTYPE_BYTES, write_atomically


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

    def _shapes(self, t: int) -> dict[str, tuple[Any, list[int]]]:
        import torch

        dt = torch_dtype(self.dtype)
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
