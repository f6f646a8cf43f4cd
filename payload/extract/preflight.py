"""Disk preflight: the exact bytes the features need, against the free space, before any work.

Per token a sample stores 4 x H values (3 aux layers + the final state) in the model
dtype, plus an int64 id and a uint8 mask: for Kimi-K2.5 (H=7168, bf16) that is 57 KB a
token, so 200M tokens is 11.5 TB. Peers find that out when the disk fills halfway;
here the run refuses up front with the numbers, unless --force.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from payload.extract.writer import file_bytes


class DiskTooSmall(Exception):
    """The estimate exceeds the free space; the message carries the numbers and the fixes."""


@dataclass(frozen=True)
class Estimate:
    samples: int
    tokens: int
    bytes: int
    per_token: int  # the theoretical 4*H*dtype + 9, for reports


def estimate(lengths: Iterable[int], hidden: int, dtype: str, block: int = 4096) -> Estimate:
    """Σ exact file sizes, each rounded up to the filesystem block it will occupy."""
    width = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    n = tokens = total = 0
    for t in lengths:
        size = file_bytes(t, hidden, dtype)
        total += -(-size // block) * block
        tokens += t
        n += 1
    return Estimate(n, tokens, total, 4 * hidden * width + 9)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


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
            f"{est.per_token} B/token -> {human(est.bytes)} for this rank"
            + (f", ~{human(need)} for the {sharers} ranks on this disk" if sharers > 1 else "")
            + f"; free {human(have)} on {out_dir} (keeping {human(reserve)} in reserve)")
    if need + reserve > have:
        msg = (f"{line}\nrefusing: need {need} bytes + reserve {reserve} > free {have} bytes "
               f"(short by {human(need + reserve - have)}). Free space, point --output-dir at "
               "a bigger disk, lower --max-length, split the input with --shard, or pass "
               "--force to run anyway.")
        if not force:
            raise DiskTooSmall(msg)
        return msg + "\n--force: running anyway"
    return line
