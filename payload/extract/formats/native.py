"""handoff's own layout: one safetensors file per sample, post-norm final state.

`samples/ab/<sha>.safetensors`: `input_ids` int64 [T], `loss_mask` uint8 [T],
`aux_hidden_states` [T, 3H] (the three layers, ascending), `hidden_state` [T, H];
listed in manifest.jsonl. Aux index N is HF's `output_hidden_states[N]` entry (the
post-norm state), as docs/extractor.md documents for this format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from payload.extract.formats.base import FilePerSample
from payload.extract.tensors import ids_tensor, mask_tensor
from payload.extract.tokens import Sample
from payload.extract.writer import (
    DTYPE_BYTES,
    ST_DTYPES,
    header_matches,
    read_header,
    read_tensor_bytes,
    safetensors_bytes,
    write_atomically,
)


class Native(FilePerSample):
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

    def write(self, sample: Sample, aux: Any, final: Any, scale: Any = None) -> int:
        import torch

        if scale is not None:
            raise RuntimeError("native files hold no FP8 scales (config refuses fp8 here)")
        from safetensors.torch import save_file

        tensors = {"input_ids": ids_tensor(sample), "loss_mask": mask_tensor(sample, torch.uint8),
                   "aux_hidden_states": aux, "hidden_state": final}
        return write_atomically(self.out / self.relpath(sample.key),
                                lambda tmp: save_file(tensors, str(tmp)))
