"""The fake OpenRouter's answers: the bodies and headers of OpenRouter's shapes (a chat
completion, a thinking model's cut answer, an SSE stream, an error with integer `code`)
and of every injected fault kind. The server (server.py) decides *which* answer a request
gets; this module only says what it looks like on the wire, so a change to a shape is made
in one place for every mode.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from typing import Any

from aiohttp import web

from handoff.testing.fakeapi.faults import (
    MESSAGES,
    FakeStats,
    FaultPlan,
    answer_digest,
    fake_token_ids,
)
from handoff.testing.fakeapi.streams import Streamer, lognormal
from payload.records import derive_id


class AnswerShapes:
    """Mixed into FakeOpenRouter: the settings below are its constructor's."""

    api_key: str
    stats: FakeStats
    faults: FaultPlan
    echo_key_in_errors: bool
    providers: list[str]
    generation_header: bool
    body_id: bool
    thinking: str | None
    reasoning_tokens: int
    reasoning_sigma: float
    streamer: Streamer
    completion_tokens: int
    check_history: bool
    content_parts: bool
    report_cost: bool
    cost_per_request: float
    error_null: bool
    token_ids: bool
    token_vocab: int
    stable_ids: bool
    _answered: dict[str, str]

    def _error(self, status: int, message: str | None = None, *,
               retry_after: float | None = None,
               metadata: dict[str, Any] | None = None) -> web.Response:
        message = message or MESSAGES.get(status, "error")
        if self.echo_key_in_errors:
            message += f" (request had Authorization: Bearer {self.api_key})"
        body: dict[str, Any] = {"error": {"code": status, "message": message}}
        if metadata:
            body["error"]["metadata"] = metadata
        headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
        return web.json_response(body, status=status, headers=headers)

    def _provider(self, messages: list[dict[str, Any]]) -> str:
        return self.providers[int(answer_digest(messages), 16) % len(self.providers)]

    def _json(self, result: dict[str, Any]) -> web.Response:
        headers = None
        if self.generation_header:
            headers = {"X-Generation-Id": f"gen-h-{self.stats.requests}"}
        if not self.body_id:
            result.pop("id", None)
        return web.json_response(result, headers=headers)

    async def _answer(self, request: web.Request, body: dict[str, Any],
                      result: dict[str, Any]) -> web.StreamResponse:
        """A chat.completion as JSON, or streamed when the request asked `"stream": true`:
        the stream renders this very dict (streams.py), so both carry the same answer."""
        if body.get("stream") is not True:
            return self._json(result)
        # X-Generation-Id: what the JSON path sends (gen-h-<n>) where it sends one, else the id
        header = (f"gen-h-{self.stats.requests}" if self.generation_header or not self.body_id
                  else str(result.get("id")))
        if not self.body_id:
            result.pop("id", None)
        return await self.streamer.serve(request, body, result, header_id=header,
                                         prompt_id=derive_id(body["messages"]))

    def _reasoning_length(self, messages: list[dict[str, Any]]) -> int:
        """`reasoning_tokens`, or with `reasoning_sigma` a log-normal draw of that mean seeded
        by the prompt: the same prompt thinks as long every time, streamed or not."""
        if self.reasoning_sigma <= 0:
            return self.reasoning_tokens
        rng = random.Random(int(answer_digest(messages), 16))
        return max(1, round(lognormal(rng, self.reasoning_tokens, self.reasoning_sigma)))

    def _thinking_result(self, body: dict[str, Any], messages: list[dict[str, Any]],
                         answer: str) -> dict[str, Any]:
        """`reasoning_tokens` of reasoning (one word a token), then the answer; cut where the
        request's max_tokens ends, as a thinking model served by OpenRouter is."""
        length = self._reasoning_length(messages)
        asked = body.get("max_tokens")
        whole = length + self.completion_tokens
        used = asked if isinstance(asked, int) and asked < whole else whole
        cut = used < whole
        reasoning = " ".join(map("r{}".format, range(min(used, length))))
        in_reasoning = used <= length  # the budget ran out before the answer began
        content = "" if in_reasoning else answer
        finish = "length" if cut else "stop"
        if self.thinking == "tags":
            closed = "" if in_reasoning else "</think>"
            text = f"<think>{reasoning}{closed}{content}"
            result = self._result(body, text, finish, provider=self._provider(messages),
                                  reasoning=None, completion=used)
        else:
            result = self._result(body, content, finish, provider=self._provider(messages),
                                  reasoning=reasoning, completion=used)
        result["usage"]["completion_tokens_details"] = {
            "reasoning_tokens": min(used, length)}
        if self.check_history:
            self._answered[derive_id(messages)] = content
        return result

    def _check_history(self, messages: list[dict[str, Any]]) -> None:
        for j, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            self.stats.history_checked += 1
            if self._answered.get(derive_id(messages[:j])) != m.get("content"):
                self.stats.history_mismatches += 1

    def _sse(self, body: dict[str, Any], content: str) -> web.Response:
        chunk = {"id": f"gen-{self.stats.requests}", "object": "chat.completion.chunk",
                 "model": body.get("model"), "choices": [
                     {"index": 0, "delta": {"role": "assistant", "content": content},
                      "finish_reason": "stop"}]}
        text = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
        return web.Response(status=200, text=text, content_type="text/event-stream")

    def _result(self, body: dict[str, Any], content: str | None, finish: str,
                choice_error: dict[str, Any] | None = None, *, provider: str = "DeepInfra",
                reasoning: str | bool | None = True, completion: int | None = None
                ) -> dict[str, Any]:
        prompt_tokens = sum(len(str(m.get("content", ""))) // 4 + 1 for m in body["messages"])
        content_field: Any = content
        if self.content_parts and content:
            half = len(content) // 2
            content_field = [{"type": "text", "text": content[:half]},
                             {"type": "text", "text": content[half:]}]
        if reasoning is True:  # the plain fake's stand-in
            reasoning = "thinking" if content else None
        native = "max_tokens" if finish == "length" and self.thinking else finish
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish,
                                  "native_finish_reason": native,
                                  "message": {"role": "assistant", "content": content_field,
                                              "reasoning": reasoning}}
        if choice_error is not None:
            choice["error"] = choice_error
        if completion is None:
            completion = self.completion_tokens if content else 0
        usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                                 "total_tokens": prompt_tokens + completion, "is_byok": False}
        if self.report_cost:
            usage["cost"] = self.cost_per_request if content or completion else 0.0
        result: dict[str, Any] = {
            "id": (f"gen-{answer_digest(body['messages'])}" if self.stable_ids
                   else f"gen-{self.stats.requests}"), "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model", "fake/model"),
            "provider": provider, "system_fingerprint": None, "choices": [choice],
            "usage": usage}
        if self.error_null:
            result["error"] = None
        if self.token_ids and body.get("return_token_ids") is True:
            seen = f"{reasoning if isinstance(reasoning, str) else ''}\x00{content or ''}"
            ids = fake_token_ids(seen, completion, self.token_vocab)
            choice["token_ids"] = ids
            result["prompt_token_ids"] = fake_token_ids(json.dumps(body["messages"]),
                                                        prompt_tokens, self.token_vocab)
            if isinstance(body.get("messages"), list):
                self.stats.token_ids_by_prompt[derive_id(body["messages"])] = ids
        return result

    async def _fault(self, fault: str, request: web.Request) -> web.StreamResponse | None:
        ra = self.faults.retry_after_s
        if fault == "429_bare":
            return self._error(429)
        if fault == "429_huge":
            return self._error(429, retry_after=86400)
        if fault == "429_date":
            when = email.utils.formatdate(time.time() + ra, usegmt=True)
            return web.json_response({"error": {"code": 429, "message": MESSAGES[429]}},
                                     status=429, headers={"Retry-After": when})
        if fault == "429_ms":
            return web.json_response({"error": {"code": 429, "message": MESSAGES[429]}},
                                     status=429, headers={"retry-after-ms": f"{ra * 1000:g}"})
        if fault == "429_quota":  # OpenAI's shape: string type/code, no integer code
            return web.json_response({"error": {
                "message": "You exceeded your current quota, please check your plan and "
                           "billing details.", "type": "insufficient_quota", "param": None,
                "code": "insufficient_quota"}}, status=429)
        if fault == "422_detail":  # FastAPI-style servers
            return web.json_response({"detail": [{"loc": ["body", "messages"],
                                                  "msg": "field required",
                                                  "type": "value_error.missing"}]}, status=422)
        if fault == "sse":
            body = await request.json()
            return self._sse(body, "streamed")
        if fault.isdigit():
            status = int(fault)
            if status == 429:
                return self._error(429, retry_after=ra)
            if status == 404:
                return self._error(404, metadata={"reason": "constraint_filtered",
                                                  "retryable": False})
            return self._error(status)
        if fault == "402_inflight":
            return self._error(402, "Too many requests in flight for this key's balance",
                               retry_after=ra)
        if fault == "reset":
            transport = request.transport
            if transport is not None:
                transport.abort()
            raise ConnectionResetError("fake reset")
        if fault == "malformed":
            return web.Response(status=200, text='{"id": "gen-x", "choices": [{"mess',
                                content_type="application/json")
        body = await request.json()
        finishes = {"choice_error": "error", "finish_error": "error", "empty": "stop",
                    "length_empty": "length"}  # answers that are not one, streamed when asked
        if fault in finishes:
            error = ({"code": 502, "message": "upstream provider error"}
                     if fault == "choice_error" else None)
            result = self._result(body, None if error else "", finishes[fault], error)
            if body.get("stream") is True:
                return await self._answer(request, body, result)
            return web.json_response(result)
        if fault == "hang":
            await asyncio.sleep(self.faults.hang_s)
            return self._error(504)
        raise AssertionError(fault)
