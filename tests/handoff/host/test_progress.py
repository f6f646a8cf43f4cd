"""Transfer progress: nothing below a few MB; on a terminal one live bar per transfer with
bytes, rate and ETA, gone from the live display when the last transfer ends; elsewhere
plain lines at the start, every few seconds and at the end (or where it stopped)."""

from __future__ import annotations

import io
import re
import threading
from pathlib import Path

import pytest
from rich.console import Console

from handoff import console
from handoff.host import progress
from handoff.host.progress import MIN_BYTES, PLAIN_EVERY, Display
from handoff.host.transfer import download, upload_file
from handoff.testing.local import LocalFiles


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plain(clock: Clock) -> tuple[Display, list[str]]:
    lines: list[str] = []
    return Display(Console(file=io.StringIO()), bars=False, clock=clock, say=lines.append), lines


def test_plain_lines_say_bytes_rate_and_eta_every_few_seconds() -> None:
    clock = Clock()
    shown, lines = plain(clock)
    with shown.meter("sbx-1", "output.jsonl", 100_000_000, "fetch") as m:
        for _ in range(10):  # 10 MB per second for 10 s
            clock.now += 1.0
            m.advance(10_000_000)
    assert lines[0] == "sbx-1 ↓ output.jsonl: fetching 100.0 MB"
    # One line per PLAIN_EVERY seconds while it runs, none at 100% (the last line says it).
    assert lines[1:-1] == ["sbx-1 ↓ output.jsonl: 50.0 MB / 100.0 MB (50%), 10.0 MB/s, ETA 5s"]
    assert PLAIN_EVERY == 5.0
    assert lines[-1] == "sbx-1 ↓ output.jsonl: 100.0 MB in 10.0 s (10.0 MB/s)"


def test_a_stopped_transfer_says_where_it_stopped() -> None:
    clock = Clock()
    shown, lines = plain(clock)
    with pytest.raises(OSError), shown.meter("h", "input.jsonl", 20_000_000, "upload") as m:
        m.advance(5_000_000)
        raise OSError("connection dropped")
    assert lines == ["h ↑ input.jsonl: uploading 20.0 MB",
                     "h ↑ input.jsonl: stopped after 5.0 MB of 20.0 MB"]


def test_small_transfers_show_nothing() -> None:
    shown, lines = plain(Clock())
    with shown.meter("h", "payload.pyz", MIN_BYTES - 1, "upload") as m:
        m.advance(MIN_BYTES - 1)
    assert lines == []


def test_bars_on_a_terminal_share_one_live_display() -> None:
    out = io.StringIO()
    term = Console(file=out, force_terminal=True, width=120, color_system=None)
    clock = Clock()
    shown = Display(term, bars=True, clock=clock)
    a = shown.meter("sbx-1", "output.jsonl", 50_000_000, "fetch")
    b = shown.meter("sbx-2", "output.jsonl", 50_000_000, "fetch")
    assert shown.bars.live.is_started and len(shown.bars.tasks) == 2
    for _ in range(5):
        clock.now += 1.0
        a.advance(10_000_000)
        b.advance(5_000_000)
    a.close()
    assert shown.bars.live.is_started  # b still runs
    b.close(ok=False)
    assert not shown.bars.live.is_started  # the last frame stays on screen
    text = out.getvalue()
    assert "sbx-1 ↓ output.jsonl" in text and "sbx-2 ↓ output.jsonl" in text
    assert "50.0/50.0 MB" in text and "25.0/50.0 MB" in text and "(stopped)" in text
    assert "MB/s" in text
    # The next batch of transfers starts with its own bars only.
    c = shown.meter("sbx-3", "log", 10_000_000, "fetch")
    assert [t.description for t in shown.bars.tasks] == ["sbx-3 ↓ log"]
    c.close()


def test_meters_from_many_threads_close_the_display_once() -> None:
    term = Console(file=io.StringIO(), force_terminal=True, width=100)
    shown = Display(term, bars=True)
    all_open = threading.Barrier(16)

    def one(i: int) -> None:
        with shown.meter(f"h{i}", "f", MIN_BYTES, "fetch") as m:
            all_open.wait()
            for _ in range(50):
                m.advance(MIN_BYTES // 50)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not shown.bars.live.is_started and len(shown.bars.tasks) == 16
    assert all(t.completed >= MIN_BYTES - 50 for t in shown.bars.tasks)


@pytest.fixture
def fresh_console() -> None:
    console._console = None
    console._err_console = None


def test_downloads_and_uploads_report_on_handoff_s_console(
        fresh_console: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Not a terminal (pytest captures): plain lines, through handoff's console."""
    data = bytes(range(256)) * (MIN_BYTES // 256 + 1)
    remote = tmp_path / "host" / "output.jsonl"
    remote.parent.mkdir()
    remote.write_bytes(data)
    files = LocalFiles(tmp_path / "host")
    download(files, str(remote), tmp_path / "here" / "output.jsonl", 0, len(data), 0.0,
             label="sbx-1", name="job/output.jsonl")
    upload_file(files, remote, str(tmp_path / "host" / "copy.jsonl"), label="sbx-1")
    out = capfd.readouterr().out
    assert f"sbx-1 ↓ job/output.jsonl: fetching {progress.units.size(len(data))}" in out
    assert f"sbx-1 ↑ copy.jsonl: uploading {progress.units.size(len(data))}" in out
    assert len(re.findall(r": 4.0 MB in \d+.\d s \(\d+.\d [MG]B/s\)\n", out)) == 2  # size, time, rate


def test_ctrl_c_during_a_bar_shows_the_cursor_and_ends_the_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during a transfer bar left the cursor hidden and printed "error: interrupted…"
    on the bar's line (issue 22 #8): stop_all ends the display first."""
    out = io.StringIO()
    term = Console(file=out, force_terminal=True, width=120)
    shown = Display(term, bars=True, clock=Clock())
    monkeypatch.setattr(progress, "_display", shown)
    meter = shown.meter("sbx-1", "huge.jsonl", 50_000_000, "upload")
    meter.advance(1_000_000)
    assert "\x1b[?25l" in out.getvalue()  # rich hid the cursor for the bar
    progress.stop_all()
    assert not shown.bars.live.is_started
    text = out.getvalue()
    assert text.rindex("\x1b[?25h") > text.rindex("\x1b[?25l")  # the cursor shown again
    assert text.replace("\x1b[?25h", "").endswith("\n")  # what follows starts a new line
    meter.close(ok=False)  # the transfer's thread closes its meter later: nothing breaks
    assert not shown.bars.live.is_started
