"""The SSE reader (payload/generate/sse.py) against the WHATWG event-stream rules, fed whole,
byte by byte, and split in two at every byte (how TCP may cut a stream)."""

from __future__ import annotations

import pytest

from payload.generate.sse import Event, EventStream


def feed_all(chunks: list[bytes]) -> tuple[list[Event], EventStream]:
    reader = EventStream()
    events: list[Event] = []
    for c in chunks:
        events.extend(reader.feed(c))
    return events, reader


def every_split(raw: bytes) -> list[list[bytes]]:
    """The stream whole, byte by byte, and cut once at every position."""
    splits = [[raw], [raw[i:i + 1] for i in range(len(raw))]]
    splits += [[raw[:i], raw[i:]] for i in range(1, len(raw))]
    return splits


OPENROUTER = (
    b": OPENROUTER PROCESSING\n\n"
    b": OPENROUTER PROCESSING\n\n"
    b'data: {"id":"gen-1","choices":[{"delta":{"content":"h\xc3\xa9"}}]}\n\n'
    b'data: {"id":"gen-1","choices":[{"delta":{"content":"llo"}}]}\n\n'
    b"data: [DONE]\n\n")


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_at_every_split_point(ending):
    raw = OPENROUTER.replace(b"\n", ending)
    want = ['{"id":"gen-1","choices":[{"delta":{"content":"hé"}}]}',
            '{"id":"gen-1","choices":[{"delta":{"content":"llo"}}]}', "[DONE]"]
    for chunks in every_split(raw):
        events, reader = feed_all(chunks)
        assert [e.data for e in events] == want, chunks
        assert all(e.type == "message" for e in events)
        assert reader.comments == 2


def test_multi_line_data_fields_and_ids_at_every_split_point():
    raw = (b"\xef\xbb\xbfevent: delta\r\nid: 7\r\ndata: one\r\ndata:two\r\ndata\r\n\r\n"
           b"data: three\r\n\r\n"
           b"id\r\ndata: four\r\n\r\n"
           b"event: x\r\n\r\n"  # no data: nothing dispatched, the type forgotten
           b"data: five\r\n\r\n"
           b"retry: 1500\r\nfoo: bar\r\n: a comment\r\n")
    want = [Event("one\ntwo\n", "delta", "7"), Event("three", "message", "7"),
            Event("four", "message", ""), Event("five", "message", "")]
    for chunks in every_split(raw):
        events, reader = feed_all(chunks)
        assert events == want, chunks
        assert reader.retry_ms == 1500 and reader.comments == 1


def test_a_leading_bom_is_dropped_once_and_only_at_the_start():
    for chunks in every_split(b"\xef\xbb\xbfdata: a\n\n"):
        assert [e.data for e in feed_all(chunks)[0]] == ["a"]
    # A second BOM is part of the first line: the field name is no longer `data`.
    assert feed_all([b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\n"])[0] == []
    # A short stream that only starts like a BOM is still read.
    assert [e.data for e in feed_all([b"\xef", b"\xbb"])[0]] == []
    assert [e.data for e in feed_all([b"d", b"ata: x\n", b"\n"])[0]] == ["x"]


def test_an_unfinished_event_is_never_dispatched():
    """A stream cut before the blank line loses only its last event (the standard)."""
    raw = b"data: a\n\ndata: b\ndata: c\n"
    for chunks in every_split(raw):
        assert [e.data for e in feed_all(chunks)[0]] == ["a"]


def test_value_space_rules_and_empty_data():
    events, _ = feed_all([b"data:  two spaces\n\ndata:\n\ndata\n\n"])
    assert [e.data for e in events] == [" two spaces", "", ""]


def test_invalid_utf8_is_replaced_not_fatal():
    events, _ = feed_all([b"data: \xff\xfe ok\n\n"])
    assert events[0].data == "\ufffd\ufffd ok"


def test_cr_then_lf_in_separate_reads_is_one_line_end():
    """The case a byte-wise parser gets wrong: `\\r` ends read 1, `\\n` starts read 2. Read
    as two line ends, the LF would be a blank line and dispatch the event early."""
    events, _ = feed_all([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"])
    assert [e.data for e in events] == ["a\nb"]
