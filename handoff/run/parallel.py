"""Run one function per host on a bounded thread pool, with grouped output.

One failing host never stops the others: every exception is caught per host and
becomes that host's error line. Each host's output is buffered and printed as one
block when the host finishes, so lines from different hosts never interleave. A
summary table ends every multi-host run, each failed host's error under it (said there
only, not in the host's block too); the caller exits non-zero if any failed.

The hosts run on daemon threads while the main thread only waits: Ctrl-C reaches it at
once, every SSH connection in flight is closed (handoff.ssh.connect.abort_all) and the command
ends within a second; no thread blocked on a silent host keeps the process alive.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from handoff import console, threads
from handoff.errors import HandoffError, Interrupted
from handoff.host.session import Connector, Session
from handoff.host.targets import Target
from handoff.ssh import connect

MAX_WORKERS = 32
T = TypeVar("T")


class HostsInterrupted(Interrupted):
    """Ctrl-C during a run over hosts: each host's report as far as it got, and `ended`, the
    hosts whose work had ended (done or failed) before it. Its message says per host which
    ended and which were cut mid-way; a command that knows what "mid-way" means for its work
    (a launch's start, a fetch's part file) catches it and says that instead."""

    def __init__(self, title: str, reports: list[HostReport], ended: set[str]) -> None:
        self.reports = reports
        self.ended = ended
        lines = [f"interrupted (Ctrl-C) during {title}; on each host:"]
        for rep in reports:
            label = rep.target.label
            lines.append(f"  {label}: " + (("ended: " + ("ok" if rep.ok else f"failed: {rep.reason}"))
                                           if label in ended else
                                           "cut mid-way: what it was doing may or may not have "
                                           "happened"))
        super().__init__("\n".join(lines))


@dataclass
class HostReport:
    target: Target
    ok: bool = True
    summary: str = ""  # the summary table's cell
    # The operation's result for this host, a small dataclass of its module (`data_as`).
    data: object = None
    lines: list[Any] = field(default_factory=list)  # grouped output: strings or renderables
    error: str | None = None
    seconds: float = 0.0

    def log(self, item: Any) -> None:
        self.lines.append(item)

    def data_as(self, kind: type[T]) -> T:
        """This host's result, typed: an empty `kind()` until a step adds to it."""
        if self.data is None:
            self.data = kind()
        if not isinstance(self.data, kind):
            raise RuntimeError(f"{self.target.label}: the result is "
                               f"{type(self.data).__name__}, not {kind.__name__}")
        return self.data

    def fail(self, message: str) -> None:
        self.ok = False
        self.error = message

    @property
    def reason(self) -> str:
        """The error without the host's name in front (messages name their host first)."""
        error = self.error or "failed"
        label = self.target.label
        return error[len(label) + 2:] if error.startswith(f"{label}: ") else error


HostFn = Callable[[Target, HostReport], None]

_print_lock = threading.Lock()


def _print_group(report: HostReport, *, error: bool = True) -> None:
    """A host's block: its heading and lines, and its error unless the summary below says it
    (`error` False: every error is printed once)."""
    if not report.lines and (report.ok or not error):
        return
    ep = report.target.endpoint
    items = [console.heading(f"[bold]{console.r(report.target.label)}[/] [dim]{console.r(ep)}[/]"),
             *report.lines]
    if report.error:
        items.append(f"[bold red]✗ {console.r(report.error)}[/]" if error
                     else "[bold red]✗ failed[/] (why: under the summary below)")
    with _print_lock:
        if all(isinstance(item, str) for item in items):
            # One print for the whole group (the same lines): each print is a layout pass
            # of its own, and 32 hosts' groups were ~130 of them.
            console.say("\n".join(items))
            return
        for item in items:
            console.say(item)


def run_parallel(
    targets: list[Target],
    fn: HostFn,
    *,
    title: str,
    grouped: bool = True,
    summary: bool = True,
    workers: int = MAX_WORKERS,
) -> list[HostReport]:
    reports = [HostReport(t) for t in targets]
    stopping = threading.Event()  # Ctrl-C: hosts still finishing print nothing more

    def one(report: HostReport) -> HostReport:
        start = time.monotonic()
        try:
            fn(report.target, report)
        except HandoffError as exc:
            report.fail(str(exc))
        except Exception as exc:  # one host's bug or library error must not stop the others
            tb = traceback.extract_tb(exc.__traceback__)
            where = f" (at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
            report.fail(f"{type(exc).__name__}: {exc}{where}")
        report.seconds = time.monotonic() - start
        if grouped and not stopping.is_set():
            _print_group(report, error=not tabled)
        return report

    tabled = summary and len(reports) > 1  # the summary's lines then say each error

    _run_all(reports, one, max(1, min(workers, len(reports))), stopping, title)
    # One host: its group already ended with its result (or its error); a table would only
    # say it again.
    if summary and len(reports) > 1:
        print_summary(title, reports)
    return reports


def _run_all(reports: list[HostReport], one: Callable[[HostReport], HostReport],
             workers: int, stopping: threading.Event, title: str) -> None:
    """`one(report)` for every report on at most `workers` daemon threads (handoff.threads):
    the main thread waits in short steps so that Ctrl-C interrupts it at once. On Ctrl-C the
    hosts not done are marked interrupted and every connection is closed, then
    HostsInterrupted says which hosts had ended."""

    ended: set[str] = set()

    def interrupted(done: set[int]) -> None:
        stopping.set()
        for i, report in enumerate(reports):
            if i not in done:
                report.fail("interrupted")
            else:
                ended.add(report.target.label)
        connect.abort_all()

    try:
        threads.each(reports, one, workers=workers, name="host", on_interrupt=interrupted)
    except KeyboardInterrupt:
        raise HostsInterrupted(title, reports, ended) from None


def run_on_hosts(
    targets: list[Target],
    fn: Callable[[Session, HostReport], None],
    *,
    connect: Connector,
    title: str,
    grouped: bool = True,
    summary: bool = True,
) -> list[HostReport]:
    """`run_parallel` with each host's session opened (from `connect`) and closed around `fn`."""

    def one(target: Target, report: HostReport) -> None:
        with connect(target) as session:
            fn(session, report)

    return run_parallel(targets, one, title=title, grouped=grouped, summary=summary)


def print_summary(title: str, reports: list[HostReport]) -> None:
    rows = []
    for rep in reports:
        status = "[green]ok[/]" if rep.ok else "[bold red]FAILED[/]"
        # A failure's whole message goes below the table, on its own line: in a column it
        # would be squeezed (and, on a terminal, folded) next to the others.
        detail = console.r(rep.summary) if rep.ok else "see below"
        rows.append([console.r(rep.target.label), status, detail, f"{rep.seconds:.2f}s"])
    failed = [rep.target.label for rep in reports if not rep.ok]
    caption = f"{len(reports) - len(failed)}/{len(reports)} hosts ok"
    if failed:
        caption += f"; failed: {', '.join(failed)}"
    table = console.table(f"{title} summary", ["host", "result", "detail", "time"], rows)
    table.caption = console.r(caption)
    console.say(table)
    for rep in reports:
        if not rep.ok:
            error = rep.error or "failed"
            # Messages name their host first by convention; don't say it twice.
            shown = error if error.startswith(rep.target.label) else f"{rep.target.label}: {error}"
            console.say(f"[bold red]✗[/] {console.r(shown)}")


def failed_hosts(reports: list[HostReport]) -> list[str]:
    return [rep.target.label for rep in reports if not rep.ok]
