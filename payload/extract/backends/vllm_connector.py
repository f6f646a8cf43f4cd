"""vLLM's hidden-states connector for a CPU-only engine (imported by the engine itself).

The stock `ExampleHiddenStatesConnector` copies each finished request's hidden states
out of the KV cache on a CUDA stream into pinned host memory; on a CPU engine that
fails (`pin_memory=True requires a CUDA ... backend`). This subclass replaces that one
step: the states are already in host memory, so it copies them synchronously and hands
the stock writer (its thread pool, its `.lock` protocol, its file layout) a completed
copy. Everything else is the stock connector's. The vllm backend names this class only
on a CPU platform; on CUDA it uses the stock one.

It relies on the stock connector's internals (`_submit_async_write`, `_kv_cache`,
`_lock_fds`, `_req_copy_events`, ...), hence the pinned vLLM range in backends/vllm.py.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class _Copied:
    """Stands in for the CUDA event of the stock connector: the copy is already done."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: Any) -> None:
        if not self._is_tp_rank_zero:  # the states are replicated: rank 0 writes them
            return
        assert self._kv_cache is not None
        bs = self._block_size
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(bs, dtype=torch.long).reshape(1, bs)
                 + blocks.reshape(-1, 1) * bs).flatten()
        n = pending.token_ids.shape[0]
        # clone(): the cache blocks are reused as soon as this request is reported done
        states = extract_from_kv_cache(self._kv_cache, slots, n).clone()
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC,
                              0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Copied()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename,
                                       lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
