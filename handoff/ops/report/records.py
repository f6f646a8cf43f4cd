"""A job's answers and failures, read once, streamed (`RecordStats`).

The records (docs/records.md) are read line by line and never kept: what stays of each is
a few numbers in compact arrays (its latency, token counts, cost, `answered_at`, the host
that answered it: ~40 bytes a record, never its text), the counts by provider, finish
reason, model and error kind (at most `MAX_NAMES` names each, the rest as "other"), and a
bounded sample for the answers browser: `answers` random answers, and as many of the cut
ones and of the failures (reservoir samples, so every record has the same chance), each
text cut to a few thousand characters. A 40k-record run of thinking-size answers (600 MB)
keeps ~2 MB.

The records are the host's word too: a line longer than `MAX_LINE_BYTES`, one that is not
a JSON object (non-finite numbers read as missing), and a last line without its newline
(still being written when fetched) are skipped and counted; every field is optional and
read by type.

Which host answered a record: the merged dataset (`DIR/<job>/output.jsonl`) does not say,
so it is the host of the record's shard (`job.json`'s `shard_hosts`, the payload's own
`shard_of`); without a merged dataset the per-host copies are read in shard order, each
id counted once (as fetch's merge keeps it).
"""

from __future__ import annotations

import json
import math
import random
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handoff.host import untrusted
from payload.generate.journal import IdSet, id_hash
from payload.records import shard_of

MAX_LINE_BYTES = 16 << 20  # one record (a --turns all conversation of long answers: a few MB)
MAX_NAMES = 32  # providers, finish reasons, models, error kinds kept by name
TEXT_CHARS = {"prompt": 1200, "reasoning": 2400, "response": 2400, "error": 600}
NAN = float("nan")


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


# untrusted.loads' rules (NaN, Infinity and overflowing numbers read as missing), with one
# decoder for every line: json.loads with arguments builds a new one per call (a third of
# the time of a 40k-record read).
_DECODER = json.JSONDecoder(parse_constant=lambda _name: None, parse_float=_finite)


def cut(text: Any, limit: int) -> str | None:
    if not isinstance(text, str):
        return None
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit:,} more characters)"


def quantile(ordered: list[float], p: float) -> float:
    """The `p` quantile of sorted values, interpolated between the closest ranks (numpy's
    default, `statistics.quantiles(method="inclusive")`)."""
    h = (len(ordered) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (h - lo)


def quantiles(values: Iterable[float], ps: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, float] | None:
    """{"p50": …, "p90": …, "p99": …} of the finite values; None when there is none."""
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return None
    return {f"p{round(p * 100)}": quantile(ordered, p) for p in ps}


class Names:
    """Counts by name, at most MAX_NAMES names (later ones counted as "other")."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._shown: dict[Any, str] = {}  # the names seen, as shown (a few: providers, reasons)

    def add(self, name: Any, n: int = 1) -> str:
        shown = self._shown.get(name) if isinstance(name, str) else None
        if shown is None:
            shown = untrusted.shown_name(name) if name is not None else "unknown"
            if shown not in self.counts and len(self.counts) >= MAX_NAMES:
                shown = "other"
            if isinstance(name, str) and len(self._shown) < 4 * MAX_NAMES:
                self._shown[name] = shown
        self.counts[shown] = self.counts.get(shown, 0) + n
        return shown

    def ranked(self) -> list[tuple[str, int]]:
        return sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))


@dataclass
class Answer:
    """One entry of the answers browser (texts cut)."""

    why: str  # "random", "cut" or "error"
    id: str
    host: str
    provider: str = "-"
    finish_reason: str = "-"
    model: str = "-"
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost: float | None = None
    attempts: int | None = None
    prompt: str | None = None
    reasoning: str | None = None
    response: str | None = None
    error: str | None = None


class Reservoir:
    """A uniform sample of at most `size` items from a stream (Algorithm R, seeded)."""

    def __init__(self, size: int, rnd: random.Random) -> None:
        self.size = size
        self.rnd = rnd
        self.seen = 0
        self.items: list[Answer] = []

    def offer(self) -> int | None:
        """Where the next item goes (an index), or None when it is not sampled."""
        self.seen += 1
        if len(self.items) < self.size:
            return len(self.items)
        j = self.rnd.randrange(self.seen)
        return j if j < self.size else None

    def put(self, where: int, item: Answer) -> None:
        if where == len(self.items):
            self.items.append(item)
        else:
            self.items[where] = item


def _usage(rec: dict[str, Any]) -> tuple[int | None, int | None, int | None, float | None]:
    usage = rec.get("usage")
    if not isinstance(usage, dict):
        return None, None, None, None
    details = usage.get("completion_tokens_details")
    reasoning = untrusted.count(details.get("reasoning_tokens")) if isinstance(details, dict) else None
    return (untrusted.count(usage.get("prompt_tokens")), untrusted.count(usage.get("completion_tokens")),
            reasoning, untrusted.number(usage.get("cost"), minimum=0))


def _last_user(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return None
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):  # text parts
                content = "".join(p.get("text", "") for p in content
                                  if isinstance(p, dict) and isinstance(p.get("text"), str))
            return content if isinstance(content, str) else None
    return None


@dataclass
class RecordStats:
    """What the records of one job say (see the module docstring)."""

    hosts: list[str] = field(default_factory=list)  # by shard (job.json's shard_hosts)
    sample_size: int = 200
    answers: int = 0
    failures: int = 0
    cut: int = 0
    cost: float = 0.0
    priced: int = 0  # answers with a cost in their usage
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    with_reasoning_count: int = 0  # answers whose usage names their reasoning tokens
    unreadable: int = 0  # lines that are no record (or too long)
    torn: int = 0  # last lines without their newline (being written when fetched)
    duplicates: int = 0  # a second copy of an id (per-host copies read without a merge)
    # one entry per answer, in file order
    latency: array[float] = field(default_factory=lambda: array("d"))
    at: array[float] = field(default_factory=lambda: array("d"))  # answered_at, NaN if unknown
    prompt: array[int] = field(default_factory=lambda: array("l"))  # -1: unknown
    completion: array[int] = field(default_factory=lambda: array("l"))
    reasoning: array[int] = field(default_factory=lambda: array("l"))
    costs: array[float] = field(default_factory=lambda: array("d"))
    host_of: array[int] = field(default_factory=lambda: array("H"))  # index into host_names
    # one entry per failure
    error_at: array[float] = field(default_factory=lambda: array("d"))
    error_kind: array[int] = field(default_factory=lambda: array("H"))  # index into error_names
    providers: Names = field(default_factory=Names)
    finish_reasons: Names = field(default_factory=Names)
    models: Names = field(default_factory=Names)
    errors: Names = field(default_factory=Names)
    host_names: list[str] = field(default_factory=list)
    error_names: list[str] = field(default_factory=list)
    sample: dict[str, Reservoir] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rnd = random.Random(20260101)
        self.sample = {why: Reservoir(self.sample_size, rnd) for why in ("random", "cut", "error")}

    # -- who answered ---------------------------------------------------------------------
    def _host_index(self, name: str) -> int:
        try:
            return self.host_names.index(name)
        except ValueError:
            self.host_names.append(name)
            return len(self.host_names) - 1

    def owner(self, key: str) -> str:
        n = len(self.hosts)
        if n == 0:
            return "-"
        return self.hosts[shard_of(key, n)] if n > 1 else self.hosts[0]

    # -- one record -------------------------------------------------------------------------
    def add_answer(self, rec: dict[str, Any], host: str | None) -> None:
        key = str(rec.get("id"))
        host = host or self.owner(key)
        prompt_t, completion_t, reasoning_t, cost = _usage(rec)
        latency = untrusted.number(rec.get("latency_s"), minimum=0)
        at = untrusted.number(rec.get("answered_at"), minimum=0)
        finish = self.finish_reasons.add(rec.get("finish_reason"))
        provider = self.providers.add(rec.get("provider"))
        model = self.models.add(rec.get("model"))
        is_cut = finish == "length"
        self.answers += 1
        self.cut += is_cut
        if cost is not None:
            self.cost += cost
            self.priced += 1
        self.prompt_tokens += prompt_t or 0
        self.completion_tokens += completion_t or 0
        if reasoning_t is not None:
            self.reasoning_tokens += reasoning_t
            self.with_reasoning_count += 1
        self.latency.append(NAN if latency is None else latency)
        self.at.append(NAN if at is None else at)
        self.prompt.append(-1 if prompt_t is None else prompt_t)
        self.completion.append(-1 if completion_t is None else completion_t)
        self.reasoning.append(-1 if reasoning_t is None else reasoning_t)
        self.costs.append(NAN if cost is None else cost)
        self.host_of.append(self._host_index(host))
        pool = self.sample["cut" if is_cut else "random"]
        where = pool.offer()
        if where is not None:
            pool.put(where, Answer(
                "cut" if is_cut else "random", untrusted.shown_name(key), host, provider, finish,
                model, latency, prompt_t, completion_t, reasoning_t, cost,
                untrusted.count(rec.get("attempts")),
                cut(_last_user(rec.get("messages")), TEXT_CHARS["prompt"]),
                cut(rec.get("reasoning"), TEXT_CHARS["reasoning"]),
                cut(rec.get("response"), TEXT_CHARS["response"])))

    def add_failure(self, rec: dict[str, Any], host: str | None) -> None:
        key = str(rec.get("id"))
        host = host or self.owner(key)
        error = rec.get("error") if isinstance(rec.get("error"), dict) else {}
        kind = self.errors.add(error.get("type") if isinstance(error, dict) else None)
        if kind not in self.error_names:
            self.error_names.append(kind)
        self.failures += 1
        at = untrusted.number(rec.get("answered_at"), minimum=0)
        self.error_at.append(NAN if at is None else at)
        self.error_kind.append(self.error_names.index(kind))
        self._host_index(host)
        pool = self.sample["error"]
        where = pool.offer()
        if where is not None:
            status = untrusted.integer(error.get("status")) if isinstance(error, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            pool.put(where, Answer(
                "error", untrusted.shown_name(key), host, finish_reason="error",
                attempts=untrusted.count(rec.get("attempts")),
                error=cut(f"{kind}{f' ({status})' if status is not None else ''}: {message}",
                          TEXT_CHARS["error"])))

    # -- what the browser shows ---------------------------------------------------------------
    def sampled(self) -> list[Answer]:
        return [a for why in ("cut", "error", "random") for a in self.sample[why].items]

    def host_answers(self, host: str) -> list[int]:
        """The indexes of the answers `host` gave."""
        if host not in self.host_names:
            return []
        k = self.host_names.index(host)
        return [i for i, h in enumerate(self.host_of) if h == k]


def lines(path: Path, stats: RecordStats) -> Iterator[dict[str, Any]]:
    """The records of one file, as objects; what is no record is counted in `stats`."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    with fh:
        while True:
            line = fh.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_LINE_BYTES:
                stats.unreadable += 1
                while line and not line.endswith(b"\n"):  # the rest of that line
                    line = fh.readline(MAX_LINE_BYTES)
                continue
            if not line.endswith(b"\n"):
                if line.strip():
                    stats.torn += 1
                return
            if not line.strip():
                continue
            try:
                rec = _DECODER.decode(line.decode("utf-8"))
            except (ValueError, RecursionError):  # not UTF-8 (a ValueError too), not JSON
                rec = None
            if not isinstance(rec, dict) or "id" not in rec:
                stats.unreadable += 1
                continue
            yield rec


def read_merged(stats: RecordStats, output: Path, errors: Path) -> None:
    """The merged dataset: every id once already; hosts by shard."""
    for rec in lines(output, stats):
        stats.add_answer(rec, None)
    for rec in lines(errors, stats):
        stats.add_failure(rec, None)


def read_copies(stats: RecordStats, copies: list[tuple[str, Path, Path]]) -> None:
    """Per-host copies `(host, output, errors)` in shard order, each id once (an answer
    anywhere wins over a failure, the first copy over a later one)."""
    answered = IdSet()
    for host, output, _ in copies:
        for rec in lines(output, stats):
            h = id_hash(str(rec.get("id")))
            if h in answered:
                stats.duplicates += 1
                continue
            answered.add(h)
            stats.add_answer(rec, host)
    failed = IdSet()
    for host, _, errors in copies:
        for rec in lines(errors, stats):
            h = id_hash(str(rec.get("id")))
            if h in answered or h in failed:
                stats.duplicates += h in failed
                continue
            failed.add(h)
            stats.add_failure(rec, host)
