"""The one reporter: redacted lines, flushed, to the stream current when written."""

from __future__ import annotations

import io
import sys

import pytest

from payload.redact import REDACTOR
from payload.report import Reporter


def test_lines_are_redacted_and_kept(monkeypatch):
    secret = "sk-or-v1-" + "7" * 64
    REDACTOR.add(secret)
    try:
        buf = io.StringIO()
        r = Reporter(buf, keep=True)
        r.say(f"the key {secret} was refused")
        r.warn("careful")
        r.error("broken")
        assert secret not in buf.getvalue()
        assert buf.getvalue().splitlines() == r.lines == [
            "the key sk-or-v1-**** was refused", "warning: careful", "error: broken"]
    finally:
        REDACTOR.clear()


def test_the_stream_is_looked_up_at_write_time(monkeypatch):
    """The CLI swaps sys.stderr for its redacting stream after a reporter may be made."""
    r = Reporter()
    later = io.StringIO()
    monkeypatch.setattr(sys, "stderr", later)
    r.say("hello")
    assert later.getvalue() == "hello\n"
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    Reporter("stdout").say("facts")
    assert out.getvalue() == "facts\n"
    with pytest.raises(ValueError, match="stderr"):
        Reporter("stdlog")
