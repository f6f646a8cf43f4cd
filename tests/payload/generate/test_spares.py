"""Spare workers (run.py `_spawn_spares`) take queued prompts, never the queue's sentinels,
and one starts at once where a worker gives its slot back to wait (`Attempts.slot_left`).

Once the input is read the queue holds one sentinel per worker; counted as prompts, a free
slot started a spare for each every 20 ms, which took the sentinel, put it back and ended:
tens of thousands of tasks a second through a run's tail, each kept in `Stop.workers`
(1.3 GB of RSS by the end of 4000 streamed answers at 2000 in flight; BENCHMARKS.md)."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

import pytest

from handoff.testing.fakeapi import FaultPlan
from payload import cli
from payload.generate import run as run_module
from payload.generate.run import GC_THRESHOLDS, SPARE_CHECK_S, Generator
from payload.generate.settings import Settings
from payload.records import Prompt
from tests.payload.helpers import assert_exactly_once, gen_args, write_prompts


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


def test_a_slot_left_free_starts_its_spare_at_once_not_at_the_next_look(tmp_path: Path
                                                                         ) -> None:
    """A slot left by a throttled prompt stood empty until the next look (up to 20 ms,
    a round trip or more on a fast server)."""
    gen = _generator(tmp_path)
    attempts = _Attempts()
    prompts = [Prompt(id=i, key=str(i), messages=[{"role": "user", "content": "hi"}],
                      line_no=i + 1) for i in range(12)]

    async def go() -> tuple[int, int]:
        queue: asyncio.Queue[Prompt | None] = asyncio.Queue()
        for p in prompts:
            queue.put_nowait(p)
            gen.queued += 1
        gen.limiter.in_flight = 5  # 3 of 8 slots free, nobody waiting for one
        spares = _Counted()
        gen._start_spares(queue, attempts, spares)  # type: ignore[arg-type]
        started = spares.added  # before the loop ran anything
        gen.stop.request("signal", "stopping")
        gen._start_spares(queue, attempts, spares)  # type: ignore[arg-type]
        await asyncio.gather(*spares)
        return started, spares.added

    assert asyncio.run(go()) == (3, 3)  # one per free slot; none once the run stops


def test_a_throttled_prompt_hands_its_slot_to_a_spare_without_the_look(
        fake_factory, key_file, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The look every SPARE_CHECK_S is switched off: only `slot_left` starts spares. The
    first 30 requests are refused with Retry-After 1; the 13 workers of --concurrency 4
    would go in waves a second apart (3 s or more); with the slots refilled at once the
    30 are refused in the first moments and asked again a second later."""
    monkeypatch.setattr(run_module, "SPARE_CHECK_S", 60.0)
    fake = fake_factory(faults=FaultPlan(schedule={i: "429" for i in range(1, 31)},
                                         retry_after_s=1.0))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 40)
    started = time.monotonic()
    rc = cli.main(gen_args(fake, key_file, inp, out, "--concurrency", "4"))
    wall = time.monotonic() - started
    assert rc == 0
    assert_exactly_once(ids, out)
    assert fake.stats.faults["429"] == 30
    assert wall < 2.5, f"{wall:.1f}s: refused prompts' slots waited for the look"


def test_a_run_collects_garbage_less_often_and_restores_the_thresholds(
        fake_factory, key_file, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's objects die within its round trip: collecting every 700 allocations
    cost 15% of a fast run's client CPU (BENCHMARKS.md). The caller's thresholds are back
    after the run."""
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 20)
    during: list[tuple[int, int, int]] = []
    main = Generator.main

    async def noting(self: Generator) -> int:
        during.append(gc.get_threshold())
        return await main(self)

    monkeypatch.setattr(Generator, "main", noting)
    before = gc.get_threshold()
    assert cli.main(gen_args(fake, key_file, inp, out)) == 0
    assert_exactly_once(ids, out)
    assert during == [GC_THRESHOLDS] != [before]
    assert gc.get_threshold() == before
