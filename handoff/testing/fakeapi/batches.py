"""The fake OpenRouter's Batch API, in the shapes OpenAI specifies (`/files`, `/batches`).

- `POST /files` (multipart: `purpose=batch`, `file`) stores a JSONL of requests and answers
  the File object; `GET /files?purpose=&limit=&after=` lists files newest first;
  `GET /files/{id}/content` returns a file's bytes (an output or error file of a batch).
- `POST /batches` (`input_file_id`, `endpoint`, `completion_window`, `metadata`) creates a
  batch and runs it in the background through the states OpenAI names: `validating` →
  `in_progress` → `finalizing` → `completed`, or `failed` (validation: a bad line, a
  second model, more lines or bytes than the limits, or `fail_message`), `expired` (the
  first lines answered, the rest `batch_expired` in the error file), `cancelling` →
  `cancelled` (`POST /batches/{id}/cancel`: the lines answered so far in the output file,
  the rest `batch_cancelled` in the error file). `GET /batches/{id}` polls it (with
  `request_counts`), `GET /batches?limit=&after=` lists batches newest first.
- Each line is answered as a plain chat request would be (the same content, provider,
  usage), at the batch price (`price_factor` of the request's cost); a line named in
  `line_errors` gets that HTTP status instead (partial errors, in the error file).
- What a test proves with: `submissions_by_file` (batches created per input file: a second
  submission of the same requests shows as 2), `created`, `cancels`, `polls`, `lists`,
  `uploads`, and `successes_by_prompt` / `total_cost` of the server's stats as for chat
  requests.

`BatchPlan(enabled=False)` answers 404 on every route: a server without the Batch API;
`refuse_status` answers `POST /batches` with that status once `refuse_after` batches exist
(402: the credit ran out; 400: the model takes no batch).
`create_delay_s` answers `POST /batches` that long after the batch exists, so a test can
kill its client in the window where the provider holds a batch the client never heard of.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from handoff.testing.fakeapi.faults import MESSAGES, answer_digest
from payload.records import derive_id

ENDPOINT = "/v1/chat/completions"
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


@dataclass
class BatchPlan:
    """How the fake's Batch API behaves (all times in seconds)."""

    enabled: bool = True  # False: every Batch API route is a 404
    validate_s: float = 0.05  # in `validating`
    run_s: float = 0.1  # in `in_progress` before the first line is answered
    line_s: float = 0.0  # per line answered
    finalize_s: float = 0.05  # in `finalizing`
    cancel_s: float = 0.05  # in `cancelling`
    price_factor: float = 0.5  # a line costs cost_per_request x this
    line_errors: dict[str, int] = field(default_factory=dict)  # custom_id -> HTTP status
    expire: dict[int, int] = field(default_factory=dict)  # batch number (1-based) -> lines answered
    fail_message: str | None = None  # every batch fails validation with this
    create_delay_s: float = 0.0  # POST /batches answers this long after creating the batch
    refuse_status: int | None = None  # POST /batches answers this status (402: no credit) ...
    refuse_after: int = 0  # ... once this many batches were created
    max_requests: int = 50_000
    max_bytes: int = 200 * 1024 * 1024


@dataclass
class BatchStats:
    uploads: int = 0
    created: int = 0
    cancels: int = 0
    polls: int = 0
    lists: int = 0
    file_lists: int = 0
    downloads: int = 0
    submissions_by_file: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["submissions_by_file"] = dict(self.submissions_by_file)
        return out


@dataclass
class _File:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": len(self.data),
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "status_details": None}


@dataclass
class _Batch:
    id: str
    input_file_id: str
    endpoint: str
    metadata: dict[str, Any] | None
    number: int  # 1-based creation order
    created_at: int
    payer: Any = None  # the child key that submitted it (charged per line), or None
    status: str = "validating"
    times: dict[str, int | None] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"total": 0, "completed": 0,
                                                             "failed": 0})
    errors: list[dict[str, Any]] = field(default_factory=list)
    output_file_id: str | None = None
    error_file_id: str | None = None
    cancel_requested: bool = False
    task: asyncio.Task[None] | None = None

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id, "completion_window": "24h",
            "status": self.status, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": self.created_at,
            "request_counts": dict(self.counts), "metadata": self.metadata}
        for name in ("in_progress_at", "expires_at", "finalizing_at", "completed_at",
                     "failed_at", "expired_at", "cancelling_at", "cancelled_at"):
            out[name] = self.times.get(name)
        return out


def _now() -> int:
    return int(time.time())


class BatchService:
    """The Batch API of one FakeOpenRouter (`fake.batches`)."""

    def __init__(self, fake: Any, plan: BatchPlan | None = None) -> None:
        self.fake = fake  # the FakeOpenRouter it belongs to (its answers, errors, keys, stats)
        self.plan = plan or BatchPlan()
        self.stats = BatchStats()
        self.files: dict[str, _File] = {}
        self.batches: dict[str, _Batch] = {}

    def add_routes(self, app: web.Application, prefix: str) -> None:
        app.router.add_post(prefix + "/files", self._upload)
        app.router.add_get(prefix + "/files", self._list_files)
        app.router.add_get(prefix + "/files/{id}/content", self._content)
        app.router.add_post(prefix + "/batches", self._create)
        app.router.add_get(prefix + "/batches", self._list)
        app.router.add_get(prefix + "/batches/{id}", self._get)
        app.router.add_post(prefix + "/batches/{id}/cancel", self._cancel)

    # -- the gate ---------------------------------------------------------------------------------
    def _gate(self, request: web.Request) -> web.Response | None:
        if not self.plan.enabled:
            return self.fake._error(404, "Not Found")
        if not self.fake._authorized(request):
            return self.fake._error(401, self.fake.keys.refusal(request))
        return None

    @staticmethod
    def _page(items: list[Any], request: web.Request) -> web.Response:
        """OpenAI's list shape, newest first, `limit` and an `after` cursor."""
        try:
            limit = max(1, min(10_000, int(request.query.get("limit", "20"))))
        except ValueError:
            limit = 20
        after = request.query.get("after")
        if after:
            ids = [i.id for i in items]
            items = items[ids.index(after) + 1:] if after in ids else []
        page = items[:limit]
        return web.json_response({"object": "list", "data": [i.json() for i in page],
                                  "first_id": page[0].id if page else None,
                                  "last_id": page[-1].id if page else None,
                                  "has_more": len(items) > limit})

    # -- files ------------------------------------------------------------------------------------
    async def _upload(self, request: web.Request) -> web.Response:
        if (refused := self._gate(request)) is not None:
            return refused
        form = await request.post()
        upload, purpose = form.get("file"), form.get("purpose")
        if purpose != "batch":
            return self.fake._error(400, f"purpose must be 'batch', got {purpose!r}")
        if not isinstance(upload, web.FileField):
            return self.fake._error(400, "a multipart 'file' is required")
        data = upload.file.read()
        if not data:
            return self.fake._error(400, "empty files are rejected")
        self.stats.uploads += 1
        f = _File(f"file-{secrets.token_hex(12)}", upload.filename or "upload.jsonl", "batch",
                  data, _now())
        self.files[f.id] = f
        return web.json_response(f.json())

    async def _list_files(self, request: web.Request) -> web.Response:
        if (refused := self._gate(request)) is not None:
            return refused
        self.stats.file_lists += 1
        purpose = request.query.get("purpose")
        files = [f for f in reversed(self.files.values()) if purpose in (None, f.purpose)]
        return self._page(files, request)

    async def _content(self, request: web.Request) -> web.Response:
        if (refused := self._gate(request)) is not None:
            return refused
        f = self.files.get(request.match_info["id"])
        if f is None:
            return self.fake._error(404, "No such File object")
        self.stats.downloads += 1
        return web.Response(body=f.data, content_type="application/octet-stream")

    def _store(self, lines: list[dict[str, Any]], purpose: str) -> str | None:
        if not lines:
            return None
        data = b"".join(json.dumps(x, separators=(",", ":")).encode() + b"\n" for x in lines)
        f = _File(f"file-{secrets.token_hex(12)}", f"{purpose}.jsonl", purpose, data, _now())
        self.files[f.id] = f
        return f.id

    # -- batches ----------------------------------------------------------------------------------
    async def _create(self, request: web.Request) -> web.Response:
        if (refused := self._gate(request)) is not None:
            return refused
        try:
            body = await request.json()
            file_id = body["input_file_id"]
            endpoint = body["endpoint"]
        except (ValueError, KeyError, TypeError):
            return self.fake._error(400, "input_file_id and endpoint are required")
        if endpoint != ENDPOINT:
            return self.fake._error(400, f"endpoint {endpoint!r} is not supported")
        if body.get("completion_window") != "24h":
            return self.fake._error(400, "completion_window must be '24h'")
        if file_id not in self.files:
            return self.fake._error(404, f"No such File object: {file_id}")
        if self.plan.refuse_status is not None and self.stats.created >= self.plan.refuse_after:
            return self.fake._error(self.plan.refuse_status)
        metadata = body.get("metadata")
        self.stats.created += 1
        self.stats.submissions_by_file[file_id] += 1
        b = _Batch(f"batch_{secrets.token_hex(12)}", file_id, endpoint,
                   metadata if isinstance(metadata, dict) else None, self.stats.created, _now(),
                   payer=self.fake.keys.child_of(request))
        b.times["expires_at"] = b.created_at + 24 * 3600
        self.batches[b.id] = b
        b.task = asyncio.get_running_loop().create_task(self._run(b))
        if self.plan.create_delay_s:
            await asyncio.sleep(self.plan.create_delay_s)  # the batch exists; the answer is late
        return web.json_response(b.json())

    async def _list(self, request: web.Request) -> web.Response:
        if (refused := self._gate(request)) is not None:
            return refused
        self.stats.lists += 1
        return self._page(list(reversed(self.batches.values())), request)

    async def _get(self, request: web.Request) -> web.Response:
        if (refused := self._gate(request)) is not None:
            return refused
        b = self.batches.get(request.match_info["id"])
        if b is None:
            return self.fake._error(404, "No such batch")
        self.stats.polls += 1
        return web.json_response(b.json())

    async def _cancel(self, request: web.Request) -> web.Response:
        if (refused := self._gate(request)) is not None:
            return refused
        b = self.batches.get(request.match_info["id"])
        if b is None:
            return self.fake._error(404, "No such batch")
        if b.status in TERMINAL:
            return self.fake._error(400, f"Cannot cancel a batch with status '{b.status}'.")
        self.stats.cancels += 1
        if not b.cancel_requested:
            b.cancel_requested = True
            b.status = "cancelling"
            b.times["cancelling_at"] = _now()
        return web.json_response(b.json())

    # -- a batch's life ---------------------------------------------------------------------------
    def _validate(self, b: _Batch) -> list[dict[str, Any]] | None:
        """The input file's lines, or None with `b.errors` set (the batch fails)."""
        data = self.files[b.input_file_id].data
        plan = self.plan
        if plan.fail_message:
            b.errors = [{"code": "invalid_request", "message": plan.fail_message,
                         "param": None, "line": None}]
            return None
        lines, seen, models = [], set(), set()
        for n, raw in enumerate(data.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
                cid, body = line["custom_id"], line["body"]
                ok = (isinstance(cid, str) and line.get("method") == "POST"
                      and line.get("url") == b.endpoint and isinstance(body, dict)
                      and isinstance(body.get("messages"), list))
            except (ValueError, KeyError, TypeError):
                ok, cid, body = False, None, None
            if not ok:
                b.errors.append({"code": "invalid_request", "line": n, "param": None,
                                 "message": "a line needs a string custom_id, method POST, "
                                            f"url {b.endpoint} and a chat body"})
            elif cid in seen:
                b.errors.append({"code": "duplicate_custom_id", "line": n, "param": "custom_id",
                                 "message": f"custom_id {cid!r} is not unique"})
            else:
                seen.add(cid)
                models.add(body.get("model"))
                lines.append(line)
        if len(models) > 1:
            b.errors.append({"code": "mismatched_model", "line": None, "param": "model",
                             "message": "every line of a batch must use the same model"})
        if len(lines) > plan.max_requests:
            b.errors.append({"code": "too_many_requests", "line": None, "param": None,
                             "message": f"{len(lines)} requests > {plan.max_requests}"})
        if len(data) > plan.max_bytes:
            b.errors.append({"code": "file_too_large", "line": None, "param": None,
                             "message": f"{len(data)} bytes > {plan.max_bytes}"})
        return None if b.errors else lines

    async def _run(self, b: _Batch) -> None:
        plan = self.plan
        await asyncio.sleep(plan.validate_s)
        lines = self._validate(b)
        if lines is None:
            b.status = "failed"
            b.times["failed_at"] = _now()
            return
        b.counts["total"] = len(lines)
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        done = 0
        if not b.cancel_requested:
            b.status = "in_progress"
            b.times["in_progress_at"] = _now()
            await asyncio.sleep(plan.run_s)
        limit = plan.expire.get(b.number)
        for line in lines:
            if b.cancel_requested or (limit is not None and done >= limit):
                break
            if plan.line_s:
                await asyncio.sleep(plan.line_s)
            status, answer = self._answer(b, line["body"], line["custom_id"])
            entry = {"id": f"batch_req_{secrets.token_hex(8)}", "custom_id": line["custom_id"],
                     "response": {"status_code": status, "request_id": secrets.token_hex(8),
                                  "body": answer}, "error": None}
            if status == 200:
                outputs.append(entry)
                b.counts["completed"] += 1
            else:
                errors.append(entry)
                b.counts["failed"] += 1
            done += 1
        if b.cancel_requested:
            end, code = "cancelled", "batch_cancelled"
            await asyncio.sleep(plan.cancel_s)
        elif limit is not None and done < len(lines):
            end, code = "expired", "batch_expired"
        else:
            end, code = "completed", ""
            b.status = "finalizing"
            b.times["finalizing_at"] = _now()
            await asyncio.sleep(plan.finalize_s)
        for line in lines[done:]:
            errors.append({"id": f"batch_req_{secrets.token_hex(8)}",
                           "custom_id": line["custom_id"], "response": None,
                           "error": {"code": code, "message": (
                               "This request could not be executed before the completion "
                               "window expired." if end == "expired" else
                               "This request was not executed: the batch was cancelled.")}})
        b.output_file_id = self._store(outputs, "batch_output")
        b.error_file_id = self._store(errors, "batch_output")
        b.status = end
        b.times[f"{end}_at"] = _now()

    def _answer(self, b: _Batch, body: dict[str, Any], custom_id: str
                ) -> tuple[int, dict[str, Any]]:
        """One line as a plain chat request with this body would be answered (no faults, no
        latency: the batch's timing is the plan's), at the batch price."""
        fake, stats = self.fake, self.fake.stats
        messages = body["messages"]
        status = self.plan.line_errors.get(custom_id)
        if status is not None:
            return status, {"error": {"code": status, "message": MESSAGES.get(status, "error")}}
        if fake.known_models is not None and body.get("model") not in fake.known_models:
            return 400, {"error": {"code": 400, "message": f"Invalid model name passed in "
                                                           f"model={body.get('model')}."}}
        stats.requests_by_prompt[derive_id(messages)] += 1
        content = f"answer {answer_digest(messages)}"
        if fake.thinking is not None:
            result = fake._thinking_result(body, messages, content)
        else:
            result = fake._result(body, content, "stop", provider=fake._provider(messages))
        if not fake.body_id:
            result.pop("id", None)
        cost = fake.cost_per_request * self.plan.price_factor
        usage = result["usage"]
        if "cost" in usage:
            usage["cost"] = cost if usage["cost"] else 0.0
        stats.successes += 1
        stats.successes_by_prompt[derive_id(messages)] += 1
        stats.total_cost += cost
        if b.payer is not None:
            b.payer.usage += cost
        return 200, result


__all__ = ["ENDPOINT", "TERMINAL", "BatchPlan", "BatchService", "BatchStats"]
