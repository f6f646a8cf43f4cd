"""A sample's own tensors (ids, loss mask) and the dtype names: what every format stores.

Every format writes the same token ids and the same supervised span, in its own dtype;
this is the one place that turns a `tokens.Sample` into torch tensors, so the formats
(and the model backends, for the feature dtype) never import each other for it.
Importing this module is torch-free: torch is imported when a tensor is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from payload.extract.tokens import Sample

# The --dtype and --feature-dtype names (after aliases) and their torch attribute names.
TORCH_DTYPE_NAMES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32",
                     "float8_e4m3fn": "float8_e4m3fn"}


def torch_dtype(name: str) -> Any:
    """`bfloat16` -> torch.bfloat16 (the model's or the stored features' dtype)."""
    import torch

    return getattr(torch, TORCH_DTYPE_NAMES[name])


def ids_tensor(sample: Sample) -> Any:
    """The sample's token ids as int64 [T] (every trainer's id dtype)."""
    import torch

    return torch.frombuffer(sample.input_ids, dtype=torch.int32).to(torch.long)


def mask_tensor(sample: Sample, dtype: Any) -> Any:
    """1 on the supervised spans (each [lo, hi), one per supervised turn), 0 elsewhere."""
    import torch

    t = sample.num_tokens
    mask = torch.zeros(t, dtype=dtype)
    for lo, hi in sample.spans:
        mask[lo:min(hi, t)] = 1
    return mask
