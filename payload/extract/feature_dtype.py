"""How the features are stored (`--feature-dtype`): the model's states cast to a float
dtype, or FP8 with one scale per token, hs-connectors 0.9.0's layout.

FP8 (`float8_e4m3fn`, what speculators reads with `--hidden-states-backend fp8`): each
token gets one float32 scale over all of its stored values (the three aux layers and the
final state, speculators' [4, H]), `scale = max|x| / 448` (at least 1e-12), and each value
is stored as `x / scale` in float8_e4m3fn; the trainer's `FP8Transfer` multiplies back.
The arithmetic is hs_connectors/fp8_utils.py's `quantize_tensor_to_fp8`, step for step in
fp32, so the bytes are those its own vLLM connector writes for the same states (a test
compares them bit for bit). It runs where the states are (the GPU), before the copy to the
host, so half the bytes cross PCIe.

A token's values are all finite exactly when its scale is (an Inf makes the scale Inf, a
NaN makes it NaN, finite values give a finite scale and stored values within ±448), so the
NaN/Inf check of FP8 features is a check of their scales. A float cast is checked after
the cast: float16 overflows (±65504) where the model's bfloat16 did not.

Importing this module is torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from payload.extract.tensors import torch_dtype

FP8 = "float8_e4m3fn"
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
MIN_SCALE = 1e-12  # hs_connectors' clamp: an all-zero token keeps a usable scale
SCALES_KEY = "hidden_states_scales"  # hs_connectors.fp8_utils.SCALES_KEY


@dataclass(frozen=True)
class Stored:
    """A batch's features as they are stored."""

    aux: Any  # [B, T, 3H] in the feature dtype
    final: Any  # [B, T, H]
    scale: Any | None = None  # FP8: [B, T] float32; a stored value times its scale is the state

    def checked(self) -> tuple[Any, ...]:
        """The [B, T, X] tensors whose values are finite exactly when the features are."""
        if self.scale is not None:
            return (self.scale.unsqueeze(-1),)
        return (self.aux, self.final)


def store(aux: Any, final: Any, dtype: str) -> Stored:
    """The model's (aux, final) in the stored form of `dtype` (a --feature-dtype name)."""
    if dtype == FP8:
        return Stored(*quantize(aux, final))
    dt = torch_dtype(dtype)
    return Stored(aux.to(dt), final.to(dt))


def quantize(aux: Any, final: Any) -> tuple[Any, Any, Any]:
    """(aux fp8, final fp8, scale [B, T] fp32), one scale per token over aux and final
    together: hs-connectors' per-token scale over [layers, hidden], without the concat."""
    import torch

    # |x| and max are exact in any float dtype, and so is the cast to fp32: the same amax
    # as hs-connectors' fp32 copy, without a fp32 copy of the whole batch first.
    amax = torch.maximum(aux.abs().amax(-1), final.abs().amax(-1)).to(torch.float32)
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    per = scale.unsqueeze(-1)
    fp8 = torch.float8_e4m3fn
    return (aux.to(torch.float32, copy=True).div_(per).to(fp8),
            final.to(torch.float32, copy=True).div_(per).to(fp8), scale)


def dequantize(values: Any, scale: Any, dtype: Any = None) -> Any:
    """What FP8Transfer hands the trainer: `values.to(dtype) * scale.to(dtype)` (bfloat16
    by default, as hs_connectors' `dequantize_fp8_tensor`); `scale` broadcasts (e.g.
    [T, 1, 1] against [T, 4, H])."""
    import torch

    dt = torch.bfloat16 if dtype is None else dtype
    return values.to(dt) * scale.to(dt)
