"""Tables off a terminal: handoff's own drawing of a plain table gives exactly the bytes rich
gives (rich's is the reference, drawn beside it); anything rich lays out otherwise (a cell
over lines, colour forced on, a column set apart) is left to rich."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from handoff import console

ROWS = [
    ["[bold]all (32 hosts)[/]", "generator", "[green]finished[/]", "32000/0/32000", "0", "$13.4400"],
    ["sbx-1", "dataset-2", "[yellow]running[/]", "1000/0/1000", "-", "$0.4200"],
    ["host\\[x]", "名前", ":smile: ok", "", "1", console.r("a\x1b[31m[red]b")],
    ["h", "wide 🐍 cell", "a  b", "x" * 70, "", "é"],
]


def rich_drawing(table: Any) -> str:
    """What console.say printed before it drew tables itself: rich's capture, rstripped."""
    out = console.console()
    with out.capture() as captured:
        for part in console._lines(table):
            out.print(part)
    return "\n".join(line.rstrip() for line in captured.get().split("\n"))


def said(*objects: Any) -> str:
    out = console.console()
    stream = io.StringIO()
    real, out.file = out.file, stream
    try:
        console.say(*objects)
    finally:
        out.file = real
    return stream.getvalue()


@pytest.mark.parametrize("rows", [ROWS, ROWS[:1], [[str(i), f"job-{i}"] + ["x"] * 4 for i in range(200)]])
def test_a_plain_table_is_drawn_as_rich_draws_it(rows: list[list[str]]) -> None:
    columns = ["host", "job", "state", "done/fail/total", "tok/s", "$ spent"]
    expected = rich_drawing(console.table("status", columns, rows))
    table = console.table("status", columns, rows)
    table.caption = "32/32 hosts ok"
    expected_with_caption = rich_drawing(console.table("status", columns, rows)) + "32/32 hosts ok\n"
    assert console._plain_table(console.table(None, columns, rows), console.console()) is not None
    assert said(console.table("status", columns, rows)) == expected
    assert said(table) == expected_with_caption


def test_what_rich_lays_out_otherwise_is_left_to_rich() -> None:
    out = console.console()
    for cells in (["two\nlines", "x"], ["tab\there", "x"]):
        assert console._plain_table(console.table("t", ["a", "b"], [cells]), out) is None
    right = console.table("t", ["a", "b"], [["1", "2"]])
    right.columns[1].justify = "right"
    assert console._plain_table(right, out) is None
    assert console._plain_table(console.table("t", ["a"], []), out) is None  # no rows
    from rich.table import Table

    assert console._plain_table(Table("a"), out) is None  # not one of handoff's tables
    colour = Console(file=io.StringIO(), force_terminal=False, color_system="standard")
    assert console._plain_table(console.table("t", ["a"], [["1"]]), colour) is None
    # and what rich draws for them is what say prints
    lines = console.table("t", ["a", "b"], [["two\nlines", "x"], ["1", "2"]])
    assert said(lines) == rich_drawing(console.table("t", ["a", "b"], [["two\nlines", "x"], ["1", "2"]]))
