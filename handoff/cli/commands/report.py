"""`fab report`: the run's HTML report from what `fab fetch` brought (no host is contacted),
or with `--watch` the same pages served live from the hosts on 127.0.0.1 until Ctrl-C.

Exit codes: 0 the report was written (or the watch ended by Ctrl-C); 1 nothing fetched to
report on; 2 bad usage (a missing `--dest`, an unknown `--job`, a bad number).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import webbrowser
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from handoff import console
from handoff.cli.commands import common
from handoff.cli.commands.common import guarded, targets_for
from handoff.config import flags
from handoff.errors import UsageError


@guarded
def report(host: str | None = None, role: str | None = None, *, job: str | None = None,
           dest: str = "results", watch: bool = False, open_page: bool = False,
           interval: float | str | None = None, answers: int | str | None = None,
           port: int | str | None = None) -> int:
    """Write DEST/report.html and DEST/<job>/report.html (or serve them live with --watch)."""
    size = flags.whole("--answers", answers, minimum=0, maximum=100_000, default=200)
    assert size is not None
    if watch:
        return _watch(host, role, job, interval, size, port, open_page)
    from handoff.ops.report import build

    folder = Path(dest).expanduser()
    built = build.build(folder, job, size)
    for warning in built.warnings:
        console.warn(warning)
    for name, path in built.jobs.items():
        s = built.summaries[name]
        console.say(f"[green]✓[/] {console.r(name)}: {s.get('samples', 0):,} answers, "
                    f"{s.get('failed', 0):,} failed → {console.r(path)}")
    shown = built.run or next(iter(built.jobs.values()))
    console.say(f"report: {console.r(shown)}")
    if open_page:
        _open(shown.resolve().as_uri())
    return 0


def _open(url: str) -> None:
    if not webbrowser.open(url):
        console.warn(f"no browser to open here: open {url} yourself")


@contextlib.contextmanager
def _ctrl_c() -> Iterator[threading.Event]:
    """Ctrl-C sets the event the watch waits on (it ends after the refresh in hand); a second
    one raises KeyboardInterrupt at once. A KeyboardInterrupt raised wherever the signal
    lands can be swallowed (one that hits a garbage-collector callback is only printed), and
    the watch would serve on."""
    stop = threading.Event()

    def on_int(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    old = signal.signal(signal.SIGINT, on_int)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, old)


def _watch(host: str | None, role: str | None, job: str | None, interval: float | str | None,
           size: int, port: int | str | None, open_page: bool) -> int:
    from handoff.ops.report import live as serving

    every = flags.real("--interval", interval, minimum=1.0, default=5.0)
    bound = flags.whole("--port", port, minimum=0, maximum=65535, default=0)
    assert every is not None and bound is not None
    targets = targets_for(host, role)
    live = serving.Live(list(targets), job, common.CONNECT, every, size)
    try:
        live.refresh()
        try:
            server = serving.serve(live, bound)
        except OSError as exc:
            raise UsageError(f"--port {bound}: cannot listen on 127.0.0.1:{bound} ({exc.strerror}); "
                             f"pick another port, or 0 for any free one") from None
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        console.say(f"serving the live report at {url} (refreshed every {every:g} s from "
                    f"{len(list(targets))} host(s); Ctrl-C stops)")
        if open_page:
            _open(url)
        try:
            with _ctrl_c() as stop:
                serving.run(live, server, console.warn, stop)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: at once
        finally:
            server.shutdown()
            server.server_close()
        console.say("stopped serving; the jobs keep running on the hosts (`fab fetch` then "
                    "`fab report` for the full report)")
    finally:
        live.close()
    return 0
