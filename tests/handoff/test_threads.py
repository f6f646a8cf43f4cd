"""handoff.threads, the one way handoff starts threads: results in order, the first failure
(in the items' order) raised once all are done, at most `workers` at once, daemon threads."""

from __future__ import annotations

import threading
import time

import pytest

from handoff import threads


def test_each_keeps_the_order_and_the_bound() -> None:
    running, peak, lock = [0], [0], threading.Lock()

    def work(n: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02 * (5 - n % 5))  # later items finish first
        with lock:
            running[0] -= 1
        return n * n

    assert threads.each(list(range(10)), work, workers=3, name="t") == [n * n for n in range(10)]
    assert peak[0] == 3


def test_each_raises_the_first_failure_after_every_item_ran() -> None:
    ran: list[int] = []

    def work(n: int) -> int:
        ran.append(n)
        if n in (2, 4):
            raise ValueError(f"item {n}")
        return n

    with pytest.raises(ValueError, match="item 2"):
        threads.each([0, 1, 2, 3, 4, 5], work, workers=2, name="t")
    assert sorted(ran) == [0, 1, 2, 3, 4, 5]


def test_soon_delivers_a_result_or_an_exception_on_a_daemon_thread() -> None:
    assert threads.soon(lambda: threading.current_thread().daemon, "t").result(5) is True
    failed = threads.soon(lambda: 1 / 0, "t")
    with pytest.raises(ZeroDivisionError):
        failed.result(5)
