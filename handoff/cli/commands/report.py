"""`fab report`: the run's HTML report from what `fab fetch` brought (no host is contacted),
or with `--watch` the same pages served live from the hosts on 127.0.0.1 until Ctrl-C.

Exit codes: 0 the report was written (or the watch ended by Ctrl-C); 1 nothing fetched to
report on; 2 bad usage (a missing `--dest`, an unknown `--job`, a bad number).
"""

from __future__ import annotations

import webbrowser
from pathlib import Path

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
            serving.run(live, server, console.warn)
        except KeyboardInterrupt:
            console.say("stopped serving; the jobs keep running on the hosts (`fab fetch` then "
                        "`fab report` for the full report)")
        finally:
            server.shutdown()
            server.server_close()
    finally:
        live.close()
    return 0
