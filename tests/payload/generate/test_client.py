"""One attempt's answer read for what it means: the error taxonomy (status AND body),
the answer shapes of other servers, Retry-After in every form, the record's fields."""

from __future__ import annotations

import json
import time

import pytest

from payload.generate.client import (
    MAX_RETRY_AFTER_S,
    Kind,
    classify_body,
    parse_retry_after,
)

pytestmark = pytest.mark.timeout(30)


def ok_body(content: object = "hi", finish: str = "stop", **extra) -> bytes:
    choice = {"index": 0, "finish_reason": finish,
              "message": {"role": "assistant", "content": content}, **extra}
    return json.dumps({"choices": [choice], "usage": {"cost": 0.5}, "provider": "P",
                       "model": "m"}).encode()


def err_body(code: int, **meta) -> bytes:
    err = {"code": code, "message": f"e{code}"}
    if meta:
        err["metadata"] = meta
    return json.dumps({"error": err}).encode()


@pytest.mark.parametrize(("status", "body", "retry_after", "kind", "etype"), [
    (200, ok_body(), None, Kind.OK, "ok"),
    (200, ok_body("partial", "length"), None, Kind.OK, "ok"),  # truncated but has content
    # Cut by max_tokens with nothing but reasoning: an answer (docs/generator.md, "Thinking answers and turns"), not a retry.
    (200, ok_body("", "length"), None, Kind.OK, "ok"),
    (200, ok_body(None), None, Kind.RETRY, "empty_content"),
    (200, ok_body("  \n"), None, Kind.RETRY, "empty_content"),
    (200, ok_body("x", "error"), None, Kind.RETRY, "provider_error"),
    (200, ok_body(None, error={"code": 502, "message": "up"}), None, Kind.RETRY,
     "provider_error"),
    (200, b'{"choices": [', None, Kind.RETRY, "malformed_json"),
    (200, b'{"id": 1}', None, Kind.RETRY, "malformed_json"),
    # OpenRouter's integer error.code inside a 200 decides, not the status.
    (200, err_body(429), 2.0, Kind.RETRY, "rate_limited"),
    (200, err_body(401), None, Kind.AUTH, "unauthorized"),
    (401, err_body(401), None, Kind.AUTH, "unauthorized"),
    (402, err_body(402), None, Kind.CREDIT, "payment_required"),
    (402, err_body(402), 1.0, Kind.RETRY, "inflight_limited"),
    (400, err_body(400), None, Kind.PERMANENT, "bad_request"),
    (403, err_body(403), None, Kind.PERMANENT, "forbidden"),
    (404, err_body(404, reason="constraint_filtered"), None, Kind.PERMANENT, "not_found"),
    (404, err_body(404, retryable=True), None, Kind.RETRY, "not_found"),
    (408, err_body(408), None, Kind.RETRY, "timeout"),
    (409, err_body(409), None, Kind.RETRY, "conflict"),  # retried, as the openai SDK does
    (413, err_body(413), None, Kind.PERMANENT, "payload_too_large"),
    (429, err_body(429), None, Kind.RETRY, "rate_limited"),
    (500, b"<html>oops</html>", None, Kind.RETRY, "server_error"),
    (502, err_body(502), None, Kind.RETRY, "bad_gateway"),
    (503, err_body(503), None, Kind.RETRY, "unavailable"),
    (504, err_body(504), None, Kind.RETRY, "gateway_timeout"),
    (524, err_body(524), None, Kind.RETRY, "edge_timeout"),
    (529, err_body(529), None, Kind.RETRY, "overloaded"),
    # Shapes of other servers (issue 13).
    (429, json.dumps({"error": {"message": "quota", "type": "insufficient_quota",
                                "code": "insufficient_quota"}}).encode(), None, Kind.CREDIT,
     "insufficient_quota"),
    (400, json.dumps({"error": {"message": "Invalid model name", "code": "400"}}).encode(),
     None, Kind.PERMANENT, "bad_request"),  # LiteLLM's string codes
    (200, b"data: {\"choices\": []}\n\ndata: [DONE]\n\n", None, Kind.PERMANENT,
     "streaming_only"),
])
def test_error_taxonomy(status, body, retry_after, kind, etype):
    outcome = classify_body(status, body, retry_after)
    assert (outcome.kind, outcome.type) == (kind, etype)
    # Throttled: the server asks for less load. Server failure: it may be down as a whole.
    assert outcome.throttled == (etype in ("rate_limited", "inflight_limited"))
    assert outcome.server_failure == (kind is Kind.RETRY and status >= 500
                                      and etype != "provider_error")
    if retry_after is not None and kind is Kind.RETRY:
        assert outcome.retry_after == retry_after


def test_shapes_of_other_servers():
    # "error": null beside a valid choice is no error (it was a permanent failure "None").
    body = json.loads(ok_body("hi"))
    body["error"] = None
    assert classify_body(200, json.dumps(body).encode(), None).kind is Kind.OK
    # content as a list of text parts is joined.
    parts = ok_body([{"type": "text", "text": "ab"}, {"type": "image_url", "image_url": {}},
                     {"type": "text", "text": "cd"}])
    o = classify_body(200, parts, None)
    assert o.kind is Kind.OK and o.result["response"] == "abcd"
    # FastAPI's {"detail": ...} keeps its message.
    d = classify_body(422, json.dumps({"detail": [{"msg": "field required"}]}).encode(), None)
    assert (d.kind, d.message) == (Kind.PERMANENT, "field required")
    d = classify_body(404, b'{"detail": "Not Found"}', None)
    assert d.message == "Not Found"
    # An SSE body recognised from the content type too.
    sse = classify_body(200, b"event: x", None, "text/event-stream; charset=utf-8")
    assert sse.type == "streaming_only"


def test_retry_after_forms_and_cap():
    assert parse_retry_after("86400") == MAX_RETRY_AFTER_S == 300.0  # issue 13 case 7
    assert parse_retry_after(None, "1500") == 1.5  # retry-after-ms wins
    assert parse_retry_after("9", "250") == 0.25
    assert parse_retry_after("2", "nan") == 2.0
    assert parse_retry_after("inf") is None
    import email.utils
    soon = parse_retry_after(email.utils.formatdate(time.time() + 30, usegmt=True))
    assert soon is not None and 25 < soon <= 30
    far = parse_retry_after(email.utils.formatdate(time.time() + 86400 * 3, usegmt=True))
    assert far == 300.0


def test_ok_outcome_carries_the_record_fields():
    o = classify_body(200, json.dumps({"choices": [{"finish_reason": "stop", "message": {
        "content": "a", "reasoning": "r"}}], "usage": {"cost": 0.25, "prompt_tokens": 3},
        "provider": "P", "model": "m"}).encode(), None)
    assert o.cost == 0.25
    assert o.result == {"usage": {"cost": 0.25, "prompt_tokens": 3}, "finish_reason": "stop",
                        "provider": "P", "model": "m", "response": "a", "reasoning": "r"}


# -- thinking answers (docs/generator.md, "Thinking answers and turns") ---------------------------------------
def think_body(content: object, reasoning: object = None, finish: str = "stop", **top) -> bytes:
    return json.dumps({"choices": [{"finish_reason": finish, "native_finish_reason": "eos",
                                    "message": {"content": content, "reasoning": reasoning}}],
                       "usage": {"cost": 0.1}, "provider": "P", "model": "m", **top}).encode()


@pytest.mark.parametrize(("content", "reasoning", "answer"), [
    ("<think>step 1\nstep 2</think>\n\nThe answer.", "step 1\nstep 2", "The answer."),
    ("step 1</think>The answer.", "step 1", "The answer."),  # the block opened in the prompt
    ("<think>still thinking when cut", "still thinking when cut", ""),  # cut while thinking
])
def test_think_markers_in_content_are_split(content, reasoning, answer):
    finish = "length" if not answer else "stop"
    o = classify_body(200, think_body(content, finish=finish), None)
    assert o.kind is Kind.OK and o.think_split
    assert (o.result["reasoning"], o.result["response"]) == (reasoning, answer)
    refused = classify_body(200, think_body(content, finish=finish), None, think="refuse")
    assert (refused.kind, refused.type) == (Kind.PERMANENT, "think_in_content")
    assert "--think-in-content" in refused.message


def test_markers_are_left_alone_when_reasoning_came_in_its_field():
    o = classify_body(200, think_body("<think>x</think>y", reasoning="real"), None)
    assert not o.think_split and o.result["response"] == "<think>x</think>y"
    plain = classify_body(200, think_body("no markers here"), None)
    assert not plain.think_split and plain.result["reasoning"] is None


def test_reasoning_content_is_read_when_reasoning_is_absent():
    """DeepSeek's API and older vLLM name the trace `reasoning_content`: it is kept, not lost."""
    body = json.dumps({"choices": [{"finish_reason": "stop", "message": {
        "content": "Paris.", "reasoning_content": "the capital"}}]}).encode()
    o = classify_body(200, body, None)
    assert o.kind is Kind.OK and o.result["reasoning"] == "the capital"
    assert not o.think_split
    both = classify_body(200, json.dumps({"choices": [{"finish_reason": "stop", "message": {
        "content": "a", "reasoning": "r", "reasoning_content": "other"}}]}).encode(), None)
    assert both.result["reasoning"] == "r"
    odd = classify_body(200, think_body("a", reasoning={"not": "text"}), None)
    assert odd.result["reasoning"] is None


def test_a_cut_answer_is_done_even_empty_and_keeps_its_provenance():
    o = classify_body(200, think_body("", reasoning="all of it", finish="length",
                                      id="gen-123"), None)
    assert (o.kind, o.cut) == (Kind.OK, True)
    assert o.result["response"] == "" and o.result["reasoning"] == "all of it"
    assert (o.result["generation_id"], o.result["native_finish_reason"]) == ("gen-123", "eos")
    # The header stands in for a body without an id; an empty stop is still retried.
    h = classify_body(200, think_body("a"), None, generation_id="gen-h")
    assert h.result["generation_id"] == "gen-h"
    assert classify_body(200, think_body("", finish="stop"), None).type == "empty_content"
