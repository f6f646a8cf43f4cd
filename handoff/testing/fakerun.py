"""A fetched run, made up: what `fab fetch --dest DIR` leaves of a generator job sharded
over a few hosts, in the shapes the payload writes (docs/records.md): per host
`DIR/<host>/<job>/` with `output.jsonl`, `output.errors.jsonl`, `status.json`, `job.json`,
`metrics.jsonl` and `log`, and the merged `DIR/<job>/output.jsonl` and
`output.errors.jsonl` (the shards concatenated in shard order, as fetch's merge keeps them).

The workload is the seed run's shape (benchmarks/seed.py): thinking-size answers whose
completion tokens are log-normal (median 3,000, cut at `max_tokens` as `finish_reason:
"length"`), 3.7 characters a token, latencies of a 60 token/s model with a log-normal noise;
each host answers its shard with `concurrency` requests in flight from a fixed start time,
so `answered_at` and the metrics lines follow from the same timeline. Deterministic for a
seed. `fab report`'s tests and benchmarks/run_report.py read it; nothing else does.
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

START = 1_767_225_600.0  # 2026-01-01 00:00 UTC: every made-up run starts here
MODEL = "moonshotai/kimi-k2.5"
PROVIDERS = ("DeepInfra", "Together", "Moonshot AI")
CHARS_PER_TOKEN = 3.7
ERROR_KINDS = (("bad_request", 400, "prompt too long"), ("timeout", None, "request timed out"),
               ("unavailable", 503, "gave up after 6 attempts; last: 503 no healthy upstream"))


@dataclass
class FakeRun:
    """What to make up; `write(dest)` writes it and returns what it wrote (`Written`)."""

    job: str = "prompts"
    hosts: tuple[str, ...] = ("gen-1", "gen-2", "gen-3")
    samples: int = 300  # ids of the whole job (answers + failures)
    failure_share: float = 0.01
    max_tokens: int = 16384
    median_tokens: int = 3000
    concurrency: int = 64  # per host
    time_scale: float = 1.0  # latencies times this (0.1: a run ten times shorter)
    metrics_every_s: float = 10.0
    answered_at: bool = True  # False: records as a payload before round 4 wrote them
    metrics: bool = True  # False: no metrics.jsonl (the generator of an older payload)
    max_cost: float | None = 100.0
    cancelled: int = 0  # per host: requests a stop cancelled in flight (its last metrics line)
    seed: int = 7

    def write(self, dest: Path) -> Written:
        return _write(self, dest)


@dataclass
class Written:
    """Where the run went, and its figures as the records say (for a test to compare)."""

    dest: Path
    job: str
    answers: int = 0
    failures: int = 0
    hosts: dict[str, int] = field(default_factory=dict)  # answers + failures per host


def _corpus(rnd: random.Random, size: int) -> str:
    words = ["the", "a", "of", "to", "is", "and", "we", "so", "that", "x", "=", "value",
             "wait,", "let", "me", "check:", '"quoted"', "f(x)", "\\frac{1}{2}", "naïve", "→",
             "∑", "2", "42", "because", "therefore", "step", "case", "then", "but", "<b>",
             "consider", "if", "not", "answer", "is:", "**bold**", "`code`", "—", "über"]
    out: list[str] = []
    n = 0
    while n < size:
        w = rnd.choice(words)
        out.append(w)
        n += len(w) + 1
        if rnd.random() < 0.02:
            out.append("\n\n")
    return " ".join(out)


@dataclass
class _Answer:
    rid: str
    record: dict[str, Any]
    sent: float
    at: float
    error: str | None = None  # the kind, for a failure


def _answers(run: FakeRun, rnd: random.Random, corpus: str, ids: list[str]) -> list[_Answer]:
    """One host's answers on its timeline: `concurrency` slots, each taking the next id."""
    slots = [START + rnd.uniform(0, 0.5) for _ in range(min(run.concurrency, max(1, len(ids))))]
    heapq.heapify(slots)
    out: list[_Answer] = []

    def text(n_tokens: int) -> str:
        length = min(len(corpus) - 1, int(n_tokens * CHARS_PER_TOKEN))
        start = rnd.randrange(0, len(corpus) - length)
        return corpus[start:start + length]

    for rid in ids:
        sent = heapq.heappop(slots)
        total = max(16, int(rnd.lognormvariate(math.log(run.median_tokens), 0.6)))
        cut = total >= run.max_tokens
        total = min(total, run.max_tokens)
        latency = min(300.0, (1.5 + total / 60.0) * rnd.lognormvariate(0.0, 0.35)) * run.time_scale
        at = sent + latency
        heapq.heappush(slots, at)
        prompt_t = max(8, int(rnd.lognormvariate(math.log(300), 0.5)))
        messages = [{"role": "user", "content": f"Question {rid}: " + text(prompt_t)}]
        if rnd.random() < run.failure_share:
            kind, status, message = rnd.choice(ERROR_KINDS)
            rec: dict[str, Any] = {"id": rid, "error": {"status": status, "type": kind,
                                                        "message": message},
                                   "attempts": rnd.randint(1, 6)}
            if run.answered_at:
                rec["answered_at"] = round(at, 3)
            out.append(_Answer(rid, rec, sent, at, kind))
            continue
        reasoning_t = total if cut else int(total * rnd.uniform(0.6, 0.9))
        cost = round(prompt_t * 6e-7 + total * 2.5e-6, 8)
        rec = {"id": rid,
               "usage": {"prompt_tokens": prompt_t, "completion_tokens": total,
                         "total_tokens": prompt_t + total, "cost": cost,
                         "completion_tokens_details": {"reasoning_tokens": reasoning_t}},
               "finish_reason": "length" if cut else "stop",
               "provider": rnd.choice(PROVIDERS),
               "response": "" if cut else text(total - reasoning_t),
               "reasoning": text(reasoning_t),
               "native_finish_reason": "max_tokens" if cut else "stop", "model": MODEL,
               "generation_id": f"gen-{int(at)}-{rnd.getrandbits(48):012x}",
               "latency_s": round(latency, 3), "attempts": 1}
        if run.answered_at:
            rec["answered_at"] = round(at, 3)
        rec["messages"] = messages
        out.append(_Answer(rid, rec, sent, at))
    out.sort(key=lambda a: a.at)  # the payload writes each record as its answer completes
    return out


def _quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    s = sorted(values)

    def q(p: float) -> float:
        h = (len(s) - 1) * p
        lo = math.floor(h)
        return round(s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (h - lo), 3)

    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


def _metrics(run: FakeRun, answers: list[_Answer], rnd: random.Random) -> list[dict[str, Any]]:
    """The generator's metrics lines (the contract in docs/records.md) for one host."""
    if not answers:
        return []
    end = max(a.at for a in answers)
    lines: list[dict[str, Any]] = []
    cum: dict[str, Any] = {"done": 0, "failed": 0, "cut": 0, "prompt_tokens": 0,
                           "completion_tokens": 0, "reasoning_tokens": 0, "cost": 0.0,
                           "bytes_written": 0}
    errors: dict[str, int] = {}
    retries = 0
    sends = sorted(a.sent for a in answers)
    i, t, prev = 0, START, START
    while True:
        t = min(t + run.metrics_every_s, end + 0.001)
        interval: list[float] = []
        while i < len(answers) and answers[i].at <= t:
            a = answers[i]
            rec = a.record
            cum["bytes_written"] += len(json.dumps(rec, ensure_ascii=False).encode()) + 1
            if a.error:
                cum["failed"] += 1
                errors[a.error] = errors.get(a.error, 0) + 1
            else:
                usage = rec["usage"]
                cum["done"] += 1
                cum["cut"] += rec["finish_reason"] == "length"
                cum["prompt_tokens"] += usage["prompt_tokens"]
                cum["completion_tokens"] += usage["completion_tokens"]
                cum["reasoning_tokens"] += usage["completion_tokens_details"]["reasoning_tokens"]
                cum["cost"] += usage["cost"]
                interval.append(rec["latency_s"])
            i += 1
        if rnd.random() < 0.2:  # a retried 429 now and then: in errors_by_kind, not failed
            errors["rate_limited"] = errors.get("rate_limited", 0) + 1
            retries += 1
        in_flight = bisect.bisect_right(sends, t) - i
        elapsed = t - START
        window = min(run.concurrency, 32 * 16 ** int(elapsed // 2))
        finished = i >= len(answers)
        lines.append({"t": round(t, 3), "role": "generator", "interval_s": round(t - prev, 3),
                      "elapsed_s": round(elapsed, 3), "run": int(START),
                      "state": "finished" if finished else "running",
                      **{k: (round(v, 8) if isinstance(v, float) else v) for k, v in cum.items()},
                      "cancelled": run.cancelled if finished else 0, "retries": retries, "in_flight": in_flight,
                      "window": window, "capacity": None, "errors_by_kind": dict(errors),
                      "answers": len(interval), "latency_s": _quantiles(interval)})
        prev = t
        if finished:
            return lines


def _status(run: FakeRun, answers: list[_Answer], shard: str) -> dict[str, Any]:
    done = [a for a in answers if not a.error]
    end = max((a.at for a in answers), default=START)
    cost = sum(a.record["usage"]["cost"] for a in done)
    providers: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for a in done:
        providers[a.record["provider"]] = providers.get(a.record["provider"], 0) + 1
        reasons[a.record["finish_reason"]] = reasons.get(a.record["finish_reason"], 0) + 1
    iso = "%Y-%m-%dT%H:%M:%SZ"
    return {"state": "finished", "exit_code": 0, "stop_reason": None, "last_error": None,
            "done": len(done), "failed": len(answers) - len(done), "total": len(answers),
            "in_flight": 0, "window": run.concurrency, "cost": round(cost, 8),
            "prompt_tokens": sum(a.record["usage"]["prompt_tokens"] for a in done),
            "completion_tokens": sum(a.record["usage"]["completion_tokens"] for a in done),
            "max_cost": None, "budget_enforced": True,
            "rate_rps": round(len(answers) / max(end - START, 1e-9), 3),
            "tokens_per_s": 0.0, "by_provider": providers, "by_finish_reason": reasons,
            "cut": reasons.get("length", 0), "bad_lines": 0, "duplicates": 0,
            "started": time.strftime(iso, time.gmtime(START)),
            "updated": time.strftime(iso, time.gmtime(end)), "shard": shard}


def _write(run: FakeRun, dest: Path) -> Written:
    rnd = random.Random(run.seed)
    corpus = _corpus(rnd, 1 << 20)
    n = len(run.hosts)
    shards: list[list[str]] = [[] for _ in run.hosts]
    from payload.records import shard_of

    for k in range(run.samples):
        rid = f"q{k:06d}"
        shards[shard_of(rid, n)].append(rid)
    written = Written(dest, run.job)
    merged = dest / run.job
    merged.mkdir(parents=True, exist_ok=True)
    for name in ("output.jsonl", "output.errors.jsonl"):
        (merged / name).write_bytes(b"")
    for i, (host, ids) in enumerate(zip(run.hosts, shards, strict=True)):
        answers = _answers(run, rnd, corpus, ids)
        folder = dest / host / run.job
        folder.mkdir(parents=True, exist_ok=True)
        out = [(json.dumps(a.record, ensure_ascii=False) + "\n").encode() for a in answers
               if not a.error]
        err = [(json.dumps(a.record, ensure_ascii=False) + "\n").encode() for a in answers if a.error]
        for name, lines in (("output.jsonl", out), ("output.errors.jsonl", err)):
            (folder / name).write_bytes(b"".join(lines))
            with (merged / name).open("ab") as fh:  # the shards in shard order, as merged
                fh.write(b"".join(lines))
        shard = f"{i}/{n}"
        (folder / "status.json").write_text(json.dumps(_status(run, answers, shard), indent=2))
        meta = {"job": run.job, "role": "generator", "shard": shard, "hosts": n,
                "shard_hosts": list(run.hosts), "prompts": run.samples,
                "input": f"~/.handoff/data/{run.job}.jsonl", "input_sha256": "0" * 64,
                "max_cost": run.max_cost, "host_max_cost": run.max_cost / n if run.max_cost else None,
                "sampling": {"model": MODEL, "max_tokens": run.max_tokens, "temperature": 1.0,
                             "top_p": 0.95, "reasoning": {"effort": "high"}},
                "started": START, "host": host}
        (folder / "job.json").write_text(json.dumps(meta) + "\n")
        (folder / "log").write_text(f"generate: {len(ids)} prompts\n")
        if run.metrics:
            metrics = _metrics(run, answers, rnd)
            (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
        written.answers += len(out)
        written.failures += len(err)
        written.hosts[host] = len(answers)
    return written
