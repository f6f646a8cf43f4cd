"""Transfer progress: a bar per transfer on a terminal, plain lines everywhere else.

Every transfer of at least MIN_BYTES through handoff.host.transfer (a fetched file, an
uploaded input or release) shows its bytes, rate and ETA while it runs, so a long
transfer never sits silent; smaller ones finish before a bar means anything and show
nothing. On a terminal all transfers in flight (one per host and file) share one live
display (rich's Progress on the command's console, so the hosts' grouped output still
prints above it), left on screen when the last one ends. Elsewhere (a pipe, a CI log,
`TERM=dumb`) each transfer prints a line when it starts, one every PLAIN_EVERY seconds,
and one when it ends with its size, time and rate: readable in a log file, no escape
codes.

Everything goes through handoff.console, so every line is redacted like all output.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from handoff import console
from payload import units

MIN_BYTES = 4_000_000  # "a few MB": below this a transfer shows nothing
PLAIN_EVERY = 5.0  # seconds between plain progress lines of one transfer
ARROWS = {"fetch": "↓", "upload": "↑"}


class Meter:
    """One transfer's progress: `advance(n)` as bytes move, then `close(ok)`."""

    def advance(self, n: int) -> None:
        """`n` more bytes moved."""

    def close(self, ok: bool = True) -> None:
        """The transfer ended (whole when `ok`)."""

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.close(ok=kind is None)


class _PlainMeter(Meter):
    def __init__(self, display: Display, what: str, total: int, direction: str) -> None:
        self.display = display
        self.what = what
        self.total = total
        self.done = 0
        self.start = self.last = display.clock()
        display.say(f"{what}: {'fetching' if direction == 'fetch' else 'uploading'} "
                    f"{units.size(total)}")

    def advance(self, n: int) -> None:
        self.done += n
        now = self.display.clock()
        if now - self.last >= PLAIN_EVERY and self.done < self.total:
            self.last = now
            speed = self.done / max(now - self.start, 1e-9)
            self.display.say(
                f"{self.what}: {units.size(self.done)} / {units.size(self.total)} "
                f"({100 * self.done / self.total:.0f}%), {units.rate(speed)}, "
                f"ETA {units.eta(self.total - self.done, speed)}")

    def close(self, ok: bool = True) -> None:
        elapsed = max(self.display.clock() - self.start, 1e-9)
        if ok:
            self.display.say(f"{self.what}: {units.size(self.done)} in {elapsed:.1f} s "
                             f"({units.rate(self.done / elapsed)})")
        else:
            self.display.say(f"{self.what}: stopped after {units.size(self.done)} of "
                             f"{units.size(self.total)}")


class _BarMeter(Meter):
    def __init__(self, display: Display, task: TaskID) -> None:
        self.display = display
        self.task = task

    def advance(self, n: int) -> None:
        self.display.bars.advance(self.task, n)

    def close(self, ok: bool = True) -> None:
        self.display.finished(self.task, ok)


class Display:
    """The transfers in flight for one console (see the module docstring)."""

    def __init__(self, out: Console, *, bars: bool, clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] | None = None) -> None:
        self.out = out
        self.use_bars = bars
        self.clock = clock
        self._say = say or (lambda line: out.print(console.r(line), highlight=False))
        self._lock = threading.Lock()
        self._open = 0
        self.bars = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), console=out,
            refresh_per_second=4, get_time=clock)

    def say(self, line: str) -> None:
        self._say(line)

    def meter(self, host: str, name: str, total: int, direction: str) -> Meter:
        """A meter for moving `total` bytes of `name` to or from `host` (`direction`:
        fetch or upload); one that shows nothing below MIN_BYTES."""
        if total < MIN_BYTES:
            return Meter()
        what = f"{host} {ARROWS.get(direction, '')} {name}".strip() if host else name
        if not self.use_bars:
            return _PlainMeter(self, what, total, direction)
        with self._lock:
            if self._open == 0:
                for task in list(self.bars.task_ids):  # a new batch: drop the last one's bars
                    self.bars.remove_task(task)
                self.bars.start()
            self._open += 1
            task = self.bars.add_task(console.r(what), total=total)
        return _BarMeter(self, task)

    def finished(self, task: TaskID, ok: bool) -> None:
        with self._lock:
            if self._open == 0:
                return  # stop_all ended the display already (Ctrl-C)
            if not ok:
                description = self.bars.tasks[self.bars.task_ids.index(task)].description
                self.bars.update(task, description=f"{description} [red](stopped)[/]")
            self.bars.stop_task(task)
            self._open -= 1
            if self._open == 0:
                self.bars.stop()  # the last frame stays on screen


_display: Display | None = None
_display_lock = threading.Lock()


def display() -> Display:
    """The process's display, on handoff's console: bars on a terminal, else lines."""
    global _display
    with _display_lock:
        out = console.console()
        if _display is None or _display.out is not out:  # (tests replace the console)
            _display = Display(out, bars=out.is_terminal and not out.is_dumb_terminal,
                               say=lambda line: console.say(console.r(line)))
        return _display


def stop_all() -> None:
    """End the bars at once (Ctrl-C): the terminal's cursor shown again and the last frame
    left on its own lines, so the message that follows is not printed on a bar's line. The
    transfers' threads still close their meters later; those find nothing open."""
    with _display_lock:
        current = _display
    if current is None or not current.use_bars:
        return
    with current._lock:
        current._open = 0
        current.bars.stop()


def meter(host: str, name: str, total: int, direction: str) -> Meter:
    """A meter on the process's display (see Display.meter)."""
    return display().meter(host, name, total, direction)

