"""One chat-completion attempt and the error taxonomy that classifies its result.

OpenRouter answers errors with an integer `error.code` in the body, sometimes inside an
HTTP 200 (a provider failed after the stream started, or the choice carries `error` /
`finish_reason: "error"`). So the class of an attempt is decided from the status AND the
body: the effective code is the body's `error.code` when present, else the HTTP status.
"""

from __future__ import annotations

import asyncio
import email.utils
import enum
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..redact import redact

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504, 524, 529})
# Signals that the API as a whole is overloaded: shrink the in-flight window for these.
THROTTLE_STATUS = frozenset({429, 503, 529})


class Kind(enum.Enum):
    OK = "ok"
    RETRY = "retry"  # transient: back off and try again (up to --max-attempts)
    PERMANENT = "permanent"  # this prompt will never succeed: record it in the errors file
    AUTH = "auth"  # 401: the key was refused; stop everything
    CREDIT = "credit"  # 402 without Retry-After: out of credit / key limit; stop dispatching


@dataclass
class Outcome:
    kind: Kind
    status: int | None = None  # effective code (body error.code, else HTTP status)
    type: str = ""  # short machine name: rate_limited, server_error, timeout, ...
    message: str = ""
    retry_after: float | None = None
    throttled: bool = False
    result: dict[str, Any] = field(default_factory=dict)  # fields for the output record
    cost: float | None = None  # usage.cost when the answer reported one
    latency_s: float = 0.0


def build_body(messages: list[dict[str, Any]], *, model: str, provider: dict[str, Any] | None,
               max_tokens: int | None, temperature: float | None, top_p: float | None,
               reasoning: dict[str, Any] | None) -> dict[str, Any]:
    """The request body: only fields OpenRouter's ChatRequest schema defines."""
    body: dict[str, Any] = {"model": model, "messages": messages}
    if provider is not None:
        body["provider"] = provider
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if top_p is not None:
        body["top_p"] = top_p
    if reasoning is not None:
        body["reasoning"] = reasoning
    return body


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds, fractional tolerated, or HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_fields(err: Any) -> tuple[int | None, str, dict[str, Any]]:
    if not isinstance(err, dict):
        return None, str(err), {}
    code = err.get("code")
    try:
        code_i: int | None = int(code) if code is not None else None
    except (TypeError, ValueError):
        code_i = None
    meta = err.get("metadata") if isinstance(err.get("metadata"), dict) else {}
    return code_i, str(err.get("message", "")), meta or {}


_TYPES = {400: "bad_request", 401: "unauthorized", 402: "payment_required", 403: "forbidden",
          404: "not_found", 408: "timeout", 413: "payload_too_large", 422: "unprocessable",
          429: "rate_limited", 500: "server_error", 502: "bad_gateway",
          503: "unavailable", 504: "gateway_timeout", 524: "edge_timeout",
          529: "overloaded"}


def classify_error(code: int, message: str, metadata: dict[str, Any],
                   retry_after: float | None) -> Outcome:
    """An error answer (HTTP error status, or an error object in a 200) to an Outcome."""
    etype = _TYPES.get(code, f"http_{code}")
    message = redact(message)[:500]
    if code == 401:
        return Outcome(Kind.AUTH, code, etype, message)
    if code == 402:
        if retry_after is not None:
            # OpenRouter's in-flight budget: too many requests for the balance right now.
            return Outcome(Kind.RETRY, code, "inflight_limited", message, retry_after,
                           throttled=True)
        return Outcome(Kind.CREDIT, code, etype, message)
    if code in RETRYABLE_STATUS or code >= 500:
        return Outcome(Kind.RETRY, code, etype, message, retry_after,
                       throttled=code in THROTTLE_STATUS)
    if code == 404 and (metadata.get("retryable") is True):
        return Outcome(Kind.RETRY, code, etype, message, retry_after)
    # 400, 403, 404 (not retryable, e.g. constraint_filtered), 413, 422, other 4xx.
    return Outcome(Kind.PERMANENT, code, etype, message)


def classify_body(status: int, raw: bytes, retry_after: float | None) -> Outcome:
    """Classify a complete HTTP answer from its status and body."""
    try:
        data = json.loads(raw)
    except ValueError:
        if status == 200:
            return Outcome(Kind.RETRY, status, "malformed_json", "answer was not valid JSON")
        return classify_error(status, f"HTTP {status} with a non-JSON body", {}, retry_after)
    if not isinstance(data, dict):
        return Outcome(Kind.RETRY, status, "malformed_json", "answer was not a JSON object")
    if status != 200 or "error" in data:
        code, message, meta = _error_fields(data.get("error"))
        return classify_error(code or status, message or f"HTTP {status}", meta, retry_after)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Outcome(Kind.RETRY, status, "malformed_json", "answer has no choices")
    choice = choices[0]
    if choice.get("error"):
        code, message, meta = _error_fields(choice["error"])
        if code is not None and code in (401, 402):
            return classify_error(code, message, meta, retry_after)
        return Outcome(Kind.RETRY, code or status, "provider_error",
                       redact(message or "error in choice")[:500])
    finish = choice.get("finish_reason")
    if finish == "error":
        return Outcome(Kind.RETRY, status, "provider_error", "finish_reason was 'error'")
    message_obj: dict[str, Any] = (choice["message"] if isinstance(choice.get("message"), dict)
                                   else {})
    content = message_obj.get("content")
    usage: dict[str, Any] = data["usage"] if isinstance(data.get("usage"), dict) else {}
    cost = usage.get("cost")
    cost_f = float(cost) if isinstance(cost, (int, float)) else None
    if not isinstance(content, str) or not content.strip():
        # An empty answer (also finish_reason "length" with no content: the budget went to
        # reasoning) is not a success; it may still have been billed.
        return Outcome(Kind.RETRY, status, "empty_content",
                       f"empty content (finish_reason {finish!r})", cost=cost_f)
    result = {"usage": usage, "finish_reason": finish, "provider": data.get("provider"),
              "model": data.get("model"), "response": content,
              "reasoning": message_obj.get("reasoning")}
    return Outcome(Kind.OK, status, "ok", result=result, cost=cost_f)


def env_proxy(url: str) -> str | None:
    """The proxy `$HTTPS_PROXY`/`$HTTP_PROXY` name for `url` (honouring `$NO_PROXY`), looked up
    once per run rather than per request."""
    import urllib.request
    from urllib.parse import urlsplit
    host = urlsplit(url).hostname or ""
    if urllib.request.proxy_bypass(host):
        return None
    return urllib.request.getproxies().get(urlsplit(url).scheme)


async def attempt(session: aiohttp.ClientSession, url: str, body: bytes,
                  headers: dict[str, str], timeout: aiohttp.ClientTimeout,
                  proxy: str | None = None) -> Outcome:
    """One POST; never raises for network trouble (it becomes a RETRY outcome)."""
    started = time.monotonic()
    try:
        async with session.post(url, data=body, headers=headers, timeout=timeout,
                                proxy=proxy) as resp:
            raw = await resp.read()
            outcome = classify_body(resp.status, raw,
                                    parse_retry_after(resp.headers.get("Retry-After")))
    except asyncio.TimeoutError:
        outcome = Outcome(Kind.RETRY, None, "timeout", "request timed out")
    except (aiohttp.ClientError, ConnectionError, OSError) as exc:
        outcome = Outcome(Kind.RETRY, None, "connection",
                          redact(f"{type(exc).__name__}: {exc}")[:300])
    outcome.latency_s = time.monotonic() - started
    return outcome
