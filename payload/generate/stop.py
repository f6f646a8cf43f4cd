"""How a `generate` run stops: one decision, one reason, one exit code.

Many things end a run early (a refused key, credit, the budget, a signal, a systematic
error, an outage, a full disk); each calls `Stop.request` with its reason and a message
that names the way out. The first reason wins (it is what the status file and the exit
code say); later ones only make sure dispatch has stopped. `request` stops dispatching
and lets requests in flight finish (the run drains them for `--drain-timeout`, then
closes the rest); `close` closes the requests in flight at once (`InFlight`: the
connection is aborted, which stops a provider's billing), for the stops where waiting
would only cost money (the budget, credit); `abandon` also cancels the workers, for those
where nothing they do could be kept (the key is refused, answers can no longer be written).
"""

from __future__ import annotations

import asyncio

from payload.errors import ExitCode
from payload.generate.inflight import InFlight
from payload.generate.limiter import Limiter
from payload.generate.progress import Counters
from payload.redact import redact
from payload.report import Reporter


class Stop:
    def __init__(self, counters: Counters, limiter: Limiter, reporter: Reporter,
                 requests: InFlight | None = None) -> None:
        self.c = counters
        self.limiter = limiter
        self.say = reporter
        self.requests = requests or InFlight()  # the requests on the wire, for `close`
        self.event = asyncio.Event()
        self.reason: str | None = None
        self.exit_code: int = ExitCode.OK
        self.workers: set[asyncio.Task[None]] = set()  # the run's prompt workers, for `abandon`
        self.signals = 0  # SIGTERM/SIGINT received (a batch run's wait for its batches ends)
        self._sleepers: set[asyncio.Future[None]] = set()  # prompts in `sleep`, woken by a stop

    @property
    def stopping(self) -> bool:
        return self.event.is_set()

    def request(self, reason: str, message: str, code: int = ExitCode.STOPPED) -> None:
        """Stop dispatching; in-flight requests finish (drained by the run)."""
        if self.reason is None:
            self.reason = reason
            self.c.stop_reason = reason
            self.c.last_error = redact(message)
            self.say.say(message)
            self.exit_code = code
        self.event.set()
        for woken in self._sleepers:
            _settle(woken)
        self.limiter.stop()

    def close(self, reason: str, message: str) -> None:
        """Stop now: requests in flight are closed, not waited for (each is asked again by
        the next run)."""
        self.request(reason, message)
        self.requests.close()

    def abandon(self, reason: str, message: str) -> None:
        """Stop now, and cancel the workers too (nothing they do can be kept)."""
        self.close(reason, message)
        self.cancel_workers()

    def cancel_workers(self) -> None:
        current = asyncio.current_task()
        for task in list(self.workers):
            if task is not current:
                task.cancel()

    def on_signal(self, signame: str, drain_timeout: float) -> None:
        """SIGTERM/SIGINT: drain, then close what is still in flight, resumable; the same
        signal again: close them at once."""
        self.signals += 1
        if self.reason == "signal":
            self.say.say(f"{signame} again: closing the {len(self.requests)} requests in "
                         "flight now (asked again on resume)")
            self.requests.close()
            self.cancel_workers()
            return
        self.request("signal", f"{signame}: stopping; waiting up to {drain_timeout:g}s for "
                     "in-flight requests, then closing them (resumable)")

    async def sleep(self, delay: float) -> None:
        """Wait `delay` seconds, or less if the run stops meanwhile. One future and one
        timer: `wait_for` on the event made a task, a timer and a cancellation per wait,
        2.6% of a run's CPU at 20% refused with Retry-After (every refusal waits here)."""
        if delay <= 0 or self.stopping:
            return
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(delay, _settle, woken)
        self._sleepers.add(woken)
        try:
            await woken
        finally:
            timer.cancel()
            self._sleepers.discard(woken)


def _settle(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
