"""Token-budget batches: sorted by length, right padding, an attention mask.

`--batch-tokens` counts PADDED tokens (rows x longest row), because that is what the
GPU computes and holds. Sorting by length keeps padding small. Batches go longest
first so an out-of-memory shows up in the first minute, not after hours.
Right padding with explicit position ids 0..T-1 keeps every real token's position and
causal context exactly what it is alone, so batched features equal single-sample ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from payload.extract.tokens import Sample


def plan_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices grouped so that rows x longest <= budget; a sample over budget runs alone."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        n = lengths[i]
        if cur and max(cur_max, n) * (len(cur) + 1) > budget:
            batches.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, n)
    if cur:
        batches.append(cur)
    return batches


@dataclass
class Batch:
    samples: list[Sample]
    input_ids: torch.Tensor  # [B, T] int64, right-padded
    attention_mask: torch.Tensor  # [B, T] int64, 1 on real tokens
    position_ids: torch.Tensor  # [B, T] int64, 0..T-1 on every row

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def real_tokens(self) -> int:
        return sum(s.num_tokens for s in self.samples)


def collate(samples: list[Sample], pad_id: int) -> Batch:
    width = max(s.num_tokens for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for row, s in enumerate(samples):
        n = s.num_tokens
        ids[row, :n] = torch.frombuffer(s.input_ids, dtype=torch.int32).to(torch.long)
        mask[row, :n] = 1
    pos = torch.arange(width, dtype=torch.long).unsqueeze(0).expand(len(samples), -1)
    if torch.cuda.is_available():  # pinned host memory lets the H2D copy run asynchronously
        ids, mask = ids.pin_memory(), mask.pin_memory()
    return Batch(samples, ids, mask, pos.contiguous())
