"""Conversations → token ids and the loss mask: the tokens the target emitted, supervised.

The prompt is rendered with the model's chat template and `add_generation_prompt=True`:
the text the server tokenized. After it comes what the target generated:

- the sampled ids themselves when the record stores them (`response_token_ids`): the
  supervised tokens are exactly those;
- else the completion form (rendering.py) with the record's reasoning and answer, e.g.
  Kimi's `<think>{reasoning}</think>{content}<|im_end|>`; an answer without reasoning is
  rendered as the template renders an assistant turn (Kimi: `<think></think>` + answer).

The text is tokenized whole; the prompt's tokens must be an exact prefix of it, otherwise
the sample fails loudly (a tokenizer that merges across the boundary) instead of getting
a mask shifted by a token or two. The mask is 1 from the end of the prompt through the
end-of-turn token; anything the template adds after it stays 0. Without ids, the
supervised count is compared with the server's `usage.completion_tokens`: a difference
is a re-tokenization the target did not sample (counted and listed by the pipeline).

`--turns all`: every supervised assistant turn gets its own span, each what the target
emitted; between two of them comes the template's own rendering of what follows a turn
(user turns, tool results, the next generation prompt). An earlier turn thus appears as
emitted, with its reasoning, where a blanking template (Kimi) showed the target that turn
blanked: one sequence cannot be both (docs/extractor.md says so).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from payload.errors import PayloadError
from payload.extract import rendering
from payload.extract.conversations import Conversation, Turn, parse_record
from payload.extract.rendering import CompletionForm

__all__ = ["BoundaryError", "Conversation", "Renderer", "Sample", "Turn", "loss_mask",
           "parse_record", "truncate"]
_MARK = "zq7turn9end"


class BoundaryError(PayloadError):
    """The full render does not start with the prompt's tokens: the mask would be wrong.

    A per-sample failure: the pipeline records it (errors.<tag>.jsonl) and goes on; the
    run then exits 1 (its exit code), the others written."""


@dataclass
class Sample:
    """One tokenized conversation; the mask is 1 on each span [lo, hi) of `spans`
    (one span, [prompt_len, sup_end), unless several turns are supervised)."""

    id: Any
    key: str
    input_ids: array  # array("i"): 4 bytes a token, a million samples stay small
    prompt_len: int
    sup_end: int
    truncated: bool = False
    spans: tuple[tuple[int, int], ...] = ()
    # per supervised turn with a server count: (turn, supervised tokens, completion_tokens)
    counts: tuple[tuple[int, int, int], ...] = field(default=(), compare=False)
    from_ids: bool = False  # the supervised tokens are the record's sampled ids

    def __post_init__(self) -> None:
        if not self.spans:
            self.spans = ((self.prompt_len, self.sup_end),)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_supervised(self) -> int:
        t = len(self.input_ids)
        return sum(max(0, min(hi, t) - lo) for lo, hi in self.spans)

    @property
    def mismatches(self) -> list[tuple[int, int, int]]:
        return [c for c in self.counts if c[1] != c[2]]


class Renderer:
    """Applies one tokenizer's chat template the same way for every sample."""

    def __init__(self, tokenizer: Any, reasoning: str, eos_ids: Iterable[int],
                 completion_format: str | None = None) -> None:
        self.tok = tokenizer
        self.reasoning = reasoning
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template; features need the exact "
                             "format the target saw (add one to tokenizer_config.json)")
        source = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
        self.detection = rendering.Detection(None)
        self.form: CompletionForm | None = None
        if reasoning == "include":
            if completion_format is not None:
                self.form = rendering.from_flag(completion_format)
            else:
                self.detection = rendering.detect(self._render, source)
                self.form = self.detection.form

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        text = self.tok.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=generation_prompt)
        return str(text)

    @property
    def reasoning_field(self) -> str | None:
        return self.form.field if self.form else None

    @property
    def reasoning_mode(self) -> str:
        if self.reasoning == "drop":
            return "drop"
        if self.form is None:
            return "undetermined"
        if self.form.guess:
            return "inline"
        return self.form.source

    @property
    def undetermined(self) -> str | None:
        """The refusal message when a record's reasoning cannot be rendered as emitted."""
        if self.reasoning != "include" or (self.form is not None and not self.form.guess):
            return None
        if self.form is not None:  # the inline guess
            det = rendering.Detection(None, "the template has no think marker and renders "
                                            "no reasoning field")
            return rendering.refusal(det)
        return rendering.refusal(self.detection)

    def describe(self) -> dict[str, Any]:
        """The rendering used, for meta.json and stats (`rendering`)."""
        if self.reasoning == "drop":
            return {"completion_format": None, "source": "template (reasoning dropped)",
                    "reasoning_field": None, "guess": False}
        if self.form is None:
            return {"completion_format": None, "source": "undetermined",
                    "reasoning_field": None, "guess": False}
        return self.form.describe()

    # -- encoding ----------------------------------------------------------------------
    def encode_many(self, convs: list[Conversation]) -> list[Sample | BoundaryError]:
        """Render and tokenize a chunk at once (the fast tokenizer batches in Rust)."""
        plans = [self._plan(c) for c in convs]
        texts = [t for p in plans if not isinstance(p, BoundaryError) for t in p.texts]
        enc = self.tok(texts, add_special_tokens=False)["input_ids"] if texts else []
        out: list[Sample | BoundaryError] = []
        at = 0
        for conv, plan in zip(convs, plans, strict=True):
            if isinstance(plan, BoundaryError):
                out.append(plan)
                continue
            n = len(plan.texts)
            out.append(plan.build(self, conv, enc[at:at + n]))
            at += n
        return out

    def _emitted(self, reasoning: str | None, content: str) -> tuple[str, int] | None:
        """(the text the target emitted for one turn, where a cut answer ended in it);
        None: render the turn as the template renders an assistant turn."""
        if self.reasoning != "include" or not reasoning or self.form is None or self.form.guess:
            return None
        return self.form.text(reasoning, content), self.form.cut_at(reasoning, content)

    def _plan(self, conv: Conversation) -> _Plan | BoundaryError:
        try:
            if conv.earlier:
                return self._plan_turns(conv)
            prompt = self._render(conv.prompt, True)
            if conv.token_ids is not None:
                return _Plan([prompt], ids=[None, conv.token_ids])
            emitted = self._emitted(conv.reasoning, conv.response)
            if emitted is None:
                full = self._render([*conv.prompt, self._assistant(conv.reasoning,
                                                                   conv.response)], False)
                if full.startswith(prompt) or not self._has_form:
                    return _Plan([prompt, full], cut_text=None)
                emitted = self._empty_reasoning(conv.response)  # R1: the template's turn
                # does not follow its own generation prompt; the form, with no reasoning
            text, cut = emitted
            if conv.cut:  # the text ends with the template's end-of-turn, as context
                return _Plan([prompt, prompt + text[:cut], prompt + text], cut_text=1,
                             bounds=[(0, 2)])
            return _Plan([prompt, prompt + text])
        except PayloadError as exc:
            return BoundaryError(f"id {conv.key} (line {conv.line_no}): {exc}")

    @property
    def _has_form(self) -> bool:
        return self.reasoning == "include" and self.form is not None and not self.form.guess

    def _empty_reasoning(self, content: str) -> tuple[str, int]:
        assert self.form is not None
        return self.form.text("", content), self.form.cut_at("", content)

    def _assistant(self, reasoning: str | None, content: str) -> dict[str, Any]:
        if self.reasoning == "include" and reasoning and self.form is not None and self.form.guess:
            inline = self.form.text(reasoning, content)  # the guess: inside the content
            return {"role": "assistant", "content": inline}
        return {"role": "assistant", "content": content}

    def _turn_text(self, reasoning: str | None, content: str,
                   before: list[dict[str, Any]]) -> tuple[str, str]:
        """(one turn as emitted after the generation prompt, the part of it after the
        content); a turn without reasoning: as the template renders it after that prompt."""
        emitted = self._emitted(reasoning, content)
        if emitted is not None:
            assert self.form is not None
            return emitted[0], self.form.parts()[2]
        prompt = self._render(before, True)
        texts = [self._render([*before, self._assistant(reasoning, c)], False)
                 for c in (content, _MARK)]
        if self._has_form and not texts[0].startswith(prompt):
            assert self.form is not None
            return self._empty_reasoning(content)[0], self.form.parts()[2]
        if not all(t.startswith(prompt) for t in texts) or texts[1].count(_MARK) != 1:
            raise PayloadError("the template renders an assistant turn that does not "
                               "start with its own generation prompt (pass "
                               "--completion-format)")
        marked = texts[1]
        return texts[0][len(prompt):], marked[marked.index(_MARK) + len(_MARK):]

    def _plan_turns(self, conv: Conversation) -> _Plan:
        """--turns all: prompt, turn, (what follows it, next prompt), turn, ..., final."""
        msgs = [*conv.prompt, {"role": "assistant", "content": conv.response}]
        turns = [*conv.earlier, Turn(len(conv.prompt), conv.reasoning,
                                     conv.completion_tokens, conv.token_ids)]
        use_ids = all(t.token_ids is not None for t in turns)
        text = self._render(msgs[:turns[0].index], True)
        pieces: list[str | tuple[int, ...]] = [text]
        for k, turn in enumerate(turns):
            content = str(msgs[turn.index].get("content") or "")
            emitted, tail = self._turn_text(turn.reasoning, content, msgs[:turn.index])
            pieces.append(turn.token_ids if use_ids and turn.token_ids is not None else emitted)
            if k + 1 < len(turns):
                pieces.append(self._between(msgs, turn.index, turns[k + 1].index, tail,
                                            use_ids))
        return _Plan.from_pieces(pieces, cut=conv.cut and not use_ids, conv=conv, form=self.form)

    def _between(self, msgs: list[dict[str, Any]], done: int, nxt: int, tail: str,
                 use_ids: bool) -> str:
        """The template's text from the end of turn `done` to the generation prompt of
        turn `nxt`: rendered with a marker as that turn's content, taken after the marker
        and the part of the turn's emitted text that follows its content (`tail`)."""
        marked = [*msgs[:done], {"role": "assistant", "content": _MARK}, *msgs[done + 1:nxt]]
        text = self._render(marked, True)
        if text.count(_MARK) != 1:
            raise PayloadError(f"--turns all: the template does not render assistant turn "
                               f"{done} as given")
        after = text[text.index(_MARK) + len(_MARK):]
        if use_ids:  # the ids end at the end-of-turn token: text after it is context
            tail = self._end_of(tail)
        if not after.startswith(tail):
            raise PayloadError(f"--turns all: after assistant turn {done} the template "
                               f"renders {after[:32]!r}, the target emitted {tail!r}")
        return after[len(tail):]

    def _end_of(self, text: str) -> str:
        """`text` up to and including its last end-of-turn token ('' when it has none)."""
        names = [str(t) for t in self.tok.convert_ids_to_tokens(sorted(self.eos_ids))]
        at = max((text.rfind(n) + len(n) for n in names if n and n in text), default=-1)
        return text[:at] if at >= 0 else ""

    def end_index(self, ids: Sequence[int], lo: int, hi: int, cut: bool) -> int:
        """Supervise through the last end-of-turn token in [lo, hi); anything after it (a
        trailing newline) is never generated, so it stays 0. A cut answer never ended:
        its end-of-turn is context too."""
        for i in range(hi - 1, lo - 1, -1):
            if ids[i] in self.eos_ids:
                return i if cut else i + 1
        return hi

    def boundary_error(self, conv: Conversation, p: Sequence[int], f: Sequence[int],
                       ) -> BoundaryError:
        n = len(p)
        at = next((i for i, (a, b) in enumerate(zip(p, f, strict=False)) if a != b), min(n, len(f)))
        lo = max(0, at - 3)
        return BoundaryError(
            f"id {conv.key} (line {conv.line_no}): the prompt's {n} tokens are not a "
            f"prefix of the full conversation's {len(f)} tokens; first difference at "
            f"token {at}: prompt {self.tok.convert_ids_to_tokens(list(p[lo:at + 3]))} vs "
            f"full {self.tok.convert_ids_to_tokens(list(f[lo:at + 3]))} (the tokenizer "
            "merges across the generation prompt, or the template rewrites earlier turns)")


@dataclass
class _Plan:
    """What to tokenize for one conversation, and how its spans come from the tokens.

    texts[0] is the prompt; the last text is the whole sequence (text path); with ids,
    `ids` lists, per piece, None (tokenize that text) or the sampled ids (use as is).
    `bounds` (--turns all) holds, per turn, the indices of the texts ending at its start
    and at its end; `cut_text` is the index of the text ending where a cut answer did."""

    texts: list[str]
    cut_text: int | None = None
    ids: list[tuple[int, ...] | None] | None = None
    bounds: list[tuple[int, int]] = field(default_factory=list)
    counts: list[int | None] = field(default_factory=list)

    @classmethod
    def from_pieces(cls, pieces: list[str | tuple[int, ...]], *, cut: bool,
                    conv: Conversation, form: CompletionForm | None) -> _Plan:
        turns = [*conv.earlier, Turn(len(conv.prompt), conv.reasoning,
                                     conv.completion_tokens, conv.token_ids)]
        counts = [t.completion_tokens for t in turns]
        if any(isinstance(p, tuple) for p in pieces):  # every turn has its sampled ids
            texts = [p for p in pieces if isinstance(p, str)]
            ids: list[tuple[int, ...] | None] = [p if isinstance(p, tuple) else None
                                                 for p in pieces]
            return cls(texts, ids=ids, counts=counts)
        texts, bounds, acc = [], [], ""
        for i, piece in enumerate(pieces):
            assert isinstance(piece, str)
            if i % 2 == 1:  # a turn: the texts that end at its start and at its end
                texts.append(acc)
                bounds.append((len(texts) - 1, len(texts)))
            acc += piece
            if i % 2 == 1:
                texts.append(acc)
        cut_text = None
        if cut and form is not None and conv.reasoning:
            final_start = texts[bounds[-1][0]]
            texts.append(final_start + form.text(conv.reasoning, conv.response)[
                :form.cut_at(conv.reasoning, conv.response)])
            cut_text = len(texts) - 1
        texts.append(acc)
        return cls(texts, cut_text=cut_text, bounds=bounds, counts=counts)

    def build(self, r: Renderer, conv: Conversation, enc: list[list[int]],
              ) -> Sample | BoundaryError:
        if self.ids is not None:
            return self._build_ids(conv, enc)
        full = enc[-1]
        bounds = self.bounds or [(0, len(self.texts) - 1)]
        spans: list[tuple[int, int]] = []
        for k, (start, end) in enumerate(bounds):
            lo_ids, hi_ids = enc[start], enc[end]
            for part in (lo_ids, hi_ids):
                if full[:len(part)] != part:
                    return r.boundary_error(conv, part, full)
            last = k == len(bounds) - 1
            if last and self.cut_text is not None:
                cut_ids = enc[self.cut_text]
                hi = next((i for i, (a, b) in enumerate(zip(cut_ids, full, strict=False))
                           if a != b), min(len(cut_ids), len(full)))
            else:
                hi = r.end_index(full, len(lo_ids), len(hi_ids), conv.cut and last)
            spans.append((len(lo_ids), max(hi, len(lo_ids))))
        counts = tuple((k, hi - lo, n) for k, ((lo, hi), n)
                       in enumerate(zip(spans, self.counts or [conv.completion_tokens],
                                        strict=False)) if n is not None)
        return Sample(conv.id, conv.key, array("i", full), spans[0][0], spans[-1][1],
                      spans=tuple(spans), counts=counts)

    def _build_ids(self, conv: Conversation, enc: list[list[int]]) -> Sample:
        assert self.ids is not None
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        texts = iter(enc)
        for piece in self.ids:
            if piece is None:
                ids += next(texts)
            else:
                spans.append((len(ids), len(ids) + len(piece)))
                ids += piece
        return Sample(conv.id, conv.key, array("i", ids), spans[0][0], spans[-1][1],
                      spans=tuple(spans), from_ids=True)


def truncate(sample: Sample, max_length: int) -> Sample:
    """Keep the first max_length tokens: causal attention leaves their features unchanged."""
    if len(sample.input_ids) <= max_length:
        return sample
    spans = tuple((lo, min(hi, max_length)) for lo, hi in sample.spans if lo < max_length)
    return Sample(sample.id, sample.key, sample.input_ids[:max_length], sample.prompt_len,
                  min(sample.sup_end, max_length), truncated=True,
                  spans=spans or ((sample.prompt_len, sample.prompt_len),),
                  counts=sample.counts, from_ids=sample.from_ids)


def loss_mask(sample: Sample) -> list[int]:
    t = len(sample.input_ids)
    mask = [0] * t
    for lo, hi in sample.spans:
        for i in range(min(lo, t), min(hi, t)):
            mask[i] = 1
    return mask
