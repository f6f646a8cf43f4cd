"""Records → token ids and the loss mask, from token boundaries (never from regexes).

The supervised span is found by rendering twice with the model's own chat template:
the prompt with `add_generation_prompt=True`, then prompt + assistant turn. The prompt
tokens must be an exact prefix of the full tokens; when a tokenizer merges across the
boundary (or a template rewrites earlier turns) that prefix breaks, and the sample
fails loudly instead of getting a mask shifted by a token or two, the classic silent
bug. Only the final assistant turn is supervised: earlier assistant turns in a
multi-turn prompt were not written by the target, so they are context (mask 0).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from payload.errors import PayloadError
from payload.records import BadRecord, derive_id, load_object, to_messages

# Fields chat templates read a thinking trace from (Qwen3/DeepSeek/Kimi: reasoning_content).
REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
# Used only when the template has no thinking field: the DeepSeek-R1/Qwen3 inline form.
INLINE_THINK = "<think>\n{reasoning}\n</think>\n\n{response}"
_PROBE = "zq7probe9reasoning"


class BoundaryError(PayloadError):
    """The full render does not start with the prompt's tokens: the mask would be wrong.

    A per-sample failure: the pipeline records it (errors.<tag>.jsonl) and goes on; the
    run then exits 1 (its exit code), the others written."""


@dataclass(frozen=True)
class Conversation:
    id: Any
    key: str
    prompt: list[dict[str, Any]]
    response: str
    reasoning: str | None
    line_no: int
    cut: bool = False  # finish_reason "length": the target never ended this answer


@dataclass
class Sample:
    """One tokenized conversation; the mask is the span [prompt_len, sup_end)."""

    id: Any
    key: str
    input_ids: array  # array("i"): 4 bytes a token, a million samples stay small
    prompt_len: int
    sup_end: int
    truncated: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_supervised(self) -> int:
        return max(0, min(self.sup_end, len(self.input_ids)) - self.prompt_len)


def parse_record(line: str, line_no: int) -> Conversation:
    """A generator output record, or a raw prompt+answer record (messages/ShareGPT).

    With a `response` field the conversation is `messages` + assistant(response); without
    one, the trailing assistant turn of messages/conversations is the supervised one.
    The id is the record's, else the sha256 of the prompt (as the generator derives it).
    """
    record = load_object(line)
    msgs = to_messages(record)
    if "response" in record:
        prompt = msgs
        response = record["response"]
        reasoning = record.get("reasoning")
    else:
        if not msgs or msgs[-1].get("role") != "assistant":
            raise BadRecord("no 'response' and no trailing assistant turn to supervise")
        prompt = msgs[:-1]
        last = msgs[-1]
        response = last.get("content")
        reasoning = next((last[f] for f in REASONING_FIELDS if last.get(f)), None)
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
    cut = record.get("finish_reason") == "length"
    return Conversation(rid, str(rid), prompt, response, reasoning or None, line_no, cut)


class Renderer:
    """Applies one tokenizer's chat template the same way for every sample."""

    def __init__(self, tokenizer: Any, reasoning: str, eos_ids: Iterable[int]) -> None:
        self.tok = tokenizer
        self.reasoning = reasoning
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template; features need the exact "
                             "format the target saw (add one to tokenizer_config.json)")
        self.reasoning_field = self._probe_reasoning_field() if reasoning == "include" else None

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        text = self.tok.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=generation_prompt)
        return str(text)

    def _probe_reasoning_field(self) -> str | None:
        """Which message field the template renders a thinking trace from, if any."""
        for field in REASONING_FIELDS:
            msgs = [{"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a", field: _PROBE}]
            try:
                if _PROBE in self._render(msgs, False):
                    return field
            except Exception:  # a template may raise on unknown shapes; try the next field
                continue
        return None

    @property
    def reasoning_mode(self) -> str:
        if self.reasoning == "drop":
            return "drop"
        return f"template field {self.reasoning_field!r}" if self.reasoning_field else "inline"

    def assistant_turn(self, conv: Conversation) -> dict[str, Any]:
        if self.reasoning == "include" and conv.reasoning:
            if self.reasoning_field:
                return {"role": "assistant", "content": conv.response,
                        self.reasoning_field: conv.reasoning}
            return {"role": "assistant",
                    "content": INLINE_THINK.format(reasoning=conv.reasoning,
                                                   response=conv.response)}
        return {"role": "assistant", "content": conv.response}

    def encode_many(self, convs: list[Conversation]) -> list[Sample | BoundaryError]:
        """Render and tokenize a chunk at once (the fast tokenizer batches in Rust)."""
        prompts = [self._render(c.prompt, True) for c in convs]
        fulls = [self._render([*c.prompt, self.assistant_turn(c)], False) for c in convs]
        enc_p = self.tok(prompts, add_special_tokens=False)["input_ids"]
        enc_f = self.tok(fulls, add_special_tokens=False)["input_ids"]
        return [self._sample(c, p, f) for c, p, f in zip(convs, enc_p, enc_f, strict=True)]

    def _sample(self, conv: Conversation, p: list[int], f: list[int]) -> Sample | BoundaryError:
        n = len(p)
        if f[:n] != p:
            at = next((i for i, (a, b) in enumerate(zip(p, f, strict=False)) if a != b), min(n, len(f)))
            lo = max(0, at - 3)
            return BoundaryError(
                f"id {conv.key} (line {conv.line_no}): the prompt's {n} tokens are not a "
                f"prefix of the full conversation's {len(f)} tokens; first difference at "
                f"token {at}: prompt {self.tok.convert_ids_to_tokens(p[lo:at + 3])} vs full "
                f"{self.tok.convert_ids_to_tokens(f[lo:at + 3])} (the tokenizer merges across "
                "the generation prompt, or the template rewrites earlier turns)")
        # Supervise through the last end-of-turn token the template emits; anything after
        # it (a trailing newline) is never generated by the target, so it stays mask 0.
        # An answer cut at max_tokens never ended: the end-of-turn the template closes it
        # with was not generated by the target, so it is context there (mask 0).
        end = len(f)
        for i in range(len(f) - 1, n - 1, -1):
            if f[i] in self.eos_ids:
                end = i if conv.cut else i + 1
                break
        return Sample(conv.id, conv.key, array("i", f), n, end)


def truncate(sample: Sample, max_length: int) -> Sample:
    """Keep the first max_length tokens: causal attention leaves their features unchanged."""
    if len(sample.input_ids) <= max_length:
        return sample
    return Sample(sample.id, sample.key, sample.input_ids[:max_length], sample.prompt_len,
                  min(sample.sup_end, max_length), truncated=True)


def loss_mask(sample: Sample) -> list[int]:
    t = len(sample.input_ids)
    lo, hi = min(sample.prompt_len, t), min(sample.sup_end, t)
    return [0] * lo + [1] * (hi - lo) + [0] * (t - hi)
