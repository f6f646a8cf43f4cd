"""Spare workers (run.py `_spawn_spares`) take queued prompts, never the queue's sentinels.

Once the input is read the queue holds one sentinel per worker; counted as prompts, a free
slot started a spare for each every 20 ms, which took the sentinel, put it back and ended:
tens of thousands of tasks a second through a run's tail, each kept in `Stop.workers`
(1.3 GB of RSS by the end of 4000 streamed answers at 2000 in flight; BENCHMARKS.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from payload.generate.run import SPARE_CHECK_S, Generator
from payload.generate.settings import Settings
from payload.records import Prompt


class _Attempts:
    """What a spare hands its prompt to: noted, answered at once."""

    def __init__(self) -> None:
        self.handled: list[Prompt] = []

    async def handle(self, prompt: Prompt) -> None:
        self.handled.append(prompt)


class _Counted(set[asyncio.Task[None]]):
    """The spawner's set of spares, counting what was ever added."""

    added = 0

    def add(self, task: asyncio.Task[None]) -> None:
        self.added += 1
        super().add(task)


def _generator(tmp_path: Path) -> Generator:
    return Generator(Settings(input=tmp_path / "in.jsonl", output=tmp_path / "out.jsonl",
                              status_file=None, model="m", base_url="http://127.0.0.1:9",
                              api_key="k", concurrency=8))


async def _spawn_for(gen: Generator, queue: asyncio.Queue[Prompt | None],
                     attempts: _Attempts, spares: set[asyncio.Task[None]]) -> None:
    spawner = asyncio.create_task(gen._spawn_spares(queue, attempts, spares))  # type: ignore[arg-type]
    await asyncio.sleep(20 * SPARE_CHECK_S)
    spawner.cancel()
    await asyncio.gather(spawner, *spares, return_exceptions=True)


def test_no_spare_is_started_for_the_sentinels_once_the_input_is_read(tmp_path: Path) -> None:
    gen = _generator(tmp_path)
    started: list[int] = []

    async def go() -> None:
        queue: asyncio.Queue[Prompt | None] = asyncio.Queue()
        for _ in range(8):
            queue.put_nowait(None)  # the input is read: a sentinel per worker
        assert gen.limiter.unclaimed > 0  # slots free, no worker waiting for one
        spares = _Counted()
        await _spawn_for(gen, queue, _Attempts(), spares)
        started.append(spares.added)
        assert queue.qsize() == 8  # every sentinel still there for its worker

    asyncio.run(go())
    assert started == [0]
    assert gen.stop.workers == set()


def test_queued_prompts_get_spares_which_leave_stop_workers_when_done(tmp_path: Path) -> None:
    gen = _generator(tmp_path)
    attempts = _Attempts()
    prompts = [Prompt(id=i, key=str(i), messages=[{"role": "user", "content": "hi"}],
                      line_no=i + 1) for i in range(3)]

    async def go() -> None:
        queue: asyncio.Queue[Prompt | None] = asyncio.Queue()
        for p in prompts:
            queue.put_nowait(p)
            gen.queued += 1
        queue.put_nowait(None)  # a sentinel behind them stays for its worker
        await _spawn_for(gen, queue, attempts, set())
        assert queue.qsize() == 1

    asyncio.run(go())
    assert attempts.handled == prompts
    assert gen.queued == 0
    assert gen.stop.workers == set()  # done spares are not kept
