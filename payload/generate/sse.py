"""An incremental reader of Server-Sent Events (the WHATWG HTML standard, "Server-sent
events", the event-stream interpretation), for streamed chat completions.

Bytes are fed as they arrive, split at any byte by TCP; whole events come out. A line ends
at CRLF, LF or CR (a CR that ends one read and an LF that starts the next are one line
end); a leading byte order mark is dropped; `:` lines are comments; `data:` lines are
joined with "\\n" into one event, dispatched by a blank line; `event:` names it and `id:`
sets the last event id. An event not ended by a blank line before the end of the stream
is never dispatched (the standard: pending data is discarded), which is how a cut stream
loses no more than its unfinished event.

Lines never split inside a UTF-8 sequence (CR and LF are single bytes that no multi-byte
sequence contains), so each line is decoded on its own, invalid bytes replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Event:
    data: str
    type: str = "message"
    id: str = ""  # the last event id when it was dispatched


class EventStream:
    """Feed it bytes (`feed`), get the events completed by them. `comments` counts the
    comment lines seen (the keep-alives a server sends while its answer is queued)."""

    __slots__ = (
        "_buf",
        "_data",
        "_has_data",
        "_skip_lf",
        "_started",
        "_type",
        "comments",
        "last_id",
        "retry_ms",
    )

    def __init__(self) -> None:
        self._buf = b""  # an unfinished line (or, at the start, a possible BOM's first bytes)
        self._skip_lf = False  # the last line ended with CR: an LF right after belongs to it
        self._started = False  # past the possible BOM
        self._data: list[str] = []
        self._has_data = False
        self._type = ""
        self.last_id = ""
        self.retry_ms: int | None = None
        self.comments = 0

    def feed(self, chunk: bytes) -> list[Event]:
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf + chunk if self._buf else chunk
        if not self._started:
            if len(buf) < len(BOM) and BOM.startswith(buf):
                self._buf = buf  # a BOM's first bytes, or the stream's: wait for more
                return []
            self._started = True
            if buf.startswith(BOM):
                buf = buf[len(BOM):]
        lines = buf.splitlines(True)  # bytes split only at \r\n, \n, \r
        if lines and lines[-1][-1:] not in (b"\n", b"\r"):
            self._buf = lines.pop()
        else:
            self._buf = b""
            if buf[-1:] == b"\r":
                self._skip_lf = True
        events: list[Event] = []
        for raw in lines:
            line = raw.rstrip(b"\r\n")
            if not line:
                if self._has_data:
                    events.append(Event("\n".join(self._data), self._type or "message",
                                        self.last_id))
                self._data.clear()
                self._has_data = False
                self._type = ""
            elif line[:5] == b"data:":  # the common case first
                value = line[6:] if line[5:6] == b" " else line[5:]
                self._data.append(value.decode("utf-8", "replace"))
                self._has_data = True
            elif line[:1] == b":":
                self.comments += 1
            else:
                self._field(line.decode("utf-8", "replace"))
        return events

    def _field(self, line: str) -> None:
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":  # reached only for a line that was not decoded as bytes above
            self._data.append(value)
            self._has_data = True
        elif name == "event":
            self._type = value
        elif name == "id":
            if "\x00" not in value:
                self.last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
        # any other field is ignored (the standard)
