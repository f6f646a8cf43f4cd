"""All of handoff's output: a rich console whose every write is redacted.

The key is registered with `payload.redact.REDACTOR` the moment it is read from the
keyring (secrets.read_key). Redaction happens twice: on the text before rich lays it
out (rich may wrap a long line in the middle of a key, which would defeat a
stream-level filter) and on the stream after (for anything that bypasses us).
`install()` also wraps sys.stdout/sys.stderr, so tracebacks and library prints are
masked too.

Every value printed is also shown with its control characters visible (`visible`: ESC as
`\\x1b`): what a host says (a status field, a log line, a file name, a remote stderr)
can never drive the terminal (OSC 52 clipboard writes, screen clears, titles, links).

Output that is not a terminal (a pipe, a file, a test's capture) is laid out without a
width limit: rich would otherwise assume 80 columns and cut table cells (`done/fai…`) and
wrap long messages, losing exactly what a script or a log wants to keep. On a terminal,
table cells fold onto more lines instead of being cut, so nothing is lost there either.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any, TextIO, cast

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from payload.redact import REDACTOR, RedactingStream

# C0 and C1 controls (ESC, BEL, NUL, CSI 0x9b, ...) and DEL; every Unicode format
# character (category Cf: the bidi controls that reorder what a terminal shows, zero-width
# spaces and joiners, soft hyphens, tags: a name that reads as another, `prompts\u200b`
# as `prompts`); and lone surrogates (which no terminal encoding can write).
_FORMAT = ("\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
           "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
           "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
           "\U000e0020-\U000e007f\ud800-\udfff")
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_FORMAT}]")
_CONTROL_OR_NEWLINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_FORMAT}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
            else f"\\U{code:08x}")


def visible(value: Any, limit: int | None = None, *, newlines: bool = False) -> str:
    """`value` as text a terminal can show as is: every control character as `\\x1b`
    (`\\n` too, unless `newlines`), cut to `limit` characters with the rest counted."""
    text = value if isinstance(value, str) else str(value)
    cut = ""
    if limit is not None and len(text) > limit:
        cut = f"… ({len(text) - limit} more characters)"
        text = text[:limit]
    pattern = _CONTROL if newlines else _CONTROL_OR_NEWLINE
    return pattern.sub(_escape, text) + cut


def has_control(text: str) -> bool:
    return bool(_CONTROL_OR_NEWLINE.search(text))


_lock = threading.RLock()
_console: Console | None = None
_err_console: Console | None = None
UNLIMITED = 100_000  # columns for output that is not a terminal: no line is ever cut


def install() -> None:
    """Wrap the process's stdout/stderr in redacting streams (idempotent)."""
    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout = RedactingStream(sys.stdout)
    if not isinstance(sys.stderr, RedactingStream):
        sys.stderr = RedactingStream(sys.stderr)


def _make(stream: TextIO | None) -> Console:
    out = Console(file=cast(IO[str], RedactingStream(stream or sys.stdout)), highlight=False)
    if not out.is_terminal:
        out.width = UNLIMITED
    return out


def console() -> Console:
    global _console
    if _console is None:
        _console = _make(sys.__stdout__)
    return _console


def err_console() -> Console:
    global _err_console
    if _err_console is None:
        _err_console = _make(sys.__stderr__)
    return _err_console


def heading(text: str) -> Any:
    """A section title (markup allowed): a rule across a terminal, a plain line elsewhere
    (a rule as wide as unlimited output would be 100 000 dashes)."""
    if console().is_terminal:
        from rich.rule import Rule

        return Rule(text, align="left")
    return f"── {text}"


def r(value: Any) -> str:
    """Redact, show control characters visibly and markup-escape a value for display.

    Every value that may come from a host (a status field, a log line, a file or job name,
    a remote stderr tail inside an error) is printed through here: an ESC, BEL or NUL
    becomes `\\x1b`-style text, so no host can drive the terminal (OSC 52 clipboard
    writes, screen clears, titles, hyperlinks). Newlines are kept (multi-line messages)."""
    return escape(REDACTOR.redact(visible(value, newlines=True)))


def _redacted(obj: Any) -> Any:
    """Redacted; a string also with control characters shown visibly (a value that missed
    `r` still cannot drive the terminal)."""
    return REDACTOR.redact(visible(obj, newlines=True)) if isinstance(obj, str) else obj


def _lines(obj: Any) -> list[Any]:
    """A table's title and caption as lines of their own: rich wraps them to the table's
    width ("failed: sbx-1, sbx-2,⏎ sbx-3"), which cuts a list of hosts mid-way."""
    if not isinstance(obj, Table) or not (obj.title or obj.caption):
        return [_redacted(obj)]
    title, caption = obj.title, obj.caption
    obj.title = obj.caption = None
    return [x for x in (_redacted(title), obj, _redacted(caption)) if x is not None]


def say(*objects: Any, **kwargs: Any) -> None:
    """Print markup (values inside already passed through `r`)."""
    tables = any(isinstance(o, Table) for o in objects) and not kwargs
    parts = [part for o in objects for part in _lines(o)] if tables else [_redacted(o) for o in objects]

    def emit(out: Console) -> None:
        if tables:  # title, table, caption: each on its own lines
            for part in parts:
                out.print(part)
        else:
            out.print(*parts, **kwargs)

    with _lock:
        out = console()
        if out.is_terminal:
            emit(out)
            return
        # Not a terminal: no padding at the ends of lines (rich pads table headers and
        # cells to their column's width; a log, a diff or a grep should not carry that).
        drawn = [_plain_table(part, out) for part in parts] if tables else [None]
        if any(text is not None for text in drawn):
            chunks = []
            for part, text in zip(parts, drawn, strict=True):
                if text is None:
                    with out.capture() as captured:
                        out.print(part)
                    text = captured.get()
                chunks.append(text)
            printed = "".join(chunks)
        else:
            with out.capture() as captured:
                emit(out)
            printed = captured.get()
        out.file.write("\n".join(line.rstrip() for line in printed.split("\n")))
        out.file.flush()


def _plain_table(obj: Any, out: Console) -> str | None:
    """A table from `table()` drawn as rich draws it off a terminal without colour (the
    same characters, line for line), or None for anything else, which rich then draws.
    rich's layout pass costs ~1.5 ms per row: `fab status` over 32 hosts with 6 jobs
    each spent 0.3-0.4 s of its ~1 s of CPU drawing its 200-row table."""
    from rich import box

    if (not isinstance(obj, Table) or not getattr(obj, "_handoff_plain", False)
            or out.color_system is not None or out.options.ascii_only or not obj.rows
            or obj.title or obj.caption or obj.show_lines or obj.row_styles
            or obj.box is not box.HEAVY_HEAD or obj.padding != (0, 1, 0, 1) or obj.expand
            or not (obj.show_header and obj.show_edge and obj.pad_edge) or obj.show_footer
            or obj.width or obj.min_width or obj.leading or obj.collapse_padding
            or any(row.style or row.end_section for row in obj.rows)
            or any(c.justify != "left" or c.width or c.min_width or c.max_width or c.ratio
                   or c.no_wrap for c in obj.columns)):
        return None
    from rich.cells import cell_len
    from rich.text import Text

    cells: list[list[str]] = []
    for column in obj.columns:
        texts = [column.header, *column._cells]
        if not all(isinstance(t, str) for t in texts):
            return None
        plain = [Text.from_markup(t).plain for t in texts]  # type: ignore[arg-type]
        if any("\n" in t or "\t" in t for t in plain):
            return None  # rich would lay these out over lines or expand tabs
        cells.append(plain)
    widths = [max(cell_len(t) for t in column) for column in cells]
    if sum(widths) + 3 * len(widths) + 1 > out.width:
        return None  # rich would fold cells to fit

    def line(left: str, middle: str, right: str, fill: str) -> str:
        return left + middle.join(fill * (w + 2) for w in widths) + right + "\n"

    def row(edge: str, i: int) -> str:
        return edge + edge.join(f" {col[i]}{' ' * (w - cell_len(col[i]))} "
                                for col, w in zip(cells, widths, strict=True)) + edge + "\n"

    drawn = [line("┏", "┳", "┓", "━"), row("┃", 0), line("┡", "╇", "┩", "━")]
    drawn += [row("│", i) for i in range(1, len(cells[0]))]
    drawn.append(line("└", "┴", "┘", "─"))
    return "".join(drawn)


def warn(message: str) -> None:
    with _lock:
        err_console().print(f"[yellow]warning:[/] {r(message)}")


def note(message: str) -> None:
    """A side remark for people (which hosts, why): stderr, so stdout stays the data
    (`status --json`)."""
    with _lock:
        err_console().print(f"[dim]{r(message)}[/]")


def error(message: str) -> None:
    with _lock:
        err_console().print(f"[bold red]error:[/] {r(message)}")


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> Table:
    """A rich table whose cells are redacted (cells may carry markup already escaped)."""
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        t.add_column(col, overflow="fold")  # never "…": a cut cell loses data
    for row in rows:
        t.add_row(*(REDACTOR.redact(visible(c, newlines=True)) if c is not None else ""
                    for c in row))
    t._handoff_plain = True  # type: ignore[attr-defined]  # only text cells, rich's defaults: _plain_table may draw it
    return t


@contextlib.contextmanager
def live(renderable: Any, *, enabled: bool = True) -> Iterator[Callable[[Any], None]]:
    """The control plane's one progress display: `renderable` drawn once and redrawn in
    place with each update (`with live(t) as show: … show(new_t)`), its last frame left on
    screen. Not `enabled` (not a terminal, or JSON output): updates are dropped and the
    caller prints the final state itself."""
    if not enabled:
        yield lambda _update: None
        return
    from rich.live import Live

    display = Live(renderable, console=console(), refresh_per_second=4)
    display.start()
    try:
        yield display.update
    finally:
        display.stop()
