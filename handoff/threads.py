"""The one way handoff starts threads: `each` (one function over many items, side by side)
and `soon` (one piece of work in the background, as a Future).

Both use daemon threads, and the caller's thread only ever waits in short steps: Ctrl-C
reaches it at once, and no thread blocked on a silent host, a stalled `ssh -G` or a keyring
waiting for an unlock prompt keeps the process alive. Per-host work goes through
handoff.run.parallel, which is built on `each` (and closes every SSH connection on Ctrl-C);
the modules below it (handoff.host.targets) use `each` directly. Imports nothing of handoff.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def each(items: Sequence[T], fn: Callable[[T], R], *, workers: int, name: str,
         on_interrupt: Callable[[set[int]], None] | None = None) -> list[R]:
    """`fn(item)` for every item on at most `workers` daemon threads; the results in the
    items' order. An item whose `fn` raised re-raises, the first in the items' order, once
    every item is done. On Ctrl-C, `on_interrupt(done)` (`done`: the indexes finished) runs
    before KeyboardInterrupt goes on: it closes what the threads are blocked on."""
    results: list[Any] = [None] * len(items)
    failures: dict[int, BaseException] = {}
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(items)):
        todo.put(i)
    finished = threading.Semaphore(0)
    done: set[int] = set()

    def worker() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # re-raised on the caller's thread
                failures[i] = exc
            finally:
                done.add(i)
                finished.release()

    for n in range(max(1, min(workers, len(items)))):
        threading.Thread(target=worker, name=f"{name}-{n}", daemon=True).start()
    try:
        for _ in items:
            while not finished.acquire(timeout=0.1):
                pass
    except KeyboardInterrupt:
        if on_interrupt is not None:
            on_interrupt(set(done))
        raise
    if failures:
        raise failures[min(failures)]
    return results


def soon(work: Callable[[], R], name: str) -> Future[R]:
    """`work()` on a daemon thread, its result (or exception) in the Future: the keyring
    read overlaps the SSH connections and probes, the workstation's hashing a host's
    listing. A daemon thread rather than an executor: work that hangs (a locked keyring
    collection waiting for an unlock prompt) must not keep the process alive after Ctrl-C."""
    future: Future[R] = Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # delivered to whoever waits on the future
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


__all__ = ["each", "soon"]
