"""Input records → the conversations to supervise: which assistant turns, with what.

A generator output record (`messages` + `response` + `reasoning`, docs/records.md)
supervises its final turn: the one the target generated. Earlier assistant turns of its
prompt came from the input dataset, so they are context, whatever `--turns` says. A
record the generator produced with `--turns all` carries `turns` (its list of per-turn
provenance, each turn's `index` in `messages`; `"turns": "all"` marks the same) and the
whole regenerated conversation in `messages` (each assistant message with its `reasoning`
and, when the server returned them, its `response_token_ids`): with `extract --turns all`
every turn the generator regenerated is supervised, each checked against its own `usage`. A raw
prompt+answer record (`messages`/ShareGPT ending in an assistant turn, no `response`)
supervises its trailing assistant turn, and with `--turns all` every assistant turn.

What the server said about a turn travels with it: `response_token_ids` (the sampled
ids, used as the supervised tokens as they are) and `usage.completion_tokens` (checked
against the re-tokenized count when there are no ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from payload.extract.rendering import REASONING_FIELDS
from payload.records import BadRecord, derive_id, load_object, to_messages

TOKEN_IDS = "response_token_ids"
TURNS_ALL = "all"


@dataclass(frozen=True)
class Turn:
    """An earlier assistant turn that is supervised too (`--turns all`): the message at
    `index` of the prompt, what the server said of it."""

    index: int
    reasoning: str | None
    completion_tokens: int | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Conversation:
    id: Any
    key: str
    prompt: list[dict[str, Any]]
    response: str
    reasoning: str | None
    line_no: int
    cut: bool = False  # finish_reason "length": the target never ended this answer
    completion_tokens: int | None = None  # the server's count for the final turn
    token_ids: tuple[int, ...] | None = None  # the final turn's sampled ids, if stored
    earlier: tuple[Turn, ...] = ()  # earlier assistant turns supervised too (--turns all)

    @property
    def has_reasoning(self) -> bool:
        return bool(self.reasoning) or any(t.reasoning for t in self.earlier)


def reasoning_of(message: dict[str, Any]) -> str | None:
    found = next((message[f] for f in REASONING_FIELDS if message.get(f)), None)
    if found is None:
        return None
    if not isinstance(found, str):
        raise BadRecord(f"'reasoning' must be a string, got {type(found).__name__}")
    return found


def _ids(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise BadRecord(f"{where} must be a list of token ids (non-negative integers)")
    return tuple(value)


def _count(usage: Any) -> int | None:
    if not isinstance(usage, dict):
        return None
    n = usage.get("completion_tokens")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _listed_turns(value: Any) -> list[dict[str, Any]] | None:
    """The generator's `turns` provenance list (each with an integer `index`), else None."""
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(t, dict) and isinstance(t.get("index"), int)
               and not isinstance(t.get("index"), bool) for t in value):
        raise BadRecord("'turns' must be the generator's list of turn objects, each with an "
                        "integer 'index'")
    return value


def parse_record(line: str, line_no: int, turns: str = "last") -> Conversation:
    """One input line as the conversation to supervise (see the module docstring).

    The id is the record's, else the sha256 of the prompt (as the generator derives it).
    """
    record = load_object(line)
    msgs = to_messages(record)
    # `generate --turns all` writes `turns` as its per-turn provenance (one object per
    # regenerated turn, `index` its place in `messages`); `"turns": "all"` marks the same
    listed = _listed_turns(record.get("turns"))
    regenerated = record.get("turns") == TURNS_ALL or listed is not None
    final: dict[str, Any]
    if regenerated and msgs and msgs[-1].get("role") == "assistant":
        prompt, final = msgs[:-1], msgs[-1]
        response, reasoning = final.get("content"), reasoning_of(final)
    elif "response" in record:
        prompt, final = msgs, record
        response = record["response"]
        reasoning = record.get("reasoning")
    else:
        if not msgs or msgs[-1].get("role") != "assistant":
            raise BadRecord("no 'response' and no trailing assistant turn to supervise")
        prompt, final = msgs[:-1], msgs[-1]
        response, reasoning = final.get("content"), reasoning_of(final)
    if response is None:
        response = ""
    if not isinstance(response, str):
        raise BadRecord(f"the response must be a string, got {type(response).__name__}")
    if reasoning is not None and not isinstance(reasoning, str):
        raise BadRecord(f"'reasoning' must be a string, got {type(reasoning).__name__}")
    if not prompt or not any(m.get("role") == "user" for m in prompt):
        raise BadRecord("no user turn before the supervised answer")
    rid = record.get("id")
    if rid is None:
        rid = derive_id(prompt)
    elif not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise BadRecord(f"'id' must be a string or an integer, got {type(rid).__name__}")
    # every assistant turn the target wrote: all of a regenerated or raw record's
    earlier_idx = ([i for i, m in enumerate(prompt) if m.get("role") == "assistant"]
                   if turns == TURNS_ALL and (regenerated or "response" not in record) else [])
    if listed is not None and turns == TURNS_ALL and final is record:
        # exactly the turns the target wrote (an assistant greeting before any user turn
        # was kept as given, not regenerated)
        earlier_idx = [t["index"] for t in listed[:-1]]
        if any(not 0 <= i < len(prompt) or prompt[i].get("role") != "assistant"
               for i in earlier_idx):
            raise BadRecord("'turns' names an index that is not an assistant turn of 'messages'")
    per_turn = record.get(TOKEN_IDS)
    final_ids: tuple[int, ...] | None
    earlier_ids: list[tuple[int, ...] | None] = [None] * len(earlier_idx)
    if regenerated and isinstance(per_turn, list) and per_turn and isinstance(per_turn[0], list):
        n_asst = sum(1 for m in prompt if m.get("role") == "assistant") + 1
        if len(per_turn) != n_asst:
            raise BadRecord(f"'{TOKEN_IDS}' holds {len(per_turn)} turns, the conversation "
                            f"{n_asst} assistant turns")
        lists = [_ids(x, f"'{TOKEN_IDS}'[{i}]") for i, x in enumerate(per_turn)]
        final_ids = lists[-1]
        earlier_ids = lists[-1 - len(earlier_idx):-1] if earlier_idx else []
    else:
        final_ids = _ids(final.get(TOKEN_IDS) if final is not record else per_turn,
                         f"'{TOKEN_IDS}'")
    # a turns=all record's own usage sums its turns: only the messages' own counts apply
    count = _count(final.get("usage")) if final is not record or not regenerated else None
    own = {t["index"]: _count(t.get("usage")) for t in listed} if listed is not None else {}
    if listed is not None and final is record:
        count = own.get(len(prompt))
    earlier = tuple(
        Turn(i, reasoning_of(prompt[i]),
             _count(prompt[i].get("usage")) if "usage" in prompt[i] else own.get(i),
             ids if ids is not None else _ids(prompt[i].get(TOKEN_IDS), f"messages[{i}]"))
        for i, ids in zip(earlier_idx, earlier_ids, strict=True))
    cut = (final.get("finish_reason") or record.get("finish_reason")) == "length"
    return Conversation(rid, str(rid), prompt, response, reasoning or None, line_no, cut,
                        count, final_ids, earlier)
