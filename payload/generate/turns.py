"""`--turns last|all`: which assistant turns of a conversation are regenerated, on which
history, and the turn journal that keeps each one exactly once across kill -9 and resume.

`last` (the default) regenerates the final assistant turn: the prompt is the conversation
less a trailing assistant turn, one request. `all` regenerates every assistant turn in
order, each on the regenerated history before it (one request per turn, sequential
within a conversation; conversations run in parallel), so a draft model learns the
target's own words on every turn, not another model's. A turn's request carries the
earlier regenerated turns as `{"role": "assistant", "content": …}` (their reasoning is
kept in the record, not sent back: chat templates of thinking models blank history
reasoning). An assistant turn before any user turn (a greeting) has nothing to answer:
it stays as given, as context.

The journal (`OUT.turns.jsonl`) gets one line per regenerated turn that is not the last
of its conversation, written before the next turn's request is sent; the last turn goes
into the output record with the whole conversation. On resume the journal gives back the
turns of every conversation not yet recorded, so no (id, turn) is asked twice (unless a
kill -9 fell between an answer and its line: then that one turn is asked again, as a
single-turn prompt is). Their cost counts in the resumed status and budget.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from payload.generate.journal import Index, id_hash, iter_raw_lines, leading_id, truncate_torn_tail
from payload.records import Prompt, sibling_path
from payload.report import Reporter

TURN_MODES = ("last", "all")

Turn = dict[str, Any]  # one regenerated turn, as journaled: see `turn_line` in the recorder


def turns_path(output: Path) -> Path:
    """`out.jsonl` → `out.turns.jsonl`."""
    return sibling_path(output, ".turns.jsonl")


def positions(p: Prompt, mode: str) -> list[int]:
    """Where in the conversation each regenerated turn goes, in order; the length of the
    conversation stands for the answer to a trailing user turn."""
    if mode == "last":
        return [len(p.messages)]
    conv = p.conversation or p.messages
    out: list[int] = []
    seen_user = False
    for i, m in enumerate(conv):
        role = m.get("role")
        if role == "user":
            seen_user = True
        elif role == "assistant" and seen_user:
            out.append(i)
    if not conv or conv[-1].get("role") != "assistant":
        out.append(len(conv))
    return out


def history(p: Prompt, where: list[int], done: list[Turn], k: int, *,
            with_reasoning: bool = False) -> list[dict[str, Any]]:
    """The messages before turn k, the turns before it replaced by their regenerated text
    (with `reasoning` and `response_token_ids` too for the record, never in a request)."""
    conv = p.conversation or p.messages
    out = list(conv[:where[k]])
    for j in range(k):
        t = done[j]
        msg: dict[str, Any] = {"role": "assistant", "content": t["response"]}
        if with_reasoning and t.get("reasoning"):
            msg["reasoning"] = t["reasoning"]
        if with_reasoning and isinstance(t.get("response_token_ids"), list):
            msg["response_token_ids"] = t["response_token_ids"]  # what the extractor supervises
        out[where[j]] = msg
    return out


def load_turns(path: Path, index: Index, reporter: Reporter | None = None
               ) -> dict[int, list[Turn]]:
    """The journaled turns of the conversations not yet recorded (by id hash, in turn
    order), their cost, tokens and answers added to `index`. A torn last line is cut."""
    index.truncated_bytes += truncate_torn_tail(path)
    found: dict[int, list[Turn]] = {}
    if not path.exists():
        return found
    for line in iter_raw_lines(path):
        if not line.strip():
            continue
        key = leading_id(line[:512])
        h = id_hash(key) if key is not None else None
        if h is not None and (h in index.done or h in index.failed):
            continue  # recorded whole in the output (or failed): nothing to resume
        try:
            turn = json.loads(line)
            h = id_hash(str(turn["id"]))
            k = int(turn["turn"])
        except (ValueError, KeyError, TypeError):
            index.skipped_lines += 1
            if reporter is not None:
                reporter.warn(f"{path}: unreadable turn record skipped")
            continue
        if h in index.done or h in index.failed:
            continue
        have = found.setdefault(h, [])
        if k != len(have):  # a turn out of order (a hand-edited file): keep what precedes it
            continue
        have.append(turn)
        usage = turn.get("usage") if isinstance(turn.get("usage"), dict) else {}
        cost, pt, ct = usage.get("cost"), usage.get("prompt_tokens"), usage.get("completion_tokens")
        index.cost += cost if isinstance(cost, (int, float)) else 0.0
        index.prompt_tokens += pt if isinstance(pt, int) else 0
        index.completion_tokens += ct if isinstance(ct, int) else 0
        index.count_answer(turn.get("provider"), turn.get("finish_reason"))
    return found


def add_usage(total: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """Sum the numbers of `usage` into `total` (nested objects too, e.g.
    `completion_tokens_details`); other values are left out."""
    for k, v in usage.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            total[k] = total.get(k, 0) + v
        elif isinstance(v, dict):
            add_usage(total.setdefault(k, {}), v)
    return total
