"""The requests on the wire, each run as its own task so that a stop can close them.

Closing a request cancels its task: aiohttp then aborts the connection (a response not
read to its end is never handed back to the pool), which is how OpenRouter cancels a
stream and stops billing it; a non-streaming request is abandoned the same way. The
worker waiting on a request is not cancelled with it: it is told the request was closed
(`None`), so it can count it, keep its budget reserve and leave the prompt unrecorded (the
next run asks it again). This works the same for any request coroutine, streamed or not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class InFlight:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    async def run(self, request: Coroutine[Any, Any, T]) -> T | None:
        """Run one request to its end; None when it was closed before that. If the caller
        itself is cancelled, the request is closed with it (and the cancellation goes on)."""
        task = asyncio.ensure_future(request)
        self._tasks.add(task)
        try:
            # wait() neither raises for the task's own cancellation nor cancels the task when
            # the caller is cancelled: the two cases stay apart.
            await asyncio.wait((task,))
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._tasks.discard(task)
        return None if task.cancelled() else task.result()

    def close(self) -> int:
        """Close every request in flight now (their callers get None); how many."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return len(tasks)
