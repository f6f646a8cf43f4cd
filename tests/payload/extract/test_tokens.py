"""The loss mask comes from token boundaries: final assistant turn only, reasoning per flag."""

from __future__ import annotations

import json
from pathlib import Path

from tests.payload.extract.helpers import (
    build_tokenizer,
    load_sample,
    manifest,
    run_extract,
    stats,
    write_jsonl,
)

MULTI = {
    "id": "multi",
    "messages": [
        {"role": "system", "content": "you are here"},
        {"role": "user", "content": "tell me a story"},
        {"role": "assistant", "content": "the cat is blue", "reasoning": "first thought"},
        {"role": "user", "content": "why"},
    ],
    "response": "because the sky is blue",
    "reasoning": "think about the sky",
    "finish_reason": "stop",
}


def supervised_tokens(tok, out: Path, rid: str) -> tuple[list[str], list[str]]:
    e = next(e for e in manifest(out) if str(e["id"]) == rid)
    f = load_sample(out, e["file"])
    toks = tok.convert_ids_to_tokens(f["input_ids"].tolist())
    sup = [t for t, m in zip(toks, f["loss_mask"].tolist(), strict=True) if m]
    assert len(sup) == e["num_supervised"] == int(f["loss_mask"].sum())
    return toks, sup


def test_multi_turn_reasoning_included(tmp_path: Path, model_dir: Path, tokenizer) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", [MULTI])
    assert run_extract(inp, model_dir, tmp_path / "out") == 0
    toks, sup = supervised_tokens(tokenizer, tmp_path / "out", "multi")
    # exactly the final turn: thinking block, answer, end of turn; not the earlier answer
    assert sup == ["<think>", "think", "about", "the", "sky", "</think>",
                   "because", "the", "sky", "is", "blue", "<|eot|>"]
    assert "cat" in toks  # the earlier assistant turn is there, as context (mask 0)
    assert toks[0] == "<s>" and toks.count("<|eot|>") == 5


def test_reasoning_dropped(tmp_path: Path, model_dir: Path, tokenizer) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", [MULTI])
    assert run_extract(inp, model_dir, tmp_path / "out", "--reasoning", "drop") == 0
    toks, sup = supervised_tokens(tokenizer, tmp_path / "out", "multi")
    assert sup == ["because", "the", "sky", "is", "blue", "<|eot|>"]
    assert "<think>" not in toks


def test_cut_answer_end_of_turn_not_supervised(tmp_path: Path, model_dir: Path,
                                               tokenizer) -> None:
    cut = {**MULTI, "id": "cut", "finish_reason": "length"}
    inp = write_jsonl(tmp_path / "in.jsonl", [cut])
    assert run_extract(inp, model_dir, tmp_path / "out", "--reasoning", "drop") == 0
    toks, sup = supervised_tokens(tokenizer, tmp_path / "out", "cut")
    assert sup == ["because", "the", "sky", "is", "blue"]  # the template's <|eot|> is not
    assert toks[-1] == "<|eot|>"


def test_raw_records_sharegpt_and_trailing_assistant(tmp_path: Path, model_dir: Path,
                                                      tokenizer) -> None:
    recs = [
        {"id": "sg", "conversations": [{"from": "human", "value": "hello"},
                                       {"from": "gpt", "value": "hi there"}]},
        {"messages": [{"role": "user", "content": "what is fire"},
                      {"role": "assistant", "content": "red", "reasoning_content": "fire"}]},
        {"id": "noanswer", "messages": [{"role": "user", "content": "hello"}]},
        "{not json",
    ]
    inp = write_jsonl(tmp_path / "in.jsonl", recs)
    assert run_extract(inp, model_dir, tmp_path / "out") == 0
    _, sup = supervised_tokens(tokenizer, tmp_path / "out", "sg")
    assert sup == ["hi", "there", "<|eot|>"]
    from payload.records import derive_id

    derived = derive_id([{"role": "user", "content": "what is fire"}])
    _, sup = supervised_tokens(tokenizer, tmp_path / "out", derived)
    assert sup == ["<think>", "fire", "</think>", "red", "<|eot|>"]
    s = stats(tmp_path / "out")
    assert s["bad_lines"] == 2 and s["written"] == 2


def test_boundary_mismatch_fails_loudly_others_written(tmp_path: Path, model_dir: Path,
                                                        capsys) -> None:
    # `<|assistant|>:` + `!oops`: the tokenizer merges `:!`, so the prompt is no prefix
    bad = {"id": "bad", "messages": [{"role": "user", "content": "hello"}],
           "response": "!oops", "reasoning": None}
    good = {"id": "good", "messages": [{"role": "user", "content": "hello"}],
            "response": "hi", "reasoning": None}
    inp = write_jsonl(tmp_path / "in.jsonl", [bad, good])
    out = tmp_path / "out"
    status = tmp_path / "status.json"
    assert run_extract(inp, model_dir, out, "--reasoning", "drop", "--status-file",
                       str(status)) == 1
    st = json.loads(status.read_text())
    assert (st["state"], st["done"], st["failed"], st["total"]) == ("finished", 1, 1, 2)
    assert st["last_error"] == "boundary: id bad"
    err = capsys.readouterr().err
    assert "id bad (line 1)" in err and "not a prefix" in err and "':!'" in err
    assert [e["id"] for e in manifest(out)] == ["good"]
    errors = [json.loads(x) for x in next(out.glob("errors.*.jsonl")).read_text().splitlines()]
    assert [(e["id"], e["error"], e["line"]) for e in errors] == [("bad", "boundary", 1)]
    assert stats(out)["failed_boundary"] == 1


def test_overlong_truncate_skip_and_unsupervised(tmp_path: Path, model_dir: Path,
                                                  tokenizer) -> None:
    long_answer = {"id": "long", "messages": [{"role": "user", "content": "hi"}],
                   "response": " ".join(["word"] * 50), "reasoning": None}
    long_prompt = {"id": "lp", "messages": [{"role": "user", "content": " ".join(["a"] * 50)}],
                   "response": "ok", "reasoning": None}
    short = {"id": "short", "messages": [{"role": "user", "content": "hi"}],
             "response": "ok", "reasoning": None}
    inp = write_jsonl(tmp_path / "in.jsonl", [long_answer, long_prompt, short])

    out = tmp_path / "trunc"
    assert run_extract(inp, model_dir, out, "--max-length", "20") == 0
    s = stats(out)
    # the long prompt leaves no answer token inside 20: dropped (counted), not failed
    assert (s["truncated"], s["dropped_unsupervised"], s["written"]) == (2, 1, 2)
    e = {e["id"]: e for e in manifest(out)}
    assert e["long"]["num_tokens"] == 20 and e["long"]["num_supervised"] == 20 - 7
    # (the prompt is 7 tokens: <s> <|user|> : hi <|eot|> <|assistant|> :)
    _, sup = supervised_tokens(tokenizer, out, "long")
    assert sup == ["word"] * 13  # no end of turn: it was cut off

    out = tmp_path / "skip"
    assert run_extract(inp, model_dir, out, "--max-length", "20", "--overlong", "skip") == 0
    s = stats(out)
    assert (s["skipped_overlong"], s["truncated"], s["written"]) == (2, 0, 1)
    assert [e["id"] for e in manifest(out)] == ["short"]


def test_template_without_thinking_field_inlines_think_tags(tokenizer) -> None:
    from payload.extract.tokens import Conversation, Renderer

    plain = build_tokenizer(
        "{% for m in messages %}<|{{ m.role }}|>: {{ m.content }}<|eot|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>:{% endif %}")
    r = Renderer(plain, "include", [plain.eos_token_id])
    assert r.reasoning_mode == "inline"
    conv = Conversation("x", "x", [{"role": "user", "content": "hi"}], "ok", "hmm", 1)
    (s,) = r.encode_many([conv])
    toks = plain.convert_ids_to_tokens(list(s.input_ids))
    assert toks[s.prompt_len:s.sup_end] == ["<think>", "[UNK]", "</think>", "ok", "<|eot|>"]
    assert Renderer(tokenizer, "include", [1]).reasoning_mode == "template field " \
        "'reasoning_content'"


def test_tokens_after_end_of_turn_are_not_supervised() -> None:
    from payload.extract.tokens import Conversation, Renderer

    tok = build_tokenizer(
        "{% for m in messages %}<|{{ m.role }}|>: {{ m.content }}<|eot|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>:{% else %}<|pad|>{% endif %}")
    r = Renderer(tok, "drop", [tok.eos_token_id])
    (s,) = r.encode_many([Conversation(1, "1", [{"role": "user", "content": "hi"}],
                                       "ok", None, 1)])
    toks = tok.convert_ids_to_tokens(list(s.input_ids))
    assert toks[-1] == "<|pad|>" and s.sup_end == len(toks) - 1
    assert toks[s.prompt_len:s.sup_end] == ["ok", "<|eot|>"]
