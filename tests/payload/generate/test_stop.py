"""Stop.sleep: the wait every throttled prompt and every backoff takes, cut short by a stop."""

from __future__ import annotations

import asyncio
import io

import pytest

from payload.generate.limiter import Limiter
from payload.generate.progress import Counters
from payload.generate.stop import Stop
from payload.report import Reporter

pytestmark = pytest.mark.timeout(30)


def test_a_sleep_lasts_its_delay_unless_the_run_stops():
    """Sleepers wake at their delay; a stop wakes every one still waiting at once, and a
    sleep begun after the stop returns at once (the run drains, nobody waits out a
    Retry-After); nothing is left registered."""
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        stop = Stop(Counters(), Limiter(10), Reporter(io.StringIO()))
        t0 = loop.time()
        await stop.sleep(0.05)
        assert 0.05 <= loop.time() - t0 < 1.0
        long = [asyncio.create_task(stop.sleep(30)) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert len(stop._sleepers) == 3
        t0 = loop.time()
        stop.request("signal", "SIGTERM: stopping")
        await asyncio.gather(*long)
        assert loop.time() - t0 < 1.0 and not stop._sleepers
        t0 = loop.time()
        await stop.sleep(30)
        assert loop.time() - t0 < 0.1

    asyncio.run(scenario())


def test_a_cancelled_sleep_leaves_nothing_behind():
    """A worker cancelled in its wait (a run abandoned) unregisters it and its timer."""
    async def scenario() -> None:
        stop = Stop(Counters(), Limiter(10), Reporter(io.StringIO()))
        task = asyncio.create_task(stop.sleep(30))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not stop._sleepers
        stop.request("signal", "SIGTERM: stopping")  # (no sleeper left to wake)

    asyncio.run(scenario())
