"""Bulk SFTP at wire speed: large reads and writes, many in flight, parsed as a stream.

Why not paramiko's own file reads and writes: `SFTPFile` moves 32 KiB per request, builds
and parses a `Message` for each, and its channel asks the server for 32 KiB SSH packets
in a 2 MiB window. On loopback that made `fab fetch` of 1 GB take 2.2x the time of `scp`
and 8 s of CPU (BENCHMARKS.md, "Transfers"). Here a file moves in requests of REQUEST
bytes (255 KiB: what OpenSSH's sftp-server serves in one answer), DEPTH of them in
flight, on a channel with PACKET (256 KiB) packets and a WINDOW (32 MiB) window (which
handoff.host.session opens), and read answers are parsed as a byte stream: their data is handed
on as slices of what the channel delivered, never gathered into one message first.

The protocol is SFTP v3 (draft-ietf-secsh-filexfer-02), the version OpenSSH speaks. Files
are opened and closed through paramiko's `SFTPClient`; this module shares its request
numbers (taken under its lock) and always collects every answer it asked for before it
returns, also on failure, so the client never sees a stray answer. A server that answers a
read with fewer bytes than asked (a smaller limit than OpenSSH's) gets the rest asked
again; one that answers out of order is buffered back into order (at most DEPTH answers).
A channel that fails raises what paramiko raises (EOFError, SSHException, a timeout); the
session turns those into its own errors.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterator
from typing import Any

import paramiko
from paramiko.buffered_pipe import BufferedPipe

REQUEST = 255 * 1024  # OpenSSH sftp-server: SFTP_MAX_MSG_LENGTH (256 KiB) - 1 KiB
DEPTH = 32  # requests in flight per file: 8 MiB, enough for 1 Gbit/s at 60 ms
WINDOW = 32 * 2**20  # the channel's receive window: DEPTH x REQUEST fits, with room
PACKET = 2**18  # largest SSH packet we accept (OpenSSH sends up to 256 KiB)

# SFTP v3 packet types and status codes (draft-ietf-secsh-filexfer-02, section 3 and 7).
FXP_READ, FXP_WRITE, FXP_STATUS, FXP_DATA = 5, 6, 101, 103
FX_OK, FX_EOF = 0, 1


class _Chunks:
    """What paramiko's BufferedPipe keeps in its `_buffer` array, kept as the bytes objects
    the transport hands over: adding one copies nothing, and taking all that is there (what
    `_Inbound` does) copies nothing when it is one piece, once otherwise. paramiko's array
    copies every byte three times on the way (frombytes, a slice, tobytes): a third of the
    reading thread's time in a 1 GB fetch."""

    def __init__(self) -> None:
        self.parts: deque[bytes] = deque()
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, data: bytes) -> None:
        self.parts.append(data)
        self.size += len(data)

    def head(self, limit: int | None) -> bytes:
        if limit is None or limit >= self.size:
            return b"".join(self.parts)
        out = bytearray()
        for part in self.parts:
            if len(out) + len(part) >= limit:
                out += part[: limit - len(out)]
                break
            out += part
        return bytes(out)

    def __delitem__(self, key: slice) -> None:
        n = self.size if key.stop is None else min(key.stop, self.size)
        self.size -= n
        while n:
            part = self.parts[0]
            if len(part) <= n:
                self.parts.popleft()
                n -= len(part)
            else:
                self.parts[0] = part[n:]
                n = 0


class ChunkPipe(BufferedPipe):
    """paramiko's BufferedPipe (a channel's receive buffer: locking, waiting, events, close
    as before) storing the data in `_Chunks`, through the two methods paramiko provides for
    that. paramiko is pinned (pyproject), and tests/handoff/ssh/test_sftp.py checks it still
    behaves as a BufferedPipe. Install it on a channel before any data can arrive."""

    def __init__(self) -> None:
        super().__init__()
        self._buffer = _Chunks()

    def _buffer_frombytes(self, data: bytes) -> None:
        self._buffer.add(bytes(data))

    def _buffer_tobytes(self, limit: int | None = None) -> bytes:
        return self._buffer.head(limit)


def _next_id(sftp: paramiko.SFTPClient) -> int:
    """A request number paramiko's client will not reuse (it numbers under this lock)."""
    with sftp._lock:
        num = int(sftp.request_number)
        sftp.request_number = num + 1
    return num


def _status_error(body: bytes, what: str) -> OSError:
    """The OSError for a STATUS answer's body (code, message, language)."""
    code = struct.unpack_from(">I", body, 0)[0]
    message = ""
    if len(body) >= 8:
        (n,) = struct.unpack_from(">I", body, 4)
        message = body[8 : 8 + n].decode("utf-8", "replace")
    if code == FX_EOF:
        return OSError(f"{what}: the file ended early (shortened or replaced meanwhile)")
    return OSError(f"{what}: SFTP error {code}: {message or 'failure'}")


class _Inbound:
    """The channel's bytes, with what was read but not yet consumed kept aside."""

    def __init__(self, chan: Any) -> None:
        self.chan = chan
        self.pending = memoryview(b"")
        self.owed = 0  # bytes of the answer being handed on that are still to come

    def chunk(self) -> memoryview:
        """What is buffered, else the next bytes from the channel (blocking)."""
        if not self.pending:
            data = self.chan.recv(WINDOW)  # all that is buffered: one copy out of paramiko
            if not data:
                raise OSError("the SFTP channel closed (connection dropped)")
            self.pending = memoryview(data)
        return self.pending

    def consume(self, n: int) -> memoryview:
        view = self.pending[:n]
        self.pending = self.pending[n:]
        return view

    def exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            out += self.consume(min(n - len(out), len(self.chunk())))
        return bytes(out)

    def ready(self) -> bool:
        return bool(self.pending) or bool(self.chan.recv_ready())


def read(sftp: paramiko.SFTPClient, handle: bytes, offset: int, end: int, what: str,
         depth: int = DEPTH, request: int = REQUEST) -> Iterator[memoryview]:
    """The bytes [offset, end) of the open file `handle`, in order, as they arrive.

    Closing the iterator early still collects every answer in flight."""
    chan = sftp.sock
    inbound = _Inbound(chan)
    prefix = struct.pack(">I", len(handle)) + handle
    asked: dict[int, tuple[int, int]] = {}  # request id -> (offset, length)
    gaps: list[tuple[int, int]] = []  # rest of short answers, asked again first
    waiting: dict[int, bytes] = {}  # offset -> data that came before its turn
    issue_at, next_out = offset, offset

    def refill(free: int) -> None:
        """Ask for more while fewer than `depth` are in flight, once at least `free` slots
        are: several requests go in one SSH packet (one send, one wake-up of the server)."""
        nonlocal issue_at
        if depth - len(asked) < free:
            return
        packets = []
        while len(asked) < depth and (gaps or issue_at < end):
            if gaps:
                at, length = gaps.pop(0)
            else:
                at, length = issue_at, min(request, end - issue_at)
                issue_at += length
            num = _next_id(sftp)
            body = struct.pack(">BI", FXP_READ, num) + prefix + struct.pack(">QI", at, length)
            packets.append(struct.pack(">I", len(body)) + body)
            asked[num] = (at, length)
        if packets:
            chan.sendall(b"".join(packets))

    batch = max(1, depth // 4)
    try:
        refill(1)
        while next_out < end:
            size, kind, num = struct.unpack(">IBI", inbound.exact(9))
            if num not in asked:
                raise OSError(f"{what}: unexpected SFTP answer {num}")
            at, length = asked.pop(num)
            refill(batch)  # before handing this answer on: the server never waits for us
            if kind != FXP_DATA:
                body = inbound.exact(size - 5)
                raise _status_error(body, what) if kind == FXP_STATUS else OSError(
                    f"{what}: unexpected SFTP answer type {kind}")
            (got,) = struct.unpack(">I", inbound.exact(4))
            if got > length or size != 9 + got:
                raise OSError(f"{what}: malformed SFTP data answer")
            if got < length:
                gaps.append((at + got, length - got))
                refill(1)  # the rest of this answer comes before anything after it
            if at == next_out and not waiting:
                inbound.owed = got  # its turn: hand the data on as it arrives
                while inbound.owed:
                    view = inbound.consume(min(inbound.owed, len(inbound.chunk())))
                    inbound.owed -= len(view)
                    next_out += len(view)
                    yield view
            else:
                waiting[at] = inbound.exact(got)
            while next_out in waiting:
                data = waiting.pop(next_out)
                next_out += len(data)
                yield memoryview(data)
    finally:
        _drain(inbound, asked)


def _drain(inbound: _Inbound, asked: dict[Any, Any]) -> None:
    """Collect the answers still in flight (a stopped or failed transfer), so the SFTP
    client's next request reads its own answer. A dead channel has nothing to collect."""
    try:
        while inbound.owed:  # the rest of an answer whose reader stopped midway
            inbound.owed -= len(inbound.consume(min(inbound.owed, len(inbound.chunk()))))
        while asked:
            size, _kind, num = struct.unpack(">IBI", inbound.exact(9))
            inbound.exact(size - 5)
            asked.pop(num, None)
    except (OSError, EOFError, paramiko.SSHException):
        pass


class Writer:
    """Writes to the open file `handle` from offset 0 on, `depth` requests in flight (1:
    each write waits for its acknowledgement). `finish()` collects every acknowledgement
    and raises the first failure."""

    def __init__(self, sftp: paramiko.SFTPClient, handle: bytes, what: str,
                 depth: int = DEPTH, request: int = REQUEST) -> None:
        self.sftp = sftp
        self.chan = sftp.sock
        self.inbound = _Inbound(self.chan)
        self.prefix = struct.pack(">I", len(handle)) + handle
        self.what = what
        self.depth = depth
        self.request = request
        self.offset = 0
        self.asked: set[int] = set()
        self.error: OSError | None = None

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        for i in range(0, len(view), self.request):
            piece = view[i : i + self.request]
            num = _next_id(self.sftp)
            header = struct.pack(">BI", FXP_WRITE, num) + self.prefix + struct.pack(
                ">QI", self.offset, len(piece))
            self.chan.sendall(struct.pack(">I", len(header) + len(piece)) + header)
            self.chan.sendall(piece)
            self.asked.add(num)
            self.offset += len(piece)
            while self.asked and (len(self.asked) >= self.depth or self.inbound.ready()):
                self._ack()
        if self.error is not None:
            raise self.error

    def _ack(self) -> None:
        size, kind, num = struct.unpack(">IBI", self.inbound.exact(9))
        body = self.inbound.exact(size - 5)
        if num not in self.asked:
            raise OSError(f"{self.what}: unexpected SFTP answer {num}")
        self.asked.discard(num)
        if kind != FXP_STATUS:
            self.error = self.error or OSError(f"{self.what}: unexpected SFTP answer type {kind}")
        elif struct.unpack_from(">I", body, 0)[0] != FX_OK:
            self.error = self.error or _status_error(body, self.what)

    def finish(self) -> None:
        try:
            while self.asked:
                self._ack()
        except BaseException:
            _drain(self.inbound, {n: None for n in self.asked})
            self.asked.clear()
            raise
        if self.error is not None:
            raise self.error
