"""Writing a batch's samples: the NaN/Inf check of what is stored, and the writer threads
that overlap the device's next batch.

Each batch's samples are written on two threads while the device computes the next one;
at most MAX_PENDING_BATCHES batches wait for their writes (bounds host memory). What a
writer needs of the run is `RunLike`: the format, the counters, their lock, the error log.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from payload.extract.feature_dtype import Stored
from payload.extract.formats import Format
from payload.extract.status import ErrorLog, Stats

MAX_PENDING_BATCHES = 3  # batches whose writes may lag behind the GPU (bounds host memory)


class RunLike(Protocol):
    fmt: Format
    stats: Stats
    errors: ErrorLog
    lock: threading.Lock


def finite_rows(run: RunLike, progress: Any, batch: Any, stored: Stored) -> list[bool]:
    """Per row: no NaN/Inf on a real token of what is stored (the cast features, or the
    FP8 scales: see feature_dtype.py); padding is never stored, so never checked. A bad
    row fails its sample, which is reported and not written."""
    import torch

    parts = stored.checked()
    valid = batch.attention_mask.to(parts[0].device).bool()
    # A row's float64 sum is finite exactly when each of its values is: NaN and Inf carry
    # through (Inf - Inf is NaN), and no float16/bfloat16/float32 values can add up to
    # float64's overflow. One reduction per row instead of a bool per value: 2.5x less CPU,
    # which on a CPU engine is the engine's own cores.
    rows = sum(p.sum(-1, dtype=torch.float64) for p in parts)
    ok: list[bool] = (torch.isfinite(rows) | ~valid).all(-1).tolist()
    for i, good in enumerate(ok):
        if not good:
            s = batch.samples[i]
            with run.lock:
                run.stats.failed_nonfinite += 1
                progress.update(failed=1)
            run.errors.add(s.id, None, "nonfinite",
                           f"id {s.key}: NaN or Inf in the features; not written "
                           "(float16 overflows at 65504: use bfloat16 for --dtype and "
                           "--feature-dtype)")
    return ok


class BatchWriter:
    """Writes each batch's samples on two threads while the device computes the next
    batch; at most MAX_PENDING_BATCHES wait for their writes (bounds host memory)."""

    def __init__(self, run: RunLike, progress: Any) -> None:
        self.run = run
        self.progress = progress
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="extract-write")
        self.pending: deque[Future[None]] = deque()

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is not None:  # the error in hand is the one to report: let writes end
            self.pool.shutdown(wait=True, cancel_futures=True)
            return
        try:
            while self.pending:
                self.pending.popleft().result()
        finally:
            self.pool.shutdown(wait=True)

    def submit(self, samples: list[Any], stored: Stored, ok: list[bool]) -> None:
        ready = None
        aux, final, scale = stored.aux, stored.final, stored.scale
        if aux.device.type == "cuda":  # copy to the host without stalling the device
            import torch

            aux = aux.to("cpu", non_blocking=True)
            final = final.to("cpu", non_blocking=True)
            if scale is not None:
                scale = scale.to("cpu", non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        self.pending.append(self.pool.submit(self._write, samples, aux, final, scale, ok,
                                             ready))
        while len(self.pending) > MAX_PENDING_BATCHES:
            self.pending.popleft().result()

    def _write(self, samples: list[Any], aux: Any, final: Any, scale: Any, ok: list[bool],
               ready: Any) -> None:
        if ready is not None:
            ready.synchronize()  # the device-to-host copies of this batch have landed
        run, stats = self.run, self.run.stats
        for i, s in enumerate(samples):
            if not ok[i]:
                continue
            t = s.num_tokens
            nbytes = run.fmt.write(s, aux[i, :t], final[i, :t],
                                   None if scale is None else scale[i, :t])
            with run.lock:
                run.fmt.record(s)
                stats.written += 1
                stats.tokens_written += t
                stats.supervised_written += s.num_supervised
                stats.bytes_written += nbytes
                self.progress.update(done=1, tokens=t, nbytes=nbytes)
