"""One streamed chat-completion attempt: its chunks assembled into the answer a
non-streaming request would have had, and three timeouts instead of one wall.

A thinking answer may run 15 minutes; a silent non-streaming request cannot tell that from
a stalled provider, so it needs a wall that cuts the longest answers. A stream shows
liveness: the request is given up only when (docs/generator.md "Streaming")
- no `data:` event came within `--first-token-timeout` of the request (OpenRouter's
  `: OPENROUTER PROCESSING` comments while the answer is queued do not extend it), or
- no byte came for `--idle-timeout` once the answer began, or
- the whole request ran past `--request-timeout` (a generous cap).
Each is its own error kind, retried as a server failure. The deltas (`content`,
`reasoning`, vLLM's `reasoning_content` and `token_ids`), the first `id`/`model`/
`provider`, the last `finish_reason`/`native_finish_reason` and the final usage chunk are
put back into the body a non-streaming request would have got, which the non-streaming
code classifies (client.classify_data): one taxonomy, and the same record for the same
answer. A mid-stream `error` event is classified by its code like an error body; a stream
that ends before `[DONE]` or a finish (EOF, reset) is `stream_cut`, a retried server
failure: a partial answer is never recorded. A server that answers with plain JSON is
read as the non-streaming answer it is.

The deadlines cost nothing per chunk: a read notes its time in a slot, and one watchdog
task per run scans the open streams a few times a second; an overdue stream gets a
`StreamTimeout` set on its reader, which wakes the pending read. Cancelling the attempt
(a stop) propagates at once and closes the connection, never drains it: closing is how
OpenRouter is told to stop generating, and billing.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from payload.generate import client
from payload.generate.client import Kind, Outcome
from payload.generate.sse import EventStream
from payload.redact import redact

DONE = "[DONE]"
# How long a connection may take to open (the non-streaming path's sock_connect too).
CONNECT_TIMEOUT_S = 60.0
# How long the end of a body may lag its `[DONE]` before the connection is closed instead.
DONE_GRACE_S = 2.0


@dataclass(frozen=True)
class Timeouts:
    """`--idle-timeout`, `--first-token-timeout`, `--request-timeout` (seconds)."""

    idle: float = 120.0
    first_token: float = 600.0
    total: float = 3600.0


class StreamTimeout(Exception):
    """Set on a stream's reader by the watchdog: its pending read raises it."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Watch:
    """One open stream's deadlines. `last` is written on every read once the answer began;
    the watchdog reads it."""

    __slots__ = ("began", "content", "end_by", "first_by", "idle", "last", "on_began")

    def __init__(self, content: aiohttp.StreamReader, started: float, t: Timeouts,
                 on_began: Callable[[], object] | None = None) -> None:
        self.content = content
        self.on_began = on_began  # told once, at the first data event
        self.first_by = started + t.first_token
        self.end_by = started + t.total
        self.last = started
        self.began = False  # a data event came: the idle timeout applies from now on
        self.idle = t.idle  # shortened once [DONE] came (the wait for the body's end)


class Watchdog:
    """The run's one timer task for every open stream (started with the first stream,
    ended when none is open)."""

    def __init__(self, timeouts: Timeouts, tick: float | None = None) -> None:
        self.t = timeouts
        # A few looks per shortest timeout: a deadline is seen at most a tick late.
        self.tick = tick if tick is not None else min(
            1.0, max(0.005, min(timeouts.idle, timeouts.first_token, timeouts.total) / 8))
        self._open: set[_Watch] = set()
        self._task: asyncio.Task[None] | None = None
        # When a stream last received a byte of its answer (seen at a tick): the run's
        # stall watch counts that as liveness, as it counts an answer.
        self.progress_at = 0.0

    def watch(self, content: aiohttp.StreamReader, started: float,
              on_began: Callable[[], object] | None = None) -> _Watch:
        w = _Watch(content, started, self.t, on_began)
        self._open.add(w)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return w

    def forget(self, w: _Watch) -> None:
        self._open.discard(w)

    async def _run(self) -> None:
        try:
            while self._open:
                await asyncio.sleep(self.tick)
                now = time.monotonic()
                self.progress_at = max(self.progress_at, max(
                    (w.last for w in self._open if w.began), default=0.0))
                for w in [w for w in self._open if now > w.end_by or (
                        now - w.last > w.idle if w.began else now > w.first_by)]:
                    self._open.discard(w)
                    w.content.set_exception(self.expired(
                        began=w.began, first_token_due=now <= w.end_by))
        finally:
            self._task = None

    def expired(self, *, began: bool, first_token_due: bool) -> StreamTimeout:
        """The timeout that ended a stream: the overall cap unless the answer had not begun
        by --first-token-timeout or went silent for --idle-timeout."""
        t = self.t
        if not first_token_due:
            return StreamTimeout("timeout", f"the request ran past {t.total:g}s "
                                 "(--request-timeout)")
        if began:
            return StreamTimeout("idle_timeout", f"the stream was silent for {t.idle:g}s "
                                 "after the answer began (--idle-timeout)")
        return StreamTimeout("first_token_timeout", f"no answer began within "
                             f"{t.first_token:g}s (--first-token-timeout)")


class _Text:
    """A field's deltas, joined 64 at a time: 2,000 answers of 1,000 deltas held as a few
    dozen compact strings each, not two million small ones (a str is 49 bytes and up)."""

    __slots__ = ("blocks", "tail")

    def __init__(self) -> None:
        self.blocks: list[str] = []
        self.tail: list[str] = []

    def add(self, text: str) -> None:
        tail = self.tail
        tail.append(text)
        if len(tail) >= 64:
            self.blocks.append("".join(tail))
            tail.clear()

    def text(self) -> str:
        return "".join(self.blocks) + "".join(self.tail)


class Assembly:
    """The chunks of one stream, put back together as the body a non-streaming request
    would have got (client.classify_data reads it)."""

    __slots__ = (
        "bad_ids",
        "choice_error",
        "content",
        "error",
        "finish",
        "id",
        "model",
        "native",
        "provider",
        "reasoning",
        "reasoning_content",
        "token_ids",
        "usage",
    )

    def __init__(self) -> None:
        self.id: Any = None
        self.model: Any = None
        self.provider: Any = None
        self.content: _Text | None = None  # None: no chunk had the field
        self.reasoning: _Text | None = None
        self.reasoning_content: _Text | None = None
        self.token_ids: array[int] | list[int] | None = None  # 8 bytes an id, not 36
        self.bad_ids = False  # a chunk's ids were not all ints: none are kept (as plain)
        self.finish: Any = None
        self.native: Any = None
        self.usage: Any = None
        self.error: Any = None  # a mid-stream error event's `error`
        self.choice_error: Any = None

    def add(self, chunk: Any) -> bool:
        """One chunk; False when it is not a chunk (not a JSON object)."""
        if not isinstance(chunk, dict):
            return False
        if chunk.get("error"):
            self.error = chunk["error"]
        if self.id is None:
            self.id = chunk.get("id")
        if self.model is None:
            self.model = chunk.get("model")
        if self.provider is None:
            self.provider = chunk.get("provider")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return True  # the usage chunk (no choices), or a keep-alive
        choice = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if isinstance(text := delta.get("content"), str):
                if self.content is None:
                    self.content = _Text()
                self.content.add(text)
            if isinstance(text := delta.get("reasoning"), str):
                if self.reasoning is None:
                    self.reasoning = _Text()
                self.reasoning.add(text)
            if isinstance(text := delta.get("reasoning_content"), str):
                if self.reasoning_content is None:
                    self.reasoning_content = _Text()
                self.reasoning_content.add(text)
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self._ids(ids)
        if (finish := choice.get("finish_reason")) is not None:
            self.finish = finish
        if (native := choice.get("native_finish_reason")) is not None:
            self.native = native
        if choice.get("error"):
            self.choice_error = choice["error"]
        return True

    def _ids(self, ids: list[Any]) -> None:
        """One chunk's ids, kept whatever they are until the end, where the plain path's
        check (client.sampled_ids) judges the whole list."""
        if self.bad_ids:
            return
        if not all(type(i) is int for i in ids):  # what sampled_ids refuses (bools too)
            self.bad_ids = True
            return
        if self.token_ids is None:
            self.token_ids = array("q")
        if isinstance(self.token_ids, array):
            try:
                self.token_ids.extend(array("q", ids))
                return
            except OverflowError:  # beyond 64 bits: a list from now on
                self.token_ids = self.token_ids.tolist()
        self.token_ids.extend(ids)

    @property
    def finished(self) -> bool:
        return self.finish is not None or bool(self.error)

    def body(self) -> dict[str, Any]:
        if self.error:
            return {"id": self.id, "error": self.error}
        message: dict[str, Any] = {"role": "assistant",
                                   "content": None if self.content is None
                                   else self.content.text()}
        if self.reasoning is not None:
            message["reasoning"] = self.reasoning.text()
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content.text()
        choice: dict[str, Any] = {"index": 0, "finish_reason": self.finish, "message": message}
        if self.native is not None:
            choice["native_finish_reason"] = self.native
        if self.bad_ids:
            choice["token_ids"] = None
        elif self.token_ids is not None:
            choice["token_ids"] = (self.token_ids.tolist() if isinstance(self.token_ids, array)
                                   else self.token_ids)
        if self.choice_error:
            choice["error"] = self.choice_error
        body: dict[str, Any] = {"id": self.id, "model": self.model, "provider": self.provider,
                                "choices": [choice]}
        if self.usage is not None:
            body["usage"] = self.usage
        return body


def is_event_stream(content_type: str | None) -> bool:
    return content_type is not None and \
        content_type.split(";", 1)[0].strip().lower() == "text/event-stream"


def _failure(kind: str, message: str) -> Outcome:
    return Outcome(Kind.RETRY, None, kind, message, server_failure=True)


def _malformed(what: str) -> Outcome:
    return Outcome(Kind.RETRY, 200, "malformed_json", f"a stream event was not {what}")


def _take(events: Any, asm: Assembly) -> Outcome | bool:
    """Events into the assembly: True at `[DONE]` or an error event, an Outcome for an
    event that is no chunk, else False (more to come)."""
    for ev in events:
        data = ev.data
        if data == DONE:
            return True
        try:
            chunk = json.loads(data)
        except ValueError:
            return _malformed("JSON")
        if not asm.add(chunk):
            return _malformed("a JSON object")
        if asm.error:
            return True
    return False


def _classified(asm: Assembly, generation_id: str | None, think: str) -> Outcome:
    return client.classify_data(200, asm.body(), None, generation_id, think)


def _feed(reader: EventStream, asm: Assembly, w: _Watch, chunk: bytes) -> Outcome | bool | None:
    """One read into the assembly: None at the body's end, else as `_take` (False: no
    whole event yet, or more to come)."""
    if not chunk:
        return None
    if w.began:
        w.last = time.monotonic()
    events = reader.feed(chunk)
    if not events:
        return False
    if not w.began:
        w.began, w.last = True, time.monotonic()
        if w.on_began is not None:
            w.on_began()
    return _take(events, asm)


async def _read_events(resp: aiohttp.ClientResponse, w: _Watch, think: str) -> Outcome:
    """Read the stream to `[DONE]`, an error event, or its end."""
    reader, asm = EventStream(), Assembly()
    content = resp.content
    gen_id = resp.headers.get("X-Generation-Id")
    while True:
        # The read's bytes and events are never locals of this coroutine, so a stream
        # waiting for its next read holds neither (at 2000 streams behind a busy CPU a
        # read is tens of KB: kept across each wait, they were most of the peak RSS).
        got = _feed(reader, asm, w, await content.readany())
        if got is None:
            break
        if isinstance(got, Outcome):
            return got
        if got:
            if not asm.error:
                await _to_end(content, w)
            return _classified(asm, gen_id, think)
    if not asm.finished:
        return _failure("stream_cut", "the stream ended before the answer did (no [DONE] "
                                      "and no finish_reason): nothing recorded, asked again")
    return _classified(asm, gen_id, think)  # a finish, then EOF without [DONE]: whole


async def _to_end(content: aiohttp.StreamReader, w: _Watch) -> None:
    """After `[DONE]`: read the body's end (it comes with it), so that the connection is
    reused, not closed; a server that keeps the stream open gets DONE_GRACE_S, then the
    connection is closed (the answer stands either way)."""
    w.idle, w.last = min(w.idle, DONE_GRACE_S), time.monotonic()
    try:
        while not content.at_eof():
            if not await content.readany():
                break
    except (StreamTimeout, aiohttp.ClientError, OSError):
        pass


def _whole_body(status: int, raw: bytes, h: Any, think: str) -> Outcome:
    """A body read whole: JSON (a server that does not stream, or an error), or an event
    stream sent without its content type."""
    gen_id = h.get("X-Generation-Id")
    if status == 200 and client.looks_like_sse(raw, h.get("Content-Type")):
        try:
            json.loads(raw)
        except ValueError:
            asm = Assembly()
            got = _take(EventStream().feed(raw + b"\n\n"), asm)
            if isinstance(got, Outcome):
                return got
            if not got and not asm.finished:
                return _failure("stream_cut", "the stream ended before the answer did")
            return _classified(asm, gen_id, think)
    return client.classify_body(
        status, raw, client.parse_retry_after(h.get("Retry-After"), h.get("retry-after-ms")),
        h.get("Content-Type"), gen_id, think)


async def _headers(request: Any, within: float) -> aiohttp.ClientResponse:
    """The response's headers, within `within` s. `asyncio.timeout` (3.11+), not
    `wait_for`: before 3.12, `wait_for` returns the result when the response and a
    cancellation arrive together, swallowing the cancellation (a stop's cancelled stream
    would then be read to its end)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(within):
            return await request
    return await asyncio.wait_for(request, within)


def session_timeout() -> aiohttp.ClientTimeout:
    """aiohttp's own timeouts for streamed requests: the connect only (the watchdog keeps
    the rest; a `sock_read` would re-arm a timer on every chunk)."""
    return aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)


async def attempt(session: aiohttp.ClientSession, url: str, body: bytes,
                  headers: dict[str, str], watchdog: Watchdog, proxy: str | None = None,
                  think: str = "split", on_began: Callable[[], object] | None = None
                  ) -> Outcome:
    """One streamed POST; never raises for network trouble or a timeout (each becomes a
    RETRY outcome); a cancellation propagates and closes the connection. `on_began` is
    called at the answer's first data event (the server took the request)."""
    started = time.monotonic()
    t = watchdog.t
    resp: aiohttp.ClientResponse | None = None
    w: _Watch | None = None
    whole = False  # read to its end: the connection may be reused
    try:
        try:
            resp = await _headers(session.post(url, data=body, headers=headers,
                                               timeout=session_timeout(), proxy=proxy),
                                  min(t.first_token, t.total))
        except asyncio.TimeoutError as exc:
            if isinstance(exc, aiohttp.ServerTimeoutError):
                raise  # aiohttp's connect timeout: below
            # no headers by the first of the two deadlines
            expired = watchdog.expired(began=False, first_token_due=t.first_token < t.total)
            outcome = _failure(expired.kind, str(expired))
        else:
            w = watchdog.watch(resp.content, started, on_began)
            if resp.status == 200 and is_event_stream(resp.headers.get("Content-Type")):
                outcome = await _read_events(resp, w, think)
                whole = resp.content.at_eof()
            else:
                raw = await resp.read()
                whole = True
                outcome = _whole_body(resp.status, raw, resp.headers, think)
    except StreamTimeout as exc:
        outcome = _failure(exc.kind, str(exc))
    except asyncio.TimeoutError:  # aiohttp's connect timeout
        outcome = _failure("timeout", "request timed out")
    except (aiohttp.ClientError, ConnectionError, OSError) as exc:
        kind = "stream_cut" if resp is not None else "connection"
        outcome = _failure(kind, redact(f"{type(exc).__name__}: {exc}")[:300])
    finally:
        if w is not None:
            watchdog.forget(w)
        if resp is not None:
            if whole:
                resp.release()
            else:
                resp.close()  # not drained: closing is what stops the provider's bill
    outcome.latency_s = time.monotonic() - started
    return outcome
