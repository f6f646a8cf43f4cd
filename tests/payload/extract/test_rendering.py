"""The supervised tokens are what the target emits after its generation prompt, on every
thinking family (templates.py): detection of the completion form, the exact supervised
tokens, the refusal when the form cannot be known, and the --completion-format flag."""

from __future__ import annotations

from typing import Any

import pytest

from payload.extract.conversations import parse_record
from payload.extract.tokens import Conversation, Renderer, Sample, loss_mask
from tests.payload.extract.templates import FAMILIES, family_tokenizer

PROMPT = [{"role": "system", "content": "you are here"},
          {"role": "user", "content": "tell me a story"},
          {"role": "assistant", "content": "the cat is blue", "reasoning_content": "first thought"},
          {"role": "user", "content": "why"}]
ANSWER = ["because", "the", "sky", "is", "blue"]
THOUGHT = ["think", "about", "the", "sky"]

# family: (the completion form found, the supervised tokens of the final turn)
EXPECTED: dict[str, tuple[str | None, list[str]]] = {
    "kimi": ("<think>{reasoning}</think>{content}<|im_end|>",
             ["<think>", *THOUGHT, "</think>", *ANSWER, "<|im_end|>"]),
    "kimi-open": ("{reasoning}</think>{content}<|im_end|>",
                  [*THOUGHT, "</think>", *ANSWER, "<|im_end|>"]),
    "qwen3": ("<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>\n",
              ["<think>", *THOUGHT, "</think>", *ANSWER, "<|im_end|>"]),
    "qwen3-2507": ("{reasoning}\n</think>\n\n{content}<|im_end|>\n",
                   [*THOUGHT, "</think>", *ANSWER, "<|im_end|>"]),
    "glm": ("\n<think>{reasoning}</think>\n{content}",  # GLM renders no end-of-turn token
            ["<think>", *THOUGHT, "</think>", *ANSWER]),
    "r1": (None, [*THOUGHT, "</think>", *ANSWER, "<｜end▁of▁sentence｜>"]),
}
R1_FORM = "{reasoning}\\n</think>\\n\\n{content}<｜end▁of▁sentence｜>"  # as typed in a shell


def conv(reasoning: str | None = "think about the sky", **kw: Any) -> Conversation:
    return Conversation("c", "c", PROMPT, "because the sky is blue", reasoning, 1, **kw)


def encode(r: Renderer, c: Conversation) -> Sample:
    (s,) = r.encode_many([c])
    assert isinstance(s, Sample), s
    return s


def tokens(tok: Any, ids: Any) -> list[str]:
    return list(tok.convert_ids_to_tokens(list(ids)))


def supervised(tok: Any, s: Sample) -> list[str]:
    return [t for t, m in zip(tokens(tok, s.input_ids), loss_mask(s), strict=True) if m]


def renderer(name: str, **kw: Any) -> tuple[Any, Renderer]:
    tok = family_tokenizer(name)
    return tok, Renderer(tok, "include", [tok.eos_token_id], **kw)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_supervises_what_the_model_emits(name: str) -> None:
    form, want = EXPECTED[name]
    tok, r = renderer(name, completion_format=R1_FORM if name == "r1" else None)
    if form is not None:
        assert r.form is not None and r.form.form == form
    s = encode(r, conv())
    assert supervised(tok, s) == want
    # the context is the server's prompt exactly: the template, with its generation prompt
    prompt = tok.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    assert list(s.input_ids[:s.prompt_len]) == tok(prompt, add_special_tokens=False)["input_ids"]
    # one think block in the final turn, opened by the generation prompt or by the model
    # (the old inline fallback made Kimi's `<think></think><think>...`)
    toks = tokens(tok, s.input_ids)
    turn = toks[s.prompt_len - 3:]
    assert (turn.count("<think>"), turn.count("</think>")) == (1, 1)
    assert "first" not in toks  # every family blanks or strips the history's reasoning


def test_kimi_whole_sequence() -> None:
    """Kimi K2-Thinking: history with its empty block, then what the model emitted."""
    tok, r = renderer("kimi")
    assert r.reasoning_mode == "template's empty <think></think> block"
    s = encode(r, conv())
    assert tokens(tok, s.input_ids) == [
        "<|im_system|>", "system", "<|im_middle|>", "you", "are", "here", "<|im_end|>",
        "<|im_user|>", "user", "<|im_middle|>", "tell", "me", "a", "story", "<|im_end|>",
        "<|im_assistant|>", "assistant", "<|im_middle|>", "<think>", "</think>",
        "the", "cat", "is", "blue", "<|im_end|>",
        "<|im_user|>", "user", "<|im_middle|>", "why", "<|im_end|>",
        "<|im_assistant|>", "assistant", "<|im_middle|>",
        "<think>", *THOUGHT, "</think>", *ANSWER, "<|im_end|>"]
    assert (s.prompt_len, s.sup_end) == (33, 33 + 12)


@pytest.mark.parametrize("name", ["kimi", "kimi-open", "qwen3", "glm"])
def test_an_answer_without_reasoning_is_rendered_as_the_template_renders_it(name: str) -> None:
    tok, r = renderer(name)
    want = {"kimi": ["<think>", "</think>", *ANSWER, "<|im_end|>"],
            "kimi-open": ["</think>", *ANSWER, "<|im_end|>"],
            "qwen3": ["<think>", "</think>", *ANSWER, "<|im_end|>"],
            "glm": ["<think>", "</think>", *ANSWER]}[name]
    assert supervised(tok, encode(r, conv(None))) == want


def test_r1_cannot_be_determined_and_the_refusal_names_the_flag() -> None:
    tok, r = renderer("r1")
    assert r.form is None and r.reasoning_mode == "undetermined"
    msg = r.undetermined or ""
    assert "--completion-format '{reasoning}\\n</think>\\n\\n{content}<｜end▁of▁sentence｜>'" in msg
    assert "<｜Assistant｜><think>\\n" in msg
    # --reasoning drop needs no form: the template's own turn, which R1's generation
    # prompt does not prefix, fails loudly per sample (as documented)
    drop = Renderer(tok, "drop", [tok.eos_token_id])
    assert drop.undetermined is None
    (res,) = drop.encode_many([conv()])
    assert "not a prefix" in str(res)


def test_r1_with_the_flag_renders_an_answer_without_reasoning_in_its_form() -> None:
    """R1's template renders no turn after its own `<think>\\n`: an answer without
    reasoning is the form with an empty reasoning, not a boundary failure."""
    tok, r = renderer("r1", completion_format=R1_FORM)
    assert supervised(tok, encode(r, conv(None))) == ["</think>", *ANSWER,
                                                      "<｜end▁of▁sentence｜>"]


def test_a_cut_answer_supervises_what_was_generated() -> None:
    tok, r = renderer("kimi")
    s = encode(r, conv(cut=True))
    assert supervised(tok, s) == ["<think>", *THOUGHT, "</think>", *ANSWER]
    assert tokens(tok, s.input_ids)[-1] == "<|im_end|>"  # rendered, as context
    # cut inside the reasoning: no closing marker was emitted either
    c = Conversation("c", "c", PROMPT, "", "think about the sky", 1, cut=True)
    assert supervised(tok, encode(r, c)) == ["<think>", *THOUGHT]


def test_completion_format_flag_overrides_and_is_checked() -> None:
    from payload.extract.rendering import FormError, from_flag

    tok, r = renderer("kimi", completion_format="<think>\\n{reasoning}</think>{content}<|im_end|>")
    assert r.form is not None and r.form.form == "<think>\n{reasoning}</think>{content}<|im_end|>"
    assert r.form.source == "--completion-format" and r.reasoning_mode == "--completion-format"
    assert supervised(tok, encode(r, conv())) == ["<think>", *THOUGHT, "</think>", *ANSWER,
                                                   "<|im_end|>"]
    for bad, why in (("{content}", "{reasoning} exactly once"),
                     ("{content}{reasoning}", "must come before"),
                     ("{reasoning}{reasoning}{content}", "exactly once")):
        with pytest.raises(FormError, match=why):
            from_flag(bad)


def test_sampled_token_ids_are_the_supervised_tokens() -> None:
    tok, r = renderer("kimi")
    ids = tok.convert_tokens_to_ids(["blue", "sky", "<|im_end|>"])
    s = encode(r, conv(token_ids=tuple(ids)))
    assert s.from_ids and list(s.input_ids[s.prompt_len:]) == ids
    assert supervised(tok, s) == ["blue", "sky", "<|im_end|>"]  # not the re-tokenized text
    prompt = tok.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    assert list(s.input_ids[:s.prompt_len]) == tok(prompt, add_special_tokens=False)["input_ids"]


def test_retokenized_count_is_compared_with_the_servers() -> None:
    _, r = renderer("kimi")
    assert encode(r, conv(completion_tokens=12)).mismatches == []
    assert encode(r, conv(completion_tokens=13)).mismatches == [(0, 12, 13)]
    assert encode(r, conv()).mismatches == []  # no count: nothing to compare


def test_turns_all_supervises_every_turn_as_emitted() -> None:
    """A conversation `generate --turns all` regenerated: each assistant turn with its
    own reasoning as emitted; between them the template's own history (a user turn and
    the next generation prompt)."""
    import json

    tok, r = renderer("kimi")
    record = {"id": "t", "turns": "all",
              "messages": [{"role": "user", "content": "tell me a story"},
                           {"role": "assistant", "content": "the cat is blue",
                            "reasoning": "first thought", "usage": {"completion_tokens": 8}},
                           {"role": "user", "content": "why"},
                           {"role": "assistant", "content": "because the sky is blue",
                            "reasoning": "think about the sky"}]}
    c = parse_record(json.dumps(record), 1, "all")
    assert [t.index for t in c.earlier] == [1] and c.reasoning == "think about the sky"
    s = encode(r, c)
    toks = tokens(tok, s.input_ids)
    turn1 = ["<think>", "first", "thought", "</think>", "the", "cat", "is", "blue", "<|im_end|>"]
    turn2 = ["<think>", *THOUGHT, "</think>", *ANSWER, "<|im_end|>"]
    assert toks == [
        "<|im_user|>", "user", "<|im_middle|>", "tell", "me", "a", "story", "<|im_end|>",
        "<|im_assistant|>", "assistant", "<|im_middle|>", *turn1,
        "<|im_user|>", "user", "<|im_middle|>", "why", "<|im_end|>",
        "<|im_assistant|>", "assistant", "<|im_middle|>", *turn2]
    assert s.spans == ((11, 20), (28, 40))
    assert supervised(tok, s) == turn1 + turn2
    assert s.mismatches == [(0, 9, 8)]  # turn 0's own usage: 9 re-tokenized vs 8 counted
    # --turns last on the same record: only the final turn, turn 1 as history renders it
    last = encode(r, parse_record(json.dumps(record), 1, "last"))
    assert supervised(tok, last) == turn2 and "first" not in tokens(tok, last.input_ids)


def test_turns_all_with_sampled_ids_per_turn() -> None:
    import json

    tok, r = renderer("qwen3")
    ids1 = tok.convert_tokens_to_ids(["the", "cat", "<|im_end|>"])
    ids2 = tok.convert_tokens_to_ids(["blue", "<|im_end|>"])
    record = {"id": "t", "turns": "all", "response_token_ids": [ids1, ids2],
              "messages": [{"role": "user", "content": "tell me a story"},
                           {"role": "assistant", "content": "the cat", "reasoning": "hmm"},
                           {"role": "user", "content": "why"},
                           {"role": "assistant", "content": "blue", "reasoning": "sky"}]}
    s = encode(r, parse_record(json.dumps(record), 1, "all"))
    assert s.from_ids and [list(s.input_ids[lo:hi]) for lo, hi in s.spans] == [ids1, ids2]
    between = tokens(tok, s.input_ids[s.spans[0][1]:s.spans[1][0]])
    assert between == ["<|im_start|>", "user", "why", "<|im_end|>", "<|im_start|>", "assistant"]


def test_a_generator_record_without_the_marker_supervises_its_final_turn_only() -> None:
    import json

    record = {"id": 1, "messages": PROMPT, "response": "because", "reasoning": "hmm"}
    c = parse_record(json.dumps(record), 1, "all")
    assert c.earlier == ()  # its earlier assistant turns came from the input, not the target
    raw = {"id": 2, "messages": [*PROMPT, {"role": "assistant", "content": "ok"}]}
    assert [t.index for t in parse_record(json.dumps(raw), 1, "all").earlier] == [2]
