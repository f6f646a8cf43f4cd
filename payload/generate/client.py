"""One chat-completion attempt and the error taxonomy that classifies its result.

OpenRouter answers errors with an integer `error.code` in the body, sometimes inside an
HTTP 200 (a provider failed after the stream started, or the choice carries `error` /
`finish_reason: "error"`). So the class of an attempt is decided from the status AND the
body: the effective code is the body's `error.code` when present, else the HTTP status.

Other OpenAI-compatible servers answer in neighbouring shapes, and each is read for what
it means rather than dropped as "malformed": `"error": null` beside a valid choice is no
error; `content` may be a list of text parts; an error may be `{"detail": ...}`
(FastAPI) or carry a string code (`insufficient_quota`); a server that only streams
answers a plain request with an SSE body. Two flags on every outcome feed the run's
controls: `throttled` (the server asked us to slow down: 429, or 402 with Retry-After)
and `server_failure` (the server as a whole may be down: no connection, a timeout, 5xx).

Thinking models (docs/generator.md "Thinking answers"): an answer cut by `max_tokens`
(`finish_reason: "length"`) is an answer, also with empty content (the budget went to
reasoning): it is a valid prefix of the model's output, and asking again would bill it
again. `<think>…</think>` in `content` with no `reasoning` is split into the two fields
(or refused, `think="refuse"`: a permanent `think_in_content`). The generation id (body
`id`, else the `X-Generation-Id` header) and `native_finish_reason` are kept when sent.
"""

from __future__ import annotations

import asyncio
import email.utils
import enum
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from payload.redact import redact

# 409 (a lock or conflict) is retried as the openai SDK does; 5xx are retried below.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
# A per-request wait the server asks for is honoured up to this (a Retry-After of a day
# would otherwise park a worker while the status says "running").
MAX_RETRY_AFTER_S = 300.0


class Kind(enum.Enum):
    OK = "ok"
    RETRY = "retry"  # transient: back off and try again (up to --max-attempts)
    PERMANENT = "permanent"  # this prompt will never succeed: record it in the errors file
    AUTH = "auth"  # 401: the key was refused; stop everything
    CREDIT = "credit"  # out of credit / key limit / quota; stop dispatching


@dataclass
class Outcome:
    kind: Kind
    status: int | None = None  # effective code (body error.code, else HTTP status)
    type: str = ""  # short machine name: rate_limited, server_error, timeout, ...
    message: str = ""
    retry_after: float | None = None  # seconds, already capped at MAX_RETRY_AFTER_S
    answered_at: float | None = None  # epoch s the answer was complete, where not "now"
    throttled: bool = False  # 429 / 402 with Retry-After: the server asks for less load
    server_failure: bool = False  # no connection, timeout, 5xx: the server may be down
    result: dict[str, Any] = field(default_factory=dict)  # fields for the output record
    cost: float | None = None  # usage.cost when the answer reported one
    usage: dict[str, Any] | None = None  # usage as returned (tokens price an uncosted answer)
    latency_s: float = 0.0
    cut: bool = False  # an answer cut by max_tokens (finish_reason "length")
    think_split: bool = False  # <think> markers were moved from content to reasoning


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
THINK_MODES = ("split", "refuse")


def split_think(content: str) -> tuple[str, str] | None:
    """(reasoning, answer) of a `content` that holds think markers: `<think>R</think>A`,
    `R</think>A` (a template that opened the block in the generation prompt), or an
    unclosed `<think>R` (cut while thinking); None without markers."""
    close = content.find(THINK_CLOSE)
    if close >= 0:
        before, after = content[:close], content[close + len(THINK_CLOSE):]
        start = before.find(THINK_OPEN)
        prefix = before[:start] if start >= 0 else ""
        reasoning = before[start + len(THINK_OPEN):] if start >= 0 else before
        return reasoning.strip(), (prefix + after).lstrip()
    head = content.lstrip()
    if head.startswith(THINK_OPEN):
        return head[len(THINK_OPEN):].strip(), ""
    return None


def build_body(messages: list[dict[str, Any]], *, model: str, provider: dict[str, Any] | None,
               max_tokens: int | None, temperature: float | None, top_p: float | None,
               reasoning: dict[str, Any] | None, seed: int | None = None,
               token_ids: bool = False, stream: bool = False) -> dict[str, Any]:
    """The request body: only fields OpenRouter's ChatRequest schema defines, plus
    `return_token_ids` (vLLM's) when `token_ids`, which is never asked of OpenRouter
    (settings.token_ids_for). `stream` asks for an event stream whose last chunk carries
    the usage (OpenAI and vLLM send it only when `stream_options.include_usage` says so)."""
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
    if seed is not None:
        body["seed"] = seed
    if token_ids:
        body["return_token_ids"] = True
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def sampled_ids(value: Any) -> list[int] | None:
    """`choices[0].token_ids` kept only when it is a non-empty list of non-negative ints (a
    server that ignores the field sends none; anything else is not trusted as ids)."""
    if type(value) is not list or not value:
        return None
    if not all(type(i) is int for i in value) or min(value) < 0:
        return None
    return value


def refuses_token_ids(o: Outcome) -> bool:
    """A server that does not know `return_token_ids` and says so (OpenAI: 400
    "Unrecognized request argument supplied: return_token_ids")."""
    return o.kind is Kind.PERMANENT and o.status in (400, 422) \
        and "return_token_ids" in o.message


def parse_retry_after(value: str | None, millis: str | None = None) -> float | None:
    """Seconds to wait, from `retry-after-ms` (preferred: finer) or `Retry-After` (delta
    seconds, fractional tolerated, or an HTTP date); capped at MAX_RETRY_AFTER_S."""
    if millis:
        try:
            ms = float(millis)
        except ValueError:
            ms = math.nan
        if math.isfinite(ms):
            return min(MAX_RETRY_AFTER_S, max(0.0, ms / 1000.0))
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return min(MAX_RETRY_AFTER_S, max(0.0, seconds))


def _error_fields(err: Any) -> tuple[int | None, str, str, dict[str, Any]]:
    """(integer code, string code/type, message, metadata) of an error object in any of the
    shapes seen: OpenRouter's `{code: 429, message}`, OpenAI's `{type, code:
    "insufficient_quota", message}`, LiteLLM's string `"400"` codes, or a bare string."""
    if not isinstance(err, dict):
        return None, "", str(err), {}
    code = err.get("code")
    code_i: int | None = None
    code_s = ""
    if isinstance(code, int) and not isinstance(code, bool):
        code_i = code
    elif isinstance(code, str):
        if code.strip().isdigit():
            code_i = int(code)
        else:
            code_s = code
    etype = err.get("type")
    if not code_s and isinstance(etype, str):
        code_s = etype
    meta = err.get("metadata") if isinstance(err.get("metadata"), dict) else {}
    message = err.get("message")
    return code_i, code_s, "" if message is None else str(message), meta or {}


def _detail_message(detail: Any) -> str:
    """FastAPI's `{"detail": "text"}` or `{"detail": [{"msg": ...}, ...]}`."""
    if isinstance(detail, list):
        parts = [str(d.get("msg", d)) if isinstance(d, dict) else str(d) for d in detail]
        return "; ".join(parts)
    return str(detail)


_TYPES = {400: "bad_request", 401: "unauthorized", 402: "payment_required", 403: "forbidden",
          404: "not_found", 408: "timeout", 409: "conflict", 413: "payload_too_large",
          422: "unprocessable", 425: "too_early", 429: "rate_limited", 500: "server_error",
          502: "bad_gateway", 503: "unavailable", 504: "gateway_timeout", 524: "edge_timeout",
          529: "overloaded"}
QUOTA_CODES = frozenset({"insufficient_quota", "quota_exceeded", "billing_hard_limit_reached"})


def classify_error(code: int, message: str, metadata: dict[str, Any],
                   retry_after: float | None, code_s: str = "") -> Outcome:
    """An error answer (HTTP error status, or an error object in a 200) to an Outcome."""
    etype = _TYPES.get(code, f"http_{code}")
    message = redact(message)[:500]
    if code == 401:
        return Outcome(Kind.AUTH, code, etype, message)
    if code == 402 or code_s in QUOTA_CODES:
        if retry_after is not None and code_s not in QUOTA_CODES:
            # OpenRouter's in-flight budget: too many requests for the balance right now.
            return Outcome(Kind.RETRY, code, "inflight_limited", message, retry_after,
                           throttled=True)
        # 429 insufficient_quota (OpenAI) is an empty account, not a rate: stop like a 402.
        return Outcome(Kind.CREDIT, code, code_s if code_s in QUOTA_CODES else etype, message)
    if code >= 500:
        return Outcome(Kind.RETRY, code, etype, message, retry_after, server_failure=True)
    if code in RETRYABLE_STATUS:
        return Outcome(Kind.RETRY, code, etype, message, retry_after, throttled=code == 429)
    if code == 404 and (metadata.get("retryable") is True):
        return Outcome(Kind.RETRY, code, etype, message, retry_after)
    # 400, 403, 404 (not retryable, e.g. constraint_filtered), 413, 422, other 4xx.
    return Outcome(Kind.PERMANENT, code, etype, message)


def looks_like_sse(raw: bytes, content_type: str | None) -> bool:
    if content_type and content_type.startswith("text/event-stream"):
        return True
    head = raw[:64].lstrip()
    return head.startswith((b"data:", b"event:", b": ")) or head == b":"


def _text_of(content: Any) -> str | None:
    """`content` as text: a string, or a list of parts whose text parts are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)
                 and p.get("type", "text") in ("text", "output_text")]
        joined = "".join(t for t in texts if isinstance(t, str))
        return joined if texts else None
    return None


def _reasoning_of(message: dict[str, Any]) -> str | None:
    """The reasoning trace of an answer's message. OpenRouter sends it as `reasoning`;
    DeepSeek's API and vLLM's reasoning parsers before 0.10 send `reasoning_content`: read
    either, or a thinking model's trace would be recorded as null and lost without a word.
    Anything but text is no trace."""
    reasoning = message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        return reasoning
    other = message.get("reasoning_content")
    if isinstance(other, str) and other:
        return other
    return reasoning if isinstance(reasoning, str) else None


def without_nulls(usage: dict[str, Any]) -> dict[str, Any]:
    """`usage` without its null members, at any depth. A null says nothing, and servers
    differ only there between their answers: vLLM sends `"prompt_tokens_details": null` in a
    plain answer and leaves it out of a stream's usage chunk (`exclude_none`); without
    them the two record the same usage."""
    return {k: without_nulls(v) if isinstance(v, dict) else v
            for k, v in usage.items() if v is not None}


def classify_body(status: int, raw: bytes, retry_after: float | None,
                  content_type: str | None = None, generation_id: str | None = None,
                  think: str = "split") -> Outcome:
    """Classify a complete HTTP answer from its status and body (`generation_id`: the
    `X-Generation-Id` header; `think`: what to do with `<think>` in content)."""
    try:
        data = json.loads(raw)
    except ValueError:
        if status == 200 and looks_like_sse(raw, content_type):
            return Outcome(Kind.PERMANENT, status, "streaming_only",
                           "the server answered a non-streaming request with an event stream "
                           "(text/event-stream): it serves streaming requests only")
        if status == 200:
            return Outcome(Kind.RETRY, status, "malformed_json", "answer was not valid JSON")
        return classify_error(status, f"HTTP {status} with a non-JSON body", {}, retry_after)
    if not isinstance(data, dict):
        return Outcome(Kind.RETRY, status, "malformed_json", "answer was not a JSON object")
    return classify_data(status, data, retry_after, generation_id, think)


def classify_data(status: int, data: dict[str, Any], retry_after: float | None,
                  generation_id: str | None = None, think: str = "split") -> Outcome:
    """Classify a decoded answer object: a non-streaming body, or a stream assembled into
    the body it stands for (payload.generate.streaming), so both are recorded alike."""
    err = data.get("error")
    if status != 200 or err:  # `"error": null` beside a valid choice is no error
        if err:
            code, code_s, message, meta = _error_fields(err)
        elif "detail" in data:
            code, code_s, message, meta = None, "", _detail_message(data["detail"]), {}
        else:
            code, code_s, message, meta = None, "", str(data.get("message") or ""), {}
        return classify_error(code or status, message or f"HTTP {status}", meta, retry_after,
                              code_s)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Outcome(Kind.RETRY, status, "malformed_json", "answer has no choices")
    choice = choices[0]
    if choice.get("error"):
        code, code_s, message, meta = _error_fields(choice["error"])
        if code in (401, 402) or code_s in QUOTA_CODES:
            return classify_error(code or status, message, meta, retry_after, code_s)
        return Outcome(Kind.RETRY, code or status, "provider_error",
                       redact(message or "error in choice")[:500])
    finish = choice.get("finish_reason")
    if finish == "error":
        return Outcome(Kind.RETRY, status, "provider_error", "finish_reason was 'error'")
    message_obj: dict[str, Any] = (choice["message"] if isinstance(choice.get("message"), dict)
                                   else {})
    content = _text_of(message_obj.get("content"))
    reasoning = _reasoning_of(message_obj)
    usage = without_nulls(data["usage"]) if isinstance(data.get("usage"), dict) else {}
    cost = usage.get("cost")
    cost_f = float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) \
        else None
    split = False
    if content and not reasoning and (parts := split_think(content)) is not None:
        if think == "refuse":
            return Outcome(Kind.PERMANENT, status, "think_in_content",
                           "the answer has <think> markers in content and no reasoning field "
                           "(--think-in-content refuse; `split` moves them to reasoning)",
                           cost=cost_f, usage=usage)
        reasoning, content = parts
        split = True
    cut = finish == "length"
    if not cut and (content is None or not content.strip()):
        # An empty answer that was not cut is not a success; it may still have been billed.
        return Outcome(Kind.RETRY, status, "empty_content",
                       f"empty content (finish_reason {finish!r})", cost=cost_f, usage=usage)
    result = {"usage": usage, "finish_reason": finish, "provider": data.get("provider"),
              "model": data.get("model"), "response": content or "", "reasoning": reasoning}
    gen_id = data.get("id") if isinstance(data.get("id"), str) else generation_id
    if gen_id:
        result["generation_id"] = gen_id
    native = choice.get("native_finish_reason")
    if native is not None:
        result["native_finish_reason"] = native
    if "token_ids" in choice and (ids := sampled_ids(choice["token_ids"])) is not None:
        result["response_token_ids"] = ids
    return Outcome(Kind.OK, status, "ok", result=result, cost=cost_f, usage=usage, cut=cut,
                   think_split=split)


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
                  proxy: str | None = None, think: str = "split") -> Outcome:
    """One POST; never raises for network trouble (it becomes a RETRY outcome)."""
    started = time.monotonic()
    try:
        async with session.post(url, data=body, headers=headers, timeout=timeout,
                                proxy=proxy) as resp:
            raw = await resp.read()
            h = resp.headers
            outcome = classify_body(resp.status, raw,
                                    parse_retry_after(h.get("Retry-After"),
                                                      h.get("retry-after-ms")),
                                    h.get("Content-Type"), h.get("X-Generation-Id"), think)
    except asyncio.TimeoutError:
        outcome = Outcome(Kind.RETRY, None, "timeout", "request timed out", server_failure=True)
    except (aiohttp.ClientError, ConnectionError, OSError) as exc:
        outcome = Outcome(Kind.RETRY, None, "connection",
                          redact(f"{type(exc).__name__}: {exc}")[:300], server_failure=True)
    outcome.latency_s = time.monotonic() - started
    return outcome
