"""The OpenAI Batch API as `generate --mode batch` speaks it: one call each, typed answers.

`POST /files` (multipart, `purpose=batch`) uploads a JSONL of requests; `POST /batches`
(`input_file_id`, `endpoint: /v1/chat/completions`, `completion_window: 24h`, `metadata`)
submits it; `GET /batches/{id}` polls it; `GET /files/{id}/content` downloads its output
and error files; `POST /batches/{id}/cancel` cancels it; `GET /files?purpose=batch` and
`GET /batches` list what the provider holds, newest first, so a run that died between the
provider's answer and its own record finds the file or batch it made instead of making
another.

Every call either returns its typed answer or raises `ApiError`, whose `outcome` is the
answer classified by the chat client's own taxonomy (`client.classify_body`: 401 auth,
402 credit, 429 and 5xx retryable, other 4xx permanent; a network failure or timeout is
retryable), so the run decides retry, stop or fall back in one place. What a provider
answers is checked field by field (`BatchInfo.from_json`): an id or a state that is not a
plain string is an error, never a path or a crash.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from payload.errors import Stopped
from payload.generate.client import Kind, Outcome, classify_body, parse_retry_after
from payload.redact import redact

ENDPOINT = "/v1/chat/completions"  # the `url` of every line and the batch's `endpoint`
COMPLETION_WINDOW = "24h"
ACTIVE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
STATES = ACTIVE | TERMINAL
# Listing pages read while looking for a batch or file this job made (100 each): enough for
# a run's own recent ones, bounded for an account with thousands.
MAX_LIST_PAGES = 20
_ENDED = ("completed_at", "failed_at", "expired_at", "cancelled_at")


class ApiError(Stopped):
    """A Batch API call that did not succeed: what it was, and its classified outcome. The
    run decides what each means (retry, stop, fall back); one that reaches the command line
    is a stop, resumable by rerunning (exit 3)."""

    def __init__(self, what: str, outcome: Outcome) -> None:
        super().__init__(f"{what}: {outcome.status or ''} {outcome.type}: "
                         f"{outcome.message}".replace(":  ", ": "))
        self.what = what
        self.outcome = outcome

    @property
    def missing(self) -> bool:
        """The server has no such route (no Batch API): 404, 405 or 501."""
        return self.outcome.status in (404, 405, 501)


def _text(value: Any, limit: int = 200) -> str | None:
    return value[:limit] if isinstance(value, str) and value and value.isprintable() else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _time(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


@dataclass(frozen=True)
class BatchInfo:
    """A batch as the provider describes it (the fields the run reads, checked)."""

    id: str
    status: str
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    created_at: float | None = None
    ended_at: float | None = None  # completed/failed/expired/cancelled_at
    metadata: dict[str, str] = field(default_factory=dict)
    errors: tuple[str, ...] = ()  # why it failed (errors.data[].message, with the line)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, raw: Any, what: str = "batch") -> BatchInfo:
        if not isinstance(raw, dict):
            raise ApiError(what, Outcome(Kind.RETRY, 200, "malformed_json",
                                         "the batch is not a JSON object"))
        bid, status = _text(raw.get("id")), _text(raw.get("status"), 40)
        if bid is None or status not in STATES:
            raise ApiError(what, Outcome(Kind.RETRY, 200, "malformed_json",
                                         f"a batch with id {raw.get('id')!r} and status "
                                         f"{raw.get('status')!r}"))
        counts: dict[str, Any] = raw["request_counts"] if isinstance(
            raw.get("request_counts"), dict) else {}
        meta: dict[str, Any] = raw["metadata"] if isinstance(raw.get("metadata"), dict) else {}
        errs = raw.get("errors")
        data = errs.get("data") if isinstance(errs, dict) else None
        messages = []
        for e in data if isinstance(data, list) else []:
            if isinstance(e, dict):
                line = f"line {e['line']}: " if isinstance(e.get("line"), int) else ""
                messages.append(redact(f"{line}{e.get('code') or ''} {e.get('message') or ''}")
                                .strip()[:300])
        ended = next((t for t in (_time(raw.get(k)) for k in _ENDED) if t is not None), None)
        return cls(bid, status, _text(raw.get("input_file_id")), _text(raw.get("output_file_id")),
                   _text(raw.get("error_file_id")), _count(counts.get("total")),
                   _count(counts.get("completed")), _count(counts.get("failed")),
                   _time(raw.get("created_at")), ended,
                   {str(k): str(v) for k, v in meta.items() if isinstance(v, str)},
                   tuple(messages[:10]))


class BatchAPI:
    """The calls, on the run's aiohttp session. `headers` carry the key (never logged)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, headers: dict[str, str],
                 proxy: str | None = None, timeout_s: float = 600.0) -> None:
        self.session = session
        self.base = base_url.rstrip("/")
        # No JSON content type on the multipart upload: aiohttp sets the boundary's.
        self.headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        self.proxy = proxy
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=60, sock_read=120)

    async def _call(self, what: str, method: str, path: str, *, json_body: Any = None,
                    data: Any = None, params: dict[str, str] | None = None) -> Any:
        """One request; its JSON answer, or ApiError."""
        headers = dict(self.headers)
        if json_body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(json_body).encode("utf-8")
        try:
            async with self.session.request(method, self.base + path, data=data, params=params,
                                            headers=headers, timeout=self.timeout,
                                            proxy=self.proxy) as resp:
                raw = await resp.read()
                status, h = resp.status, resp.headers
        except asyncio.TimeoutError:
            raise ApiError(what, Outcome(Kind.RETRY, None, "timeout", "request timed out",
                                         server_failure=True)) from None
        except (aiohttp.ClientError, ConnectionError, OSError) as exc:
            raise ApiError(what, Outcome(Kind.RETRY, None, "connection",
                                         redact(f"{type(exc).__name__}: {exc}")[:300],
                                         server_failure=True)) from None
        if status == 200 or status == 201 or status == 202:
            try:
                return json.loads(raw)
            except ValueError:
                raise ApiError(what, Outcome(Kind.RETRY, status, "malformed_json",
                                             "the answer is not JSON")) from None
        retry_after = parse_retry_after(h.get("Retry-After"), h.get("retry-after-ms"))
        raise ApiError(what, classify_body(status, raw, retry_after, h.get("Content-Type")))

    # -- files -------------------------------------------------------------------------------
    async def upload(self, path: Path, filename: str) -> str:
        """Upload a JSONL of requests (`purpose=batch`): the file's id."""
        with path.open("rb") as fh:
            form = aiohttp.FormData()
            form.add_field("purpose", "batch")
            form.add_field("file", fh, filename=filename, content_type="application/jsonl")
            answer = await self._call("uploading the batch's requests", "POST", "/files",
                                      data=form)
        fid = _text(answer.get("id")) if isinstance(answer, dict) else None
        if fid is None:
            raise ApiError("uploading the batch's requests", Outcome(
                Kind.RETRY, 200, "malformed_json", "the file answer has no id"))
        return fid

    async def find_file(self, filename: str) -> str | None:
        """The id of the newest `purpose=batch` file named `filename`, if the provider holds
        one (an upload whose answer was lost)."""
        after: str | None = None
        for _ in range(MAX_LIST_PAGES):
            params = {"purpose": "batch", "limit": "100", **({"after": after} if after else {})}
            page = await self._call("listing batch files", "GET", "/files", params=params)
            data = page.get("data") if isinstance(page, dict) else None
            if not isinstance(data, list):
                return None
            for f in data:
                if isinstance(f, dict) and f.get("filename") == filename:
                    return _text(f.get("id"))
            if not page.get("has_more") or not data:
                return None
            after = _text(data[-1].get("id")) if isinstance(data[-1], dict) else None
            if after is None:
                return None
        return None

    async def content(self, file_id: str, dest: Path) -> None:
        """A file's bytes, streamed to `dest` (an output file may be hundreds of MB)."""
        what = f"downloading file {file_id}"
        try:
            async with self.session.get(f"{self.base}/files/{file_id}/content",
                                        headers=self.headers, timeout=self.timeout,
                                        proxy=self.proxy) as resp:
                if resp.status != 200:
                    raw = await resp.read()
                    raise ApiError(what, classify_body(resp.status, raw, parse_retry_after(
                        resp.headers.get("Retry-After"), resp.headers.get("retry-after-ms"))))
                with dest.open("wb") as fh:
                    async for chunk in resp.content.iter_chunked(1 << 20):
                        fh.write(chunk)
        except asyncio.TimeoutError:
            raise ApiError(what, Outcome(Kind.RETRY, None, "timeout", "download timed out",
                                         server_failure=True)) from None
        except (aiohttp.ClientError, ConnectionError) as exc:
            raise ApiError(what, Outcome(Kind.RETRY, None, "connection",
                                         redact(f"{type(exc).__name__}: {exc}")[:300],
                                         server_failure=True)) from None

    # -- batches -----------------------------------------------------------------------------
    async def create(self, file_id: str, metadata: dict[str, str]) -> BatchInfo:
        answer = await self._call("submitting the batch", "POST", "/batches", json_body={
            "input_file_id": file_id, "endpoint": ENDPOINT,
            "completion_window": COMPLETION_WINDOW, "metadata": metadata})
        return BatchInfo.from_json(answer, "submitting the batch")

    async def get(self, batch_id: str) -> BatchInfo:
        return BatchInfo.from_json(await self._call(f"polling batch {batch_id}", "GET",
                                                    f"/batches/{batch_id}"))

    async def cancel(self, batch_id: str) -> BatchInfo:
        return BatchInfo.from_json(await self._call(f"cancelling batch {batch_id}", "POST",
                                                    f"/batches/{batch_id}/cancel"))

    async def list_page(self, limit: int = 100, after: str | None = None
                        ) -> tuple[list[BatchInfo], bool]:
        """One page of the provider's batches, newest first, and whether more follow."""
        params = {"limit": str(limit), **({"after": after} if after else {})}
        page = await self._call("listing batches", "GET", "/batches", params=params)
        data = page.get("data") if isinstance(page, dict) else None
        if not isinstance(data, list):
            raise ApiError("listing batches", Outcome(Kind.RETRY, 200, "malformed_json",
                                                      "the list has no data"))
        out = []
        for raw in data:
            try:
                out.append(BatchInfo.from_json(raw, "listing batches"))
            except ApiError:
                continue  # someone else's odd batch: not ours either way
        return out, bool(page.get("has_more")) and bool(out)

    async def find_batch(self, file_id: str, tag: str) -> BatchInfo | None:
        """The batch made from `file_id` (or carrying our metadata `tag`), if one exists: a
        submission whose answer was lost (the run was killed, the connection dropped)."""
        after: str | None = None
        for _ in range(MAX_LIST_PAGES):
            batches, more = await self.list_page(100, after)
            for b in batches:
                if b.input_file_id == file_id or b.metadata.get("handoff") == tag:
                    return b
            if not more:
                return None
            after = batches[-1].id
        return None

    async def probe(self) -> None:
        """Does the server have a Batch API? `GET /batches?limit=1`: returns, or ApiError
        (`missing` when the route does not exist)."""
        await self.list_page(1)


__all__ = ["ACTIVE", "COMPLETION_WINDOW", "ENDPOINT", "TERMINAL", "ApiError", "BatchAPI",
           "BatchInfo"]
