"""handoff.ssh.sftp against a scripted SFTP server: answers out of order, short answers, an
error status, a reader that stops early; the writer's acknowledgements; and ChunkPipe
behaving as paramiko's BufferedPipe (the channel buffer it replaces). The same code runs
against OpenSSH's sftp-server in tests/integration/test_transfer.py."""

from __future__ import annotations

import os
import struct
import threading
from typing import Any

import pytest
from paramiko.buffered_pipe import BufferedPipe, PipeTimeout

from handoff.ssh import sftp


class ScriptedServer:
    """Plays an SFTP server on a fake channel: parses the READ/WRITE requests sent to it and
    answers them, in the order and the sizes `answer` decides."""

    def __init__(self, data: bytes, *, order: str = "fifo", serve_max: int | None = None,
                 fail_at: int | None = None) -> None:
        self.data = bytearray(data)
        self.order = order
        self.serve_max = serve_max
        self.fail_at = fail_at
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.requests: list[tuple[int, int, int]] = []  # (id, offset, length) not yet answered
        self.sends = 0
        self.request_number = 1
        self._lock = threading.Lock()

    # -- what sftpio uses of an SFTPClient and its channel ------------------------------------
    @property
    def sock(self) -> ScriptedServer:
        return self

    def sendall(self, data: bytes | memoryview) -> None:
        self.sends += 1
        self.inbox += bytes(data)
        while len(self.inbox) >= 4:
            (n,) = struct.unpack_from(">I", self.inbox)
            if len(self.inbox) < 4 + n:
                break
            packet, self.inbox = bytes(self.inbox[4 : 4 + n]), self.inbox[4 + n :]
            self.handle(packet)

    def recv(self, n: int) -> bytes:
        if not self.outbox:
            self.answer_some()
        out, self.outbox = bytes(self.outbox[:n]), self.outbox[n:]
        return out

    def recv_ready(self) -> bool:
        return bool(self.outbox)

    # -- the server ----------------------------------------------------------------------------
    def handle(self, packet: bytes) -> None:
        kind, num, hlen = struct.unpack_from(">BII", packet)
        offset, length = struct.unpack_from(">QI", packet, 9 + hlen)
        if kind == sftp.FXP_WRITE:
            data = packet[9 + hlen + 12 : 9 + hlen + 12 + length]
            self.data[offset : offset + len(data)] = data
            self.status(num, 0)
        else:
            self.requests.append((num, offset, length))

    def status(self, num: int, code: int, message: bytes = b"") -> None:
        body = struct.pack(">BII", sftp.FXP_STATUS, num, code)
        body += struct.pack(">I", len(message)) + message + struct.pack(">I", 0)
        self.outbox += struct.pack(">I", len(body)) + body

    def answer_some(self) -> None:
        if not self.requests:
            raise AssertionError("the reader waits for an answer it never asked for")
        batch = list(reversed(self.requests)) if self.order == "reverse" else self.requests[:1]
        for req in batch:
            self.requests.remove(req)
            num, offset, length = req
            if self.fail_at is not None and offset >= self.fail_at:
                self.status(num, 4, b"Failure")
                continue
            if offset >= len(self.data):
                self.status(num, sftp.FX_EOF, b"End of file")
                continue
            chunk = bytes(self.data[offset : offset + min(length, self.serve_max or length)])
            body = struct.pack(">BII", sftp.FXP_DATA, num, len(chunk)) + chunk
            self.outbox += struct.pack(">I", len(body)) + body


def read_all(server: ScriptedServer, offset: int, end: int, **kw: Any) -> bytes:
    return b"".join(bytes(v) for v in sftp.read(server, b"H", offset, end, "t", **kw))  # type: ignore[arg-type]


DATA = os.urandom(100_000)


@pytest.mark.parametrize("order", ["fifo", "reverse"])
def test_bytes_come_out_in_order_whatever_the_answer_order(order: str) -> None:
    server = ScriptedServer(DATA, order=order)
    assert read_all(server, 123, len(DATA), depth=8, request=4096) == DATA[123:]
    assert not server.requests  # every answer collected


def test_short_answers_are_asked_again_for_the_rest() -> None:
    server = ScriptedServer(DATA, serve_max=1000)  # a server that serves less than asked
    assert read_all(server, 0, len(DATA), depth=4, request=4096) == DATA


def test_requests_go_out_several_per_send() -> None:
    server = ScriptedServer(DATA)
    read_all(server, 0, len(DATA), depth=16, request=1000)
    # 100 requests: the first 16 at once, then refills of at least 4 at a time.
    assert server.sends <= 1 + (100 - 16) // 4 + 1


def test_a_file_that_ends_early_and_an_error_status_raise_and_leave_nothing_in_flight() -> None:
    server = ScriptedServer(DATA)
    with pytest.raises(OSError, match="ended early"):
        read_all(server, 0, len(DATA) + 5000, depth=8, request=4096)
    assert not server.requests and not server.outbox
    server = ScriptedServer(DATA, fail_at=50_000)
    with pytest.raises(OSError, match="SFTP error 4: Failure"):
        read_all(server, 0, len(DATA), depth=8, request=4096)
    assert not server.requests and not server.outbox


def test_a_reader_that_stops_midway_leaves_the_channel_in_step() -> None:
    server = ScriptedServer(DATA, order="reverse")
    stream = sftp.read(server, b"H", 0, len(DATA), "t", depth=8, request=4096)  # type: ignore[arg-type]
    first = next(stream)
    assert bytes(first) == DATA[: len(first)]
    stream.close()
    assert not server.requests and not server.outbox  # the rest was collected, not left


def test_writer_pipelines_and_reports_a_refused_write() -> None:
    server = ScriptedServer(bytes(len(DATA)))
    writer = sftp.Writer(server, b"H", "t", depth=4, request=7000)  # type: ignore[arg-type]
    writer.write(DATA[:10])
    writer.write(memoryview(DATA)[10:])
    writer.finish()
    assert bytes(server.data) == DATA and not server.outbox

    class Refusing(ScriptedServer):
        def handle(self, packet: bytes) -> None:
            num = struct.unpack_from(">I", packet, 1)[0]
            self.status(num, 3, b"Permission denied")

    writer = sftp.Writer(Refusing(b""), b"H", "t", depth=4, request=7000)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="Permission denied"):
        writer.write(DATA)
        writer.finish()


def test_chunk_pipe_behaves_as_paramiko_s_buffered_pipe() -> None:
    for pipe in (BufferedPipe(), sftp.ChunkPipe()):
        event = threading.Event()
        pipe.set_event(event)
        assert not event.is_set() and not pipe.read_ready() and len(pipe) == 0
        pipe.feed(b"hello ")
        pipe.feed(b"world")
        assert event.is_set() and pipe.read_ready() and len(pipe) == 11
        assert pipe.read(3) == b"hel"  # less than is there
        assert pipe.read(100) == b"lo world"  # all that is there
        assert not event.is_set()
        with pytest.raises(PipeTimeout):
            pipe.read(10, timeout=0.01)
        threading.Timer(0.05, pipe.feed, args=(b"late",)).start()
        assert pipe.read(10, timeout=5) == b"late"  # a reader waits for the feed
        pipe.feed(b"rest")
        assert pipe.empty() == b"rest" and len(pipe) == 0
        pipe.feed(b"x")
        pipe.close()
        assert pipe.read(10) == b"x" and pipe.read(10) == b""  # then closed: end of data
