"""What the target emits after its generation prompt: the completion form, and how it is found.

A draft must learn the tokens the target generates at inference. After the chat
template's generation prompt a thinking model emits, for one answer: the opening
think marker (unless the generation prompt already holds it), the reasoning, the
closing marker, the answer, the end-of-turn token. That string, with `{reasoning}` and
`{content}` where the two go, is the *completion form*, e.g. Kimi K2-Thinking's
`<think>{reasoning}</think>{content}<|im_end|>`.

Templates rarely render it for a past turn, which is all a probe can ask them for:
Kimi K2-Thinking/K2.5 render every assistant turn up to the last one without tool calls
with an EMPTY `<think></think>`; Qwen3 and GLM-4.5 strip history reasoning but render it
on a final turn after the last user query; DeepSeek-R1 strips it always and opens
`<think>\\n` in its generation prompt. `detect` asks the template, in this order:

1. **field**: [user, assistant{field: R, content: C}] renders R and C right after the
   generation prompt (Qwen3, GLM-4.5, and the K2.5/Qwen3-2507 variants whose generation
   prompt holds the opening marker): the form is that suffix, R and C as placeholders.
2. **empty block**: the template renders the assistant turn with an empty think block
   (Kimi): the reasoning goes between its markers, the rest is as rendered. When the
   generation prompt holds the opening marker, the form starts after it.
3. otherwise the form cannot be determined: `undetermined` says why and proposes the
   `--completion-format` to pass (R1: the template never renders the closing marker
   and what follows it). A template with no think marker at all gets the old inline
   guess (`<think>\\n{reasoning}\\n</think>\\n\\n`), marked as a guess: the pipeline
   refuses it (exit 2) as soon as a record carries reasoning.

`--completion-format` overrides detection. Nothing here imports torch or transformers:
`render` is the tokenizer's `apply_chat_template` (text, no tokenizing).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from payload.errors import UsageError

REASONING, CONTENT = "{reasoning}", "{content}"
# Fields chat templates read a thinking trace from (Qwen3/DeepSeek/Kimi/GLM: reasoning_content).
REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
# Think markers of the families handoff knows; a pair is used when the template names it.
MARKERS = (("<think>", "</think>"), ("◁think▷", "◁/think▷"), ("<seed:think>", "</seed:think>"))
# The guess for templates without any think marker (the DeepSeek-R1/Qwen3 inline form).
INLINE = "<think>\n" + REASONING + "\n</think>\n\n" + CONTENT
_R, _C = "zq7probe9reasoning", "zq7probe9content"

Render = Callable[[list[dict[str, Any]], bool], str]


class FormError(UsageError):
    """A --completion-format that cannot be a completion form; the message says why (exit 2)."""


@dataclass(frozen=True)
class CompletionForm:
    """`form` with `{reasoning}` before `{content}`, each once; `source` says where it came
    from (for meta.json and stats); `guess` marks the inline guess (refused with reasoning)."""

    form: str
    source: str
    field: str | None = None  # the message field the template renders reasoning from
    guess: bool = False

    def __post_init__(self) -> None:
        for ph in (REASONING, CONTENT):
            if self.form.count(ph) != 1:
                raise FormError(f"--completion-format must hold {ph} exactly once: "
                                f"{self.form!r}")
        if self.form.index(REASONING) > self.form.index(CONTENT):
            raise FormError(f"--completion-format: {REASONING} must come before {CONTENT} "
                            f"(a model reasons, then answers): {self.form!r}")

    def parts(self) -> tuple[str, str, str]:
        """(before the reasoning, between reasoning and content, after the content)."""
        a, rest = self.form.split(REASONING)
        b, c = rest.split(CONTENT)
        return a, b, c

    def text(self, reasoning: str, content: str) -> str:
        a, b, c = self.parts()
        return a + reasoning + b + content + c

    def cut_at(self, reasoning: str, content: str) -> int:
        """Where an answer cut at max_tokens ended, in `text`: after its content, or after
        its reasoning when it was cut before any content (no closing marker emitted)."""
        a, b, _ = self.parts()
        if content:
            return len(a) + len(reasoning) + len(b) + len(content)
        return len(a) + len(reasoning)

    def describe(self) -> dict[str, Any]:
        return {"completion_format": self.form, "source": self.source,
                "reasoning_field": self.field, "guess": self.guess}


def unescape(text: str) -> str:
    """The flag's `\\n`, `\\t` and `\\\\` as characters (shells pass them literally)."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[text[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def from_flag(text: str) -> CompletionForm:
    return CompletionForm(unescape(text), "--completion-format")


@dataclass(frozen=True)
class Detection:
    """The form found, or why none could be (`reason`, `suggestion`: a flag value)."""

    form: CompletionForm | None
    reason: str = ""
    suggestion: str | None = None


def _try(render: Render, messages: list[dict[str, Any]], gen: bool) -> str | None:
    try:
        return render(messages, gen)
    except Exception:  # a template may raise on shapes it does not expect: no answer
        return None


def _placeholders(text: str) -> str:
    return text.replace(_R, REASONING).replace(_C, CONTENT)


def _markers(template_source: str, *texts: str) -> list[tuple[str, str]]:
    seen = template_source + "".join(texts)
    return [(o, c) for o, c in MARKERS if c in seen]


def detect(render: Render, template_source: str) -> Detection:
    """The completion form the template implies (see the module docstring)."""
    user = [{"role": "user", "content": "q"}]
    prompt = _try(render, user, True)
    if prompt is None:
        return Detection(None, "the chat template cannot render a user turn with "
                               "add_generation_prompt=True")
    # 1. a field the template renders right after the generation prompt
    for field in REASONING_FIELDS:
        full = _try(render, [*user, {"role": "assistant", "content": _C, field: _R}], False)
        if full is None or not full.startswith(prompt):
            continue
        suffix = full[len(prompt):]
        if suffix.count(_R) == 1 and suffix.count(_C) == 1 and suffix.index(_R) < suffix.index(_C):
            return Detection(CompletionForm(_placeholders(suffix),
                                            f"template field {field!r}", field))
    # 2. an empty think block where the template drops the reasoning
    plain = _try(render, [*user, {"role": "assistant", "content": _C}], False)
    bare = _try(render, user, False)
    pairs = _markers(template_source, prompt, plain or "")
    if plain is None or bare is None or not pairs:
        return Detection(CompletionForm(INLINE, "inline (guess: the template has no think "
                                                "marker)", guess=True))
    for opening, closing in pairs:
        block = re.compile(re.escape(opening) + r"(\s*)" + re.escape(closing))
        m = block.search(plain)
        if m is None or _C not in plain[m.end():]:
            continue
        inner = m.group(1)
        half = len(inner) // 2
        shaped = (plain[:m.start()] + opening + inner[:half] + REASONING + inner[half:]
                  + closing + plain[m.end():])
        shaped = _placeholders(shaped)
        if shaped.startswith(prompt):
            return Detection(CompletionForm(shaped[len(prompt):],
                                            f"template's empty {opening}{closing} block"))
    # 3. undetermined: say what is known and what to pass
    opening, closing = pairs[0]
    turn = plain[len(bare):] if plain.startswith(bare) else ""
    gen = prompt[len(bare):] if prompt.startswith(bare) else ""
    head = _common_prefix(turn, gen)
    rest = _placeholders(turn[len(head):])
    opened = gen[len(head):]
    suggestion = None
    if opened.rstrip().endswith(opening) and CONTENT in rest:
        ws = opened[opened.rindex(opening) + len(opening):]
        suggestion = REASONING + ws + closing + "\n\n" + rest
    reason = (f"the generation prompt ends {gen[-24:]!r} and the template renders an "
              f"assistant turn as {_placeholders(turn)[:48]!r}: it never renders the "
              f"reasoning, nor what follows {closing!r}")
    return Detection(None, reason, suggestion)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def refusal(det: Detection) -> str:
    """The exit-2 message for an undetermined form: what is known, the flag, an example."""
    example = det.suggestion or "<think>{reasoning}</think>{content}<|im_end|>"
    shown = example.replace("\\", "\\\\").replace("\n", "\\n")
    return (f"cannot tell from the chat template what the model emits after its generation "
            f"prompt ({det.reason}); pass the form with --completion-format, e.g. "
            f"--completion-format '{shown}' (what the target generates: {REASONING} and "
            f"{CONTENT} where they go, markers and end-of-turn token as it writes them; "
            "see docs/extractor.md)")
