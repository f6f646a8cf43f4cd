"""Disk preflight: the bytes the features need, against the free space, before any work.

Per token a sample stores 4 x H values (3 aux layers + the final state) in the model
dtype, plus its id and mask (9 to 24 bytes, by format): for Kimi-K2.5 (H=7168, bf16)
that is 57 KB a token, so 200M tokens is 11.5 TB. Peers find that out when the disk
fills halfway; here the run refuses up front with the numbers, unless --force. The
format gives each sample's file size (exact for safetensors, a bound for torch.save)
and what it adds to shared files (speculators' dataset columns).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from payload import units
from payload.errors import UsageError
from payload.extract.formats.base import Format
from payload.extract.tokens import Sample


class DiskTooSmall(UsageError):
    """The estimate exceeds the free space; the message carries the numbers and the fixes
    (exit 2: nothing was done)."""


@dataclass(frozen=True)
class Estimate:
    samples: int
    tokens: int
    bytes: int
    per_token: int  # the format's theoretical bytes a token (4*H*dtype + ids + mask)


def estimate(samples: Iterable[Sample], fmt: Format, vocab_size: int = 0,
             block: int = 4096) -> Estimate:
    """Σ file sizes, each rounded up to the filesystem block it will occupy, plus the
    bytes the samples add to shared files, plus those files' own overhead."""
    n = tokens = total = 0
    for s in samples:
        size = fmt.sample_bytes(s)
        total += -(-size // block) * block + fmt.shared_bytes(s)
        tokens += s.num_tokens
        n += 1
    if n:
        total += fmt.fixed_bytes(vocab_size)
    return Estimate(n, tokens, total, fmt.bytes_per_token())


def existing(path: Path) -> Path:
    """The nearest existing ancestor: where a not-yet-created output dir will live."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def check(est: Estimate, out_dir: Path, *, reserve: int, sharers: int = 1, force: bool,
          free: Callable[[Path], int] = free_bytes) -> str:
    """Raise DiskTooSmall unless `sharers` x estimate + reserve fits; returns a summary line.

    `sharers` is the number of ranks writing to this disk at once: each knows only its own
    share, and the id hash spreads tokens evenly, so the node needs about sharers x own.
    """
    need = est.bytes * sharers
    have = free(out_dir)
    line = (f"disk preflight: {est.samples} samples, {est.tokens} tokens x "
            f"{est.per_token} B/token -> {units.size(est.bytes)} for this rank"
            + (f", ~{units.size(need)} for the {sharers} ranks on this disk" if sharers > 1 else "")
            + f"; free {units.size(have)} on {out_dir} (keeping {units.size(reserve)} in reserve)")
    if need + reserve > have:
        msg = (f"{line}\nrefusing: need {need} bytes + reserve {reserve} > free {have} bytes "
               f"(short by {units.size(need + reserve - have)}). Free space, point --output-dir at "
               "a bigger disk, lower --max-length, split the input with --shard, or pass "
               "--force to run anyway.")
        if not force:
            raise DiskTooSmall(msg)
        return msg + "\n--force: running anyway"
    return line
