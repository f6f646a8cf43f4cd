"""The output formats: one pipeline, each trainer's own layout written directly.

| format | module | per sample | final state | also |
|---|---|---|---|---|
| native | native.py | `samples/ab/<sha>.safetensors`: `input_ids` int64 [T], `loss_mask` uint8 [T], `aux_hidden_states` [T,3H], `hidden_state` [T,H] | post-norm | manifest.jsonl |
| specforge | specforge.py | `samples/ab/<sha>.ckpt` (torch.save, SpecForge 0.2 offline; `.ckpt.gz` with `--compress gzip`): `input_ids`, `loss_mask` int64 [T], `aux_hidden_state` [1,T,3H], `hidden_state` [1,T,H] | post-norm (its target head is the lm_head alone) | meta `eagle_aux_hidden_state_layer_ids` (HF index k -> k-1) |
| speculators | speculators.py (+ speculators_dataset.py) | `hidden_states/hs_{row}.safetensors`: `token_ids` int64 [T], `hidden_states` [T,4,H] (3 aux layers, then the final state; `--feature-dtype fp8`: float8_e4m3fn + `hidden_states_scales` float32 [T,1,1]) + an HF datasets dir (`input_ids`, `loss_mask` int64, `seq_len`) | PRE-norm (its trainer applies the target's norm) | `token_freq.pt`, meta `target_layer_ids`, `hidden_states_backend` |

base.py holds the `Format` interface and the tables config.py reads; the format modules
import base.py and never each other or this package. Importing the package is
torch-free.
"""

from __future__ import annotations

from pathlib import Path

from payload.extract.formats.base import (
    FINAL_STATES,
    FORMATS,
    NEEDS_FINAL_STATE,
    POSTNORM,
    PRENORM,
    FilePerSample,
    Format,
)
from payload.extract.formats.native import Native
from payload.extract.formats.specforge import SpecForge
from payload.extract.formats.speculators import Speculators

__all__ = ["FINAL_STATES", "FORMATS", "NEEDS_FINAL_STATE", "POSTNORM", "PRENORM",
           "FilePerSample", "Format", "Native", "SpecForge", "Speculators", "make"]

_CLASSES: dict[str, type[Format]] = {"native": Native, "specforge": SpecForge,
                                     "speculators": Speculators}


def make(name: str, out: Path, hidden: int, dtype: str, compress: str | None = None) -> Format:
    """The format `--format name` writes, for this output dir, width, feature dtype and
    compression (config.py has refused a combination the format does not write)."""
    return _CLASSES[name](out, hidden, dtype, compress)
