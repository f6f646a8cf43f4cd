"""What an attempt leaves behind: its cost, and for a prompt that is done, its record.

The recorder is the only code that writes output and errors records (through the single
`Writer`, synchronously on the event loop, so two records never interleave) and the only
code that moves the counters the status file shows for them (done, failed, cost,
tokens). It also settles each attempt with the budget: what it cost (reported, or priced
from its tokens), and whether a timeout or reset may have been billed unseen.

Permanent failures pass through the systematic-error detector first: held while they all
look alike, written once another answer shows they were per-prompt failures.

A record that cannot be written (a full disk, an I/O error) stops the run at once: the
answers still in flight could not be kept, so waiting for them would only cost money.
"""

from __future__ import annotations

import time
from typing import Any

from payload.generate.budget import Budget, Prices
from payload.generate.client import Kind, Outcome
from payload.generate.journal import WriteFailed, Writer, encode_record
from payload.generate.progress import Counters
from payload.generate.settings import Settings
from payload.generate.stop import Stop
from payload.generate.systematic import Held, SystematicError
from payload.generate.turns import Turn, add_usage
from payload.records import Prompt
from payload.redact import redact
from payload.report import Reporter

# A turn's text stays in the conversation (`messages`, `response`), not in its provenance.
_TEXT = frozenset({"id", "turn", "response", "reasoning", "response_token_ids"})
# Answers we gave up on that may have been billed without our seeing the cost: a timeout, a
# reset, a stream closed or cut mid-answer (a refused connection never was: it says so).
UNSEEN_BILLS = frozenset({"timeout", "connection", "idle_timeout", "first_token_timeout",
                          "stream_cut"})
_IDS = "response_token_ids"  # the sampled token ids, when the server returned them


def answered_at(o: Outcome) -> float:
    """When the answer was complete: now, or the time the attempt was stamped with (a
    batch's end)."""
    return round(o.answered_at if o.answered_at is not None else time.time(), 3)


def _provenance(r: dict[str, Any], o: Outcome, attempts: int) -> dict[str, Any]:
    """The fields after the text: where the answer came from, what it took, and when. The
    latency goes just before `attempts` (the host's latency reader finds it there)."""
    out: dict[str, Any] = {}
    if "native_finish_reason" in r:
        out["native_finish_reason"] = r["native_finish_reason"]
    out["model"] = r["model"]
    if "generation_id" in r:
        out["generation_id"] = r["generation_id"]
    out["latency_s"] = round(o.latency_s, 3)
    out["attempts"] = attempts
    out["answered_at"] = answered_at(o)
    return out


class Recorder:
    def __init__(self, s: Settings, counters: Counters, writer: Writer, budget: Budget,
                 prices: Prices | None, stop: Stop, reporter: Reporter) -> None:
        self.s = s
        self.c = counters
        self.writer = writer
        self.budget = budget
        self.prices = prices
        self.stop = stop
        self.say = reporter
        self.systematic = SystematicError(self.write_held)
        # The stall watch: when the last answer came, and how many errors since.
        self.last_success = time.monotonic()
        self.failures_since_success = 0

    # -- money ---------------------------------------------------------------------------------
    def settle(self, o: Outcome) -> float | None:
        """What this attempt cost (reported, or priced from its tokens) and the budget update."""
        cost = o.cost
        if cost is None and self.prices is not None:
            cost = self.prices.of(o.usage)
        if o.kind is Kind.OK and self.c.budget_enforced is None and self.s.max_cost is not None:
            self._judge_budget(o)
        # A reset or timeout may have been billed unseen; a refused connection never was.
        self.budget.settle(cost, unknown=o.type in UNSEEN_BILLS)
        return cost

    def _judge_budget(self, o: Outcome) -> None:
        """The first answer tells whether --max-cost can be enforced."""
        if o.cost is not None or (self.prices is not None and self.prices.of(o.usage)
                                  is not None):
            self.c.budget_enforced = True
            return
        self.c.budget_enforced = False
        self.say.warn(f"--max-cost ${self.s.max_cost:g} cannot be enforced: the server "
                      "reports no usage.cost and no prices are known. Give --prices "
                      "PROMPT,COMPLETION (USD per million tokens) to price answers from "
                      "their tokens; the run goes on.")

    # -- records ---------------------------------------------------------------------------------
    def success(self, p: Prompt, messages: list[dict[str, Any]], o: Outcome,
                cost: float | None, attempts: int, seq: int,
                turns: list[Turn] | None = None) -> None:
        """The answer that completes a prompt: its record, then the counters (only once it
        is on disk). With --turns all, `turns` are the conversation's earlier turns and
        `messages` its regenerated history (docs/records.md, "--turns all")."""
        r = o.result
        if turns is None:
            record: dict[str, Any] = {"id": p.id, "usage": r["usage"],
                                      "finish_reason": r["finish_reason"],
                                      "provider": r["provider"]}
        else:
            last = self.turn_fields(p, len(turns), len(messages), o, attempts)
            every = [*turns, last]
            usage: dict[str, Any] = {}
            for t in every:
                add_usage(usage, t["usage"])
            record = {"id": p.id, "usage": usage, "finish_reason": r["finish_reason"],
                      "provider": r["provider"],
                      "turns": [{k: v for k, v in t.items() if k not in _TEXT} for t in every]}
        record["response"] = r["response"]
        record["reasoning"] = r["reasoning"]
        record.update(_provenance(r, o, attempts))
        if _IDS in r:  # the final turn's; earlier turns' are in their messages
            record[_IDS] = r[_IDS]
        if turns is not None:
            record["latency_s"] = round(sum(t["latency_s"] for t in (*turns, last)), 3)
            record["attempts"] = sum(t["attempts"] for t in (*turns, last))
            record["answered_at"] = record.pop("answered_at")  # kept after attempts
        if p.meta:
            record["meta"] = p.meta
        record["messages"] = messages
        try:
            self.writer.write_output(encode_record(record))
        except WriteFailed as exc:
            self.write_failed(exc)
            return
        self.answered(o, cost, seq)
        self.c.done += 1
        self.c.done_this_run += 1

    def turn(self, p: Prompt, k: int, where: int, o: Outcome, cost: float | None,
             attempts: int, seq: int) -> Turn | None:
        """A regenerated turn that is not its conversation's last: journaled before the next
        turn is asked (None when it could not be written: the run stops)."""
        t = self.turn_fields(p, k, where, o, attempts)
        try:
            self.writer.write_turn(encode_record(t))
        except WriteFailed as exc:
            self.write_failed(exc)
            return None
        self.answered(o, cost, seq)
        return t

    @staticmethod
    def turn_fields(p: Prompt, k: int, where: int, o: Outcome, attempts: int) -> Turn:
        """One turn as the journal keeps it: `id` first and `usage` second (as records)."""
        r = o.result
        t: Turn = {"id": p.id, "usage": r["usage"], "finish_reason": r["finish_reason"],
                   "provider": r["provider"], "turn": k, "index": where,
                   "response": r["response"], "reasoning": r["reasoning"]}
        t.update(_provenance(r, o, attempts))
        if _IDS in r:
            t[_IDS] = r[_IDS]
        return t

    def answered(self, o: Outcome, cost: float | None, seq: int) -> None:
        """The counters of one answer on disk (a turn, or a prompt's last answer)."""
        self.last_success = time.monotonic()
        self.failures_since_success = 0
        c, r = self.c, o.result
        usage = r["usage"]
        if cost:
            c.cost += cost
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        details = usage.get("completion_tokens_details")
        rt = details.get("reasoning_tokens") if isinstance(details, dict) else None
        c.reasoning_tokens += rt if isinstance(rt, int) and not isinstance(rt, bool) else 0
        c.latencies.add(o.latency_s)
        c.prompt_tokens += pt if isinstance(pt, int) else 0
        c.completion_tokens += ct if isinstance(ct, int) else 0
        c.tokens_this_run += ct if isinstance(ct, int) else 0
        provider, finish = r["provider"], r["finish_reason"]
        c.by_provider[str(provider) if provider is not None else "unknown"] += 1
        c.by_finish_reason[str(finish) if finish is not None else "unknown"] += 1
        c.think_split += o.think_split
        self.systematic.success(seq)

    def error_answer(self, o: Outcome, cost: float | None) -> None:
        """An attempt that did not succeed: counted (its cost too), whatever happens next."""
        c = self.c
        self.failures_since_success += 1
        if cost:
            c.cost += cost
        c.errors_by_kind[o.type] += 1
        c.last_error = f"{o.status or ''} {o.type}: {o.message}".strip()

    def permanent(self, item: Held) -> bool:
        """A permanent failure, held by the systematic-error detector; True when it judges
        the error systematic (the caller stops the run)."""
        return self.systematic.permanent(item)

    def write_held(self, item: Held) -> None:
        self.failure(item.prompt, item.outcome, item.attempts)

    def failure(self, p: Prompt, o: Outcome, attempts: int, *, gave_up: bool = False,
                why: str | None = None) -> None:
        """The errors record of a prompt that failed for good (`why` it was given up)."""
        message = o.message
        if gave_up:
            message = f"gave up after {why or f'{attempts} attempts'}; last: {message}"
        line = encode_record({"id": p.id, "error": {"status": o.status, "type": o.type,
                                                    "message": redact(message)},
                              "attempts": attempts, "answered_at": answered_at(o)})
        try:
            self.writer.write_error(line)
        except WriteFailed as exc:
            self.write_failed(exc)
            return
        self.c.failed += 1

    def write_failed(self, exc: WriteFailed) -> None:
        """A record did not fit (or the disk failed): answers can no longer be kept, so stop
        at once instead of paying for answers that would be lost."""
        if exc.disk_full:
            why = f"no space left on device writing {exc.path}"
            fix = "free space (or move the job), then rerun the same command: it resumes"
            reason = "disk_full"
        else:
            why = f"cannot write {exc.path}: {exc.strerror}"
            fix = "fix the file system, then rerun the same command: it resumes"
            reason = "write_error"
        self.stop.abandon(reason, f"stopping: {why}; {fix}")
