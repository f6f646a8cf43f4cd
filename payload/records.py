"""Input records, prompt ids and sharding: the one place both `generate` and `extract` agree on.

An id must be stable across runs and hosts, because resume and sharding are keyed
on it: a record without an `id` gets the sha256 of its canonical prompt JSON, and
ids are compared as `str(id)` so `7` and `"7"` are the same prompt.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from payload.errors import BadRecord

# The fields that make the prompt; every other field of an input record is carried into
# the output record under `meta` (e.g. `source`, `kind`), so a merged dataset can be split.
PROMPT_FIELDS = frozenset({"id", "messages", "conversations", "prompt"})
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool"}


@dataclass(frozen=True)
class Prompt:
    id: Any  # keeps its JSON type for the output record
    key: str  # str(id): what resume and sharding compare
    messages: list[dict[str, Any]]  # the prompt: the conversation less a trailing assistant turn
    line_no: int
    # The whole conversation as given, trailing assistant turn included (`--turns all`
    # regenerates each assistant turn of it); None when it is the prompt itself.
    conversation: list[dict[str, Any]] | None = None
    meta: dict[str, Any] | None = None  # the record's other fields, None when it has none


@dataclass(frozen=True)
class Shard:
    """`--shard I/N`: this process owns the ids whose stable hash is I modulo N (I is 0-based);
    `I,K/N` (a host that took shard K over from another) owns both. `skip`: ids answered
    elsewhere already (`--exclude-ids`, as `shard_hash`es), owned by none here."""

    index: int
    count: int
    also: tuple[int, ...] = ()  # further shards this process owns (taken over)
    skip: Container[int] | None = field(default=None, compare=False, repr=False)

    def owns(self, key: str) -> bool:
        if self.count == 1 and self.skip is None:
            return True
        h = shard_hash(key)
        if self.count > 1 and h % self.count != self.index and h % self.count not in self.also:
            return False
        return self.skip is None or h not in self.skip

    def __str__(self) -> str:
        return f"{','.join(map(str, (self.index, *self.also)))}/{self.count}"


ALL = Shard(0, 1)


def parse_shard(text: str) -> Shard:
    """Parse `I/N` (or `I,K/N`: several shards); a clear error names the valid range (I is
    0-based)."""
    try:
        i_s, n_s = text.split("/")
        indices, count = [int(i) for i in i_s.split(",")], int(n_s)
    except ValueError:
        raise ValueError(f"--shard must look like I/N (e.g. 0/4; 1,3/4 for two), got {text!r}") from None
    if count < 1 or not all(0 <= i < count for i in indices) or len(set(indices)) != len(indices):
        raise ValueError(f"--shard {text}: each I must be in 0..N-1, once, and N >= 1 (I is 0-based)")
    return Shard(indices[0], count, tuple(indices[1:]))


def excluded(lines: Iterator[tuple[int, str]]) -> Iterator[int]:
    """The ids of an `--exclude-ids` file (one JSON string per line: an id as `str(id)`), as
    `shard_hash`es; a line that is not one is a ValueError naming it."""
    for line_no, text in lines:
        if not text.strip():
            continue
        try:
            key = json.loads(text)
        except ValueError:
            key = None
        if not isinstance(key, str):
            raise ValueError(f"line {line_no}: not an id as a JSON string")
        yield shard_hash(key)


def shard_of(key: str, count: int) -> int:
    """Stable across Python versions and hosts (never the salted builtin `hash`)."""
    return shard_hash(key) % count


def shard_hash(key: str) -> int:
    """The id's 64-bit number that `shard_of` takes modulo the shard count (handoff checks
    one id against several layouts with one hash)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def derive_id(messages: list[dict[str, Any]]) -> str:
    return hashlib.sha256(canonical_json(messages).encode("utf-8")).hexdigest()


def to_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's conversation as OpenAI-style messages, trailing assistant turn kept.

    Accepted shapes (docs/records.md): `messages` (OpenAI), `conversations` (ShareGPT), or
    a plain `prompt` string (one user message)."""
    if "messages" in record:
        msgs = record["messages"]
        if not isinstance(msgs, list):
            raise BadRecord("'messages' is not a list")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
                raise BadRecord(f"messages[{i}] needs a string 'role' and a 'content'")
            out.append(m)
        return out
    if "conversations" in record:
        turns = record["conversations"]
        if not isinstance(turns, list):
            raise BadRecord("'conversations' is not a list")
        out = []
        for i, t in enumerate(turns):
            if not isinstance(t, dict) or "value" not in t:
                raise BadRecord(f"conversations[{i}] needs 'from' and 'value'")
            role = SHAREGPT_ROLES.get(str(t.get("from")))
            if role is None:
                raise BadRecord(f"conversations[{i}] has unknown 'from': {t.get('from')!r}")
            out.append({"role": role, "content": t["value"]})
        return out
    if "prompt" in record:
        prompt = record["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise BadRecord("'prompt' must be a non-empty string")
        return [{"role": "user", "content": prompt}]
    keys = ", ".join(repr(k) for k in list(record)[:6]) or "none"
    raise BadRecord(f"no 'messages', 'conversations' or 'prompt' field (keys: {keys})")


def to_prompt_messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The prompt: the conversation less a trailing assistant turn (that turn is regenerated)."""
    return prompt_messages(to_messages(record))


def prompt_messages(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`to_prompt_messages` of a conversation already read."""
    if msgs and msgs[-1].get("role") == "assistant":
        msgs = msgs[:-1]
    if not msgs:
        raise BadRecord("no usable messages (empty, or only an assistant turn)")
    if not any(m.get("role") == "user" for m in msgs):
        raise BadRecord("no user turn to answer")
    return msgs


# What one input record may hold: nesting (a chat record nests 3-4 deep; 64 is absurd
# already, and far below where json's own recursion gives up) and integer digits (an id
# of 100 digits is beyond any real one; Python refuses to read past 4300).
MAX_DEPTH = 64
MAX_INT_DIGITS = 100
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise BadRecord(f"an integer of {len(digits.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def load_object(line: str) -> dict[str, Any]:
    """One JSONL line as a JSON object, or a BadRecord that says what is wrong with it:
    not JSON, not an object, nested deeper than MAX_DEPTH, an integer of more than
    MAX_INT_DIGITS digits, a lone surrogate (`"\\ud800"`: no UTF-8 text can hold it)."""
    try:
        record = json.loads(line, parse_int=_int)
    except json.JSONDecodeError as exc:
        # json's own text may end in "at" ("Unterminated string starting at"): one "at".
        msg = exc.msg[:-3] if exc.msg.endswith(" at") else exc.msg
        raise BadRecord(f"not JSON ({msg} at column {exc.colno})") from None
    except RecursionError:
        raise BadRecord(f"nested deeper than {MAX_DEPTH} levels") from None
    except BadRecord:
        raise
    except ValueError as exc:  # e.g. a number Python will not read
        raise BadRecord(f"not JSON ({str(exc)[:100]})") from None
    if not isinstance(record, dict):
        raise BadRecord("a record must be a JSON object")
    if line.count("[") + line.count("{") > MAX_DEPTH and _depth(record) > MAX_DEPTH:
        raise BadRecord(f"nested deeper than {MAX_DEPTH} levels")
    if _SURROGATE.search(line):
        try:
            canonical_json(record).encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start] if isinstance(exc.object, str) else "?"
            raise BadRecord(f"holds a lone surrogate (\\u{ord(bad):04x}): not valid Unicode "
                            f"text") from None
    return record


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in `value` (without recursion)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:
                stack.extend((inner, depth + 1) for inner in item)
    return deepest


def parse_prompt(line: str, line_no: int) -> Prompt:
    return prompt_of(load_object(line), line_no)


def prompt_of(record: dict[str, Any], line_no: int) -> Prompt:
    """A parsed record as a Prompt (its id checked or derived), or a BadRecord."""
    conversation = to_messages(record)
    messages = prompt_messages(conversation)
    rid = record.get("id")
    if rid is None:
        rid = derive_id(messages)
    elif not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise BadRecord(f"'id' must be a string or an integer, got {type(rid).__name__}")
    meta = {k: v for k, v in record.items() if k not in PROMPT_FIELDS} or None
    return Prompt(id=rid, key=str(rid), messages=messages, line_no=line_no,
                  conversation=conversation if len(conversation) != len(messages) else None,
                  meta=meta)


def iter_input(path: Path) -> Iterator[tuple[int, str | BadRecord]]:
    """Stream (1-based line number, text) without loading the file; blank lines are skipped.
    A line that is not valid UTF-8 comes as a BadRecord instead of its text: decoding it
    with replacement characters would send (and pay for) a prompt nobody wrote."""
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if raw.strip():
                yield line_no, decode_line(raw)


def decode_line(raw: bytes) -> str | BadRecord:
    """One input line's text, or the BadRecord saying where it is not valid UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadRecord(f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at "
                         f"byte {exc.start + 1} of the line)")


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Stream (1-based line number, text) without loading the file; blank lines are skipped."""
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for line_no, line in enumerate(fh, start=1):
            if line.strip():
                yield line_no, line


def sibling_path(output: Path, suffix: str) -> Path:
    """`out.jsonl` → `out<suffix>`: the output's companion files replace its `.jsonl`."""
    name = output.name
    stem = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
    return output.with_name(stem + suffix)


def errors_path(output: Path) -> Path:
    """`out.jsonl` → `out.errors.jsonl` (docs/records.md, "Errors")."""
    return sibling_path(output, ".errors.jsonl")
