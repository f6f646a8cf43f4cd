"""The project's own fake OpenRouter: a real aiohttp server on loopback.

Tests, the benchmark and the demo point the payload at it instead of the real API.
It answers in OpenRouter's shapes (`/chat/completions`, `/key`,
`/models/{author}/{slug}/endpoints`, integer `error.code` bodies), injects the faults a
hosted API really throws (by probability and/or on a deterministic schedule), charges
a cost per request, and records what it saw so a test can prove exactly-once delivery:
peak concurrency, requests, and successes per prompt.

A prompt is identified by `payload.records.derive_id(messages)`: the same stable hash the
payload uses for records without an id. Every answer embeds a digest of the prompt's last
user message (`answer_digest`), so a test can check each response is paired with its own
prompt.

Modes that stand in for real servers and real trouble (all off by default):
- `capacity=K`: at most K requests served at once; the rest are refused at the door with
  `capacity_status` (429, or 402 as OpenRouter's in-flight budget does) and Retry-After;
- `outage_at_s` / `outage_for_s` / `outage_kind` (or `start_outage()`): every request
  fails for T seconds: "503", "reset" (the connection is cut), or "refuse" (the port is
  closed: connection refused), then the server is back;
- `known_models`: any other model is a 400 "Invalid model name" (a misconfigured run);
- `stream_only`: every answer is an SSE stream, as a streaming-only server sends;
- `error_null` (`"error": null` beside a valid choice), `content_parts` (content as a list
  of text parts), `report_cost=False` (no `usage.cost`), `pricing=False` (the endpoint
  list has no prices);
- fault kinds for sporadic trouble: `429` (with Retry-After), `429_bare` (without),
  `429_quota` (OpenAI's insufficient_quota), `429_huge` (Retry-After: 86400), `429_date`
  (an HTTP-date Retry-After), `429_ms` (retry-after-ms), `409`, `422_detail` (a FastAPI
  `{"detail": ...}` error), `sse`; `fast_faults=True` draws them at the door, before the
  latency, as a rate limiter in front of a server answers;
- `timeline=True` records, per 100 ms, arrivals, successes, refusals and the peak number
  of requests in the server (the benchmark reads recovery after an outage from it);
- a thinking model: `thinking="field"` (reasoning in `message.reasoning`) or `"tags"`
  (`<think>…</think>` inside `content`, `reasoning: null`), `reasoning_tokens` of it before
  the answer, so a request whose `max_tokens` does not cover them ends
  `finish_reason: "length"` with empty content (`native_finish_reason: "max_tokens"`);
  `generation_header=True` also sends `X-Generation-Id` (`body_id=False`: only there);
  `providers=[...]` spreads answers over several provider names (by prompt);
- `token_ids=True`: a request with `return_token_ids: true` (vLLM's field) gets
  `choices[0].token_ids` (one id below `token_vocab` per completion token, a function of the
  answer: `fake_token_ids`) and `prompt_token_ids`, as vLLM answers; what it sent is kept
  per prompt (`token_ids_by_prompt`); `refuse_fields=("return_token_ids",)` answers a
  request carrying such a field 400 "Unrecognized request argument supplied: …" (OpenAI);
- streaming: a request with `"stream": true` gets the same answer as SSE (streams.py), in
  OpenRouter's shape (`: OPENROUTER PROCESSING` comments while queued, `delta.reasoning` then
  `delta.content` chunks of 1-4 tokens, `finish_reason`/`native_finish_reason` on the last,
  a `choices: []` usage chunk, `data: [DONE]`, `X-Generation-Id`; vLLM's per-chunk `token_ids`
  and first-chunk `prompt_token_ids` when asked). `stream=StreamPlan(...)` paces and breaks
  it: chunk sizes, a log-normal token rate per request, a queue time, `time_scale` (fake
  seconds per real one: an answer past the old 600 s wall in a second), shares (or a
  schedule) of mid-stream `error` events, cut connections and stalls. The fake counts
  `streams_started/completed/cancelled_by_client/errored/cut/stalled`, `tokens_billed`
  (completion tokens written), a `stream_log` per stream, and `tokens_billed_after(t)`
  (also `GET /_fake/stats?billed_after=T`, T a `time.monotonic()` moment): closing the
  connection stops the bill. `reasoning_sigma > 0` draws each prompt's reasoning length
  log-normal around `reasoning_tokens` (thinking-size answers: e.g. 3500, 0.8);
- `check_history=True`: every assistant turn in a request's history must be what the fake
  answered for the history before it (its visible content), as `--turns all` sends it;
  mismatches are counted (`history_mismatches`, checked turns in `history_checked`).

The Batch API (`/files`, `/batches`, OpenAI's shapes; `batches=BatchPlan(...)` sets its
timings, partial errors, expiry, failure, or turns it off) answers each line as a chat
request would be answered, at the batch price; `fake.batches.stats` counts submissions per
input file, so a test can prove a batch was never submitted twice. `stable_ids=True` makes
an answer's id a function of its prompt, the same alone or in a batch.

Every chat request is counted per prompt (`requests_by_prompt`, by the request's
`derive_id(messages)`), answered or not.

Run alone: `python -m handoff.testing.fakeapi --host 127.0.0.1 --port 0 --key-file F`; it prints
`base_url=...` on stdout once listening. The accepted key comes from `--key-file` or
`$FAKEAPI_KEY` / `$OPENROUTER_API_KEY`, never argv. `GET /_fake/stats` returns the counters;
the streaming knobs are flags too (`--time-scale`, `--queue-s`, `--error-share`, ...).

The package: `faults` (fault kinds, `FaultPlan`, `FakeStats`, `answer_digest`), `answers`
(what each answer and fault looks like on the wire), `streams` (an answer as SSE:
`StreamPlan`, `Streamer`), `server` (`FakeOpenRouter`: which
answer a request gets), `batches` (the Batch API), `__main__` (run alone). Its names are re-exported here.
"""

from handoff.testing.fakeapi.batches import BatchPlan, BatchService
from handoff.testing.fakeapi.faults import (
    ALL_FAULTS,
    DEFAULT_ENDPOINTS,
    OTHER_FAULTS,
    PREFIX,
    RETRYABLE_FAULTS,
    FakeStats,
    FaultPlan,
    answer_digest,
    fake_token_ids,
)
from handoff.testing.fakeapi.server import FakeOpenRouter
from handoff.testing.fakeapi.streams import StreamPlan

__all__ = ["ALL_FAULTS", "DEFAULT_ENDPOINTS", "OTHER_FAULTS", "PREFIX", "RETRYABLE_FAULTS",
           "BatchPlan", "BatchService", "FakeOpenRouter", "FakeStats", "FaultPlan", "StreamPlan", "answer_digest",
           "fake_token_ids"]
