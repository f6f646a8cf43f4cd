"""What the fake OpenRouter throws and counts: the fault kinds, a `FaultPlan` (by probability
and/or on a deterministic schedule), the counters a test reads (`FakeStats`), and the digest
that ties each answer to its own prompt (`answer_digest`).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import random
import time
from array import array
from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import Any

PREFIX = "/api/v1"

# Fault kinds the plan understands. Retryable ones first: `FaultPlan.mix` spreads over them.
# `length_empty` (cut by max_tokens, no content) is not one: it is an answer, done at once.
RETRYABLE_FAULTS = ("429", "500", "502", "503", "504", "524", "529", "reset", "malformed",
                    "choice_error", "finish_error", "empty", "402_inflight")

OTHER_FAULTS = ("hang", "401", "402", "400", "403", "404", "429_bare", "429_quota",
                "429_huge", "429_date", "429_ms", "409", "422_detail", "sse", "length_empty")

ALL_FAULTS = RETRYABLE_FAULTS + OTHER_FAULTS

MESSAGES = {
    400: "Invalid request parameters", 401: "No auth credentials found",
    402: "Insufficient credits. Add more using https://openrouter.ai/credits",
    403: "Request blocked by moderation", 404: "No endpoints found that can handle the request",
    408: "Operation timed out", 429: "Rate limit exceeded", 500: "Internal Server Error",
    502: "Provider returned error", 503: "Service temporarily unavailable",
    504: "Gateway timeout", 524: "Request timed out. Please try again later.",
    529: "Provider returned error",
}


def answer_digest(messages: list[dict[str, Any]]) -> str:
    """16 hex of sha256 over the last user message's content: what every answer embeds."""
    last: dict[str, Any] = next(
        (m for m in reversed(messages) if m.get("role") == "user"), {})
    content = last.get("content")
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def fake_token_ids(text: str, n: int, vocab: int) -> list[int]:
    """n stand-in "sampled" token ids below `vocab`, a pure function of the answer's text."""
    out: list[int] = []
    counter = 0
    while len(out) < n:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        out.extend(b % vocab for b in digest)
        counter += 1
    return out[:n]


@dataclass
class FaultPlan:
    """Which faults to inject. `rates`: kind -> probability per request (summing <= 1).
    `schedule`: 1-based request number -> kind, applied before any random draw.
    `per_prompt_first`: kind forced on the first attempt of EVERY prompt (to exercise retries)."""

    rates: dict[str, float] = field(default_factory=dict)
    schedule: dict[int, str] = field(default_factory=dict)
    seed: int | None = None
    retry_after_s: float = 0.2
    hang_s: float = 3600.0

    def __post_init__(self) -> None:
        for kind in [*self.rates, *self.schedule.values()]:
            if kind not in ALL_FAULTS:
                raise ValueError(f"unknown fault {kind!r}; known: {', '.join(ALL_FAULTS)}")
        if sum(self.rates.values()) > 1.0 + 1e-9:
            raise ValueError("fault rates sum to more than 1")
        self._rng = random.Random(self.seed)

    @classmethod
    def mix(cls, rate: float, *, seed: int | None = None, kinds: tuple[str, ...] = RETRYABLE_FAULTS,
            retry_after_s: float = 0.2) -> FaultPlan:
        """`rate` of all requests fail, spread evenly over `kinds` (default: every retryable one)."""
        return cls(rates={k: rate / len(kinds) for k in kinds}, seed=seed,
                   retry_after_s=retry_after_s)

    def draw(self, request_no: int) -> str | None:
        if request_no in self.schedule:
            return self.schedule[request_no]
        if not self.rates:
            return None
        x = self._rng.random()
        for kind, p in self.rates.items():
            if x < p:
                return kind
            x -= p
        return None

    @classmethod
    def from_json(cls, text: str) -> FaultPlan:
        raw = json.loads(text)
        return cls(rates=raw.get("rates", {}),
                   schedule={int(k): v for k, v in raw.get("schedule", {}).items()},
                   seed=raw.get("seed"), retry_after_s=raw.get("retry_after_s", 0.2),
                   hang_s=raw.get("hang_s", 3600.0))


@dataclass(slots=True)
class StreamRecord:
    """One stream the fake sent (streams.py): `outcome` is completed, cancelled (the client
    closed first), error (a mid-stream error event), cut, or aborted (the server stopped);
    times are `time.monotonic()`."""

    number: int
    prompt: str
    started: float
    tokens_total: int  # the answer's completion tokens
    tokens_billed: int = 0  # ... of which written before the stream ended
    stalled: bool = False
    outcome: str = ""
    ended: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class FakeStats:
    requests: int = 0
    in_flight: int = 0
    peak_concurrency: int = 0
    successes: int = 0
    total_cost: float = 0.0
    capacity_refusals: int = 0
    outage_refusals: int = 0
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    successes_by_prompt: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bodies: list[dict[str, Any]] = field(default_factory=list)  # only when record_bodies
    endpoint_calls: int = 0
    key_calls: int = 0
    requests_by_prompt: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    history_checked: int = 0  # assistant turns in histories checked (check_history)
    history_mismatches: int = 0  # ... that were not what the fake had answered
    # The sampled token ids answered (token_ids=True, asked with return_token_ids), by
    # derive_id of the request's messages; and requests that asked for them.
    token_ids_by_prompt: dict[str, list[int]] = field(default_factory=dict)
    token_id_requests: int = 0
    # Per 100 ms since the first chat request: [arrivals, successes, refusals, peak in server]
    timeline: dict[int, list[int]] = field(default_factory=dict)
    outage_windows: list[tuple[float, float]] = field(default_factory=list)  # (start, end) s
    # Streams ("stream": true; streams.py): how each ended, and the completion tokens written
    # ("billed"), also as a log of (time.monotonic(), tokens) per write for tokens_billed_after.
    streams_started: int = 0
    streams_completed: int = 0
    streams_cancelled_by_client: int = 0
    streams_errored: int = 0
    streams_cut: int = 0
    streams_stalled: int = 0
    tokens_billed: int = 0
    stream_log: list[StreamRecord] = field(default_factory=list)
    bill_times: array[float] = field(default_factory=lambda: array("d"))
    bill_tokens: array[int] = field(default_factory=lambda: array("q"))
    _bill_bucket: float = -1.0  # when the log's last entry began (entries cover 1 ms)

    def bill(self, tokens: int) -> None:
        """Count `tokens` written now. Writes within 1 ms of an entry's first one join it, the
        entry stamped with its latest: an hour of 2000 streams stays tens of MB, and
        tokens_billed_after(t) errs by at most 1 ms of writes, towards counting them."""
        self.tokens_billed += tokens
        now = time.monotonic()
        if now - self._bill_bucket < 0.001:
            self.bill_times[-1] = now
            self.bill_tokens[-1] += tokens
        else:
            self._bill_bucket = now
            self.bill_times.append(now)
            self.bill_tokens.append(tokens)

    def tokens_billed_after(self, t: float) -> int:
        """Completion tokens written after the `time.monotonic()` moment t (that clock is
        system-wide on Linux, so a client in another process may pass its own)."""
        return sum(self.bill_tokens[bisect.bisect_right(self.bill_times, t):])

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("bill_times", "bill_tokens", "_bill_bucket")}
        out["stream_log"] = [r.as_dict() for r in self.stream_log]
        out["faults"] = dict(self.faults)
        out["successes_by_prompt"] = dict(self.successes_by_prompt)
        out["requests_by_prompt"] = dict(self.requests_by_prompt)
        out["bodies"] = list(self.bodies)
        out["timeline"] = {str(k): v for k, v in self.timeline.items()}
        out["outage_windows"] = [list(w) for w in self.outage_windows]
        return out

DEFAULT_ENDPOINTS: list[dict[str, Any]] = [
    {"provider_name": "DeepInfra", "tag": "deepinfra/int4", "quantization": "int4"},
    {"provider_name": "Together", "tag": "together/int4", "quantization": "int4"},
    {"provider_name": "Fireworks", "tag": "fireworks", "quantization": "int4"},
    {"provider_name": "Moonshot AI", "tag": "moonshotai", "quantization": "fp8"},
]


__all__ = ["ALL_FAULTS", "DEFAULT_ENDPOINTS", "OTHER_FAULTS", "PREFIX", "RETRYABLE_FAULTS", "FakeStats",
           "FaultPlan", "StreamRecord", "answer_digest", "fake_token_ids"]
