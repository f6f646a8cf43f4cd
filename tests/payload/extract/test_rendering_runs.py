"""The rendering through whole runs: meta.json and stats say which one was used, an
undeterminable form is refused before the model loads (exit 2, naming the flag), sampled
ids are used as they are, re-tokenization mismatches are counted and listed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.payload.extract.helpers import (
    build_tokenizer,
    load_sample,
    make_records,
    manifest,
    run_extract,
    stats,
    write_jsonl,
)
from tests.payload.extract.templates import family_model_dir, family_tokenizer

MESSAGES = [{"role": "user", "content": "tell me a story"}]
THOUGHT = ["think", "about", "the", "sky"]
ANSWER = ["because", "the", "sky", "is", "blue"]


def record(rid: str, **kw: object) -> dict:
    return {"id": rid, "messages": MESSAGES, "response": "because the sky is blue",
            "reasoning": "think about the sky", "finish_reason": "stop", **kw}


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return family_model_dir(tmp_path_factory.mktemp("families"), "kimi")


def supervised(tok, out: Path, rid: str) -> list[str]:
    e = next(e for e in manifest(out) if str(e["id"]) == rid)
    f = load_sample(out, e["file"])
    toks = tok.convert_ids_to_tokens(f["input_ids"].tolist())
    return [t for t, m in zip(toks, f["loss_mask"].tolist(), strict=True) if m]


def test_kimi_run_records_its_rendering(tmp_path: Path, kimi_dir: Path) -> None:
    tok = family_tokenizer("kimi")
    inp = write_jsonl(tmp_path / "in.jsonl", [record("a"), record("b", reasoning=None)])
    out = tmp_path / "out"
    assert run_extract(inp, kimi_dir, out) == 0
    assert supervised(tok, out, "a") == ["<think>", *THOUGHT, "</think>", *ANSWER, "<|im_end|>"]
    assert supervised(tok, out, "b") == ["<think>", "</think>", *ANSWER, "<|im_end|>"]
    meta = json.loads((out / "meta.json").read_text())
    want = {"completion_format": "<think>{reasoning}</think>{content}<|im_end|>",
            "source": "template's empty <think></think> block", "reasoning_field": None,
            "guess": False}
    assert meta["rendering"] == want and meta["turns"] == "last"
    assert meta["completion_format"] == want["completion_format"]
    s = stats(out)
    assert s["rendering"] == want and s["reasoning_mode"] == want["source"]
    assert (s["supervised_retokenized"], s["supervised_from_token_ids"]) == (12 + 8, 0)
    # another form for the same dir is another kind of features: refused
    assert run_extract(inp, kimi_dir, out, "--completion-format",
                       "<think>\\n{reasoning}</think>{content}<|im_end|>") == 2


def test_sampled_ids_and_mismatches(tmp_path: Path, kimi_dir: Path, capsys) -> None:
    tok = family_tokenizer("kimi")
    ids = tok.convert_tokens_to_ids(["blue", "sky", "<|im_end|>"])
    recs = [record("ids", response_token_ids=ids, usage={"completion_tokens": 3}),
            record("ok", usage={"completion_tokens": 12}),
            record("off", usage={"completion_tokens": 14}),
            record("bad", response_token_ids=[len(tok) + 5])]
    inp = write_jsonl(tmp_path / "in.jsonl", recs)
    out = tmp_path / "keep"
    assert run_extract(inp, kimi_dir, out) == 0
    assert supervised(tok, out, "ids") == ["blue", "sky", "<|im_end|>"]
    s = stats(out)
    assert (s["retokenized_mismatch"], s["skipped_mismatch"], s["written"]) == (1, 0, 3)
    assert s["supervised_from_token_ids"] == 3 and s["bad_lines"] == 1
    listed = [json.loads(x) for x in next(out.glob("mismatches.*.jsonl")).read_text().splitlines()]
    assert listed == [{"id": "off", "line": 3, "turn": 0, "supervised": 12,
                       "completion_tokens": 14, "action": "kept"}]
    err = capsys.readouterr().err
    assert "retokenized_mismatch: id off (line 3) turn 0: 12 supervised tokens, the server " \
           "counted 14; kept" in err
    assert "'response_token_ids' holds id" in err
    out = tmp_path / "skip"
    assert run_extract(inp, kimi_dir, out, "--on-mismatch", "skip") == 0
    s = stats(out)
    assert (s["retokenized_mismatch"], s["skipped_mismatch"], s["written"]) == (1, 1, 2)
    assert {e["id"] for e in manifest(out)} == {"ids", "ok"}


def test_undeterminable_form_exits_2_before_the_model_loads(tmp_path: Path, capsys) -> None:
    r1 = family_model_dir(tmp_path / "models", "r1", weights=False)  # no weights to load
    inp = write_jsonl(tmp_path / "in.jsonl", [record("a")])
    out = tmp_path / "out"
    for extra in ((), ("--preflight-only",)):
        assert run_extract(inp, r1, out, *extra) == 2
        err = capsys.readouterr().err
        assert "--completion-format '{reasoning}\\n</think>\\n\\n{content}<｜end▁of▁sentence｜>'" in err
        assert not out.exists()


def test_r1_with_the_flag(tmp_path: Path) -> None:
    r1 = family_model_dir(tmp_path / "models", "r1")
    tok = family_tokenizer("r1")
    inp = write_jsonl(tmp_path / "in.jsonl", [record("a")])
    out = tmp_path / "out"
    form = "{reasoning}\\n</think>\\n\\n{content}<｜end▁of▁sentence｜>"
    assert run_extract(inp, r1, out, "--completion-format", form) == 0
    assert supervised(tok, out, "a") == [*THOUGHT, "</think>", *ANSWER, "<｜end▁of▁sentence｜>"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["rendering"]["completion_format"] == \
        "{reasoning}\n</think>\n\n{content}<｜end▁of▁sentence｜>"
    assert meta["rendering"]["source"] == "--completion-format"


def test_a_template_without_thinking_refuses_reasoning_only(tmp_path: Path, model_dir: Path,
                                                            capsys) -> None:
    """The inline form is a guess: used for nothing; records without reasoning run."""
    import shutil

    d = tmp_path / "plain"
    shutil.copytree(model_dir, d)
    build_tokenizer("{% for m in messages %}<|{{ m.role }}|>: {{ m.content }}<|eot|>{% endfor %}"
                    "{% if add_generation_prompt %}<|assistant|>:{% endif %}").save_pretrained(d)
    inp = write_jsonl(tmp_path / "in.jsonl", [record("a")])
    assert run_extract(inp, d, tmp_path / "o1") == 2
    assert "pass the form with --completion-format" in capsys.readouterr().err
    inp = write_jsonl(tmp_path / "in2.jsonl", [record("b", reasoning=None)])
    assert run_extract(inp, d, tmp_path / "o2") == 0
    assert run_extract(inp, d, tmp_path / "o3", "--completion-format",
                       "<think>{reasoning}</think> {content}<|eot|>") == 0


def test_flag_checks_and_specforge_dtype_warning(tmp_path: Path, model_dir: Path,
                                                 capsys) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", make_records(2))
    assert run_extract(inp, model_dir, tmp_path / "o", "--completion-format", "{content}") == 2
    assert "{reasoning} exactly once" in capsys.readouterr().err
    assert run_extract(inp, model_dir, tmp_path / "o", "--reasoning", "drop",
                       "--completion-format", "{reasoning}{content}") == 2
    assert "needs --reasoning include" in capsys.readouterr().err
    assert run_extract(inp, model_dir, tmp_path / "sf", "--format", "specforge") == 0
    assert "WARNING: --format specforge with float32 features" in capsys.readouterr().err
    # what SpecForge needs is bf16 FEATURES: an fp32 model storing bf16 ones is fine
    assert run_extract(inp, model_dir, tmp_path / "sf16", "--format", "specforge",
                       "--feature-dtype", "bf16") == 0
    assert "WARNING" not in capsys.readouterr().err


def test_turns_all_run(tmp_path: Path, kimi_dir: Path) -> None:
    tok = family_tokenizer("kimi")
    rec = {"id": "t", "turns": "all",
           "messages": [*MESSAGES,
                        {"role": "assistant", "content": "the cat", "reasoning": "first thought"},
                        {"role": "user", "content": "why"},
                        {"role": "assistant", "content": "because the sky is blue",
                         "reasoning": "think about the sky"}]}
    inp = write_jsonl(tmp_path / "in.jsonl", [rec])
    out = tmp_path / "out"
    assert run_extract(inp, kimi_dir, out, "--turns", "all", "--format", "speculators") == 0
    from datasets import load_from_disk

    row = load_from_disk(str(out))[0]
    toks = tok.convert_ids_to_tokens(row["input_ids"].tolist())
    sup = [t for t, m in zip(toks, row["loss_mask"].tolist(), strict=True) if m]
    assert sup == ["<think>", "first", "thought", "</think>", "the", "cat", "<|im_end|>",
                   "<think>", *THOUGHT, "</think>", *ANSWER, "<|im_end|>"]
    assert manifest(out)[0]["num_supervised"] == len(sup)
    assert json.loads((out / "meta.json").read_text())["turns"] == "all"


def test_byte_level_bpe_sampled_split_and_its_mismatch(tmp_path: Path) -> None:
    """A sampled non-canonical split (`Ġ s k y` for `Ġsky`): with the ids stored, exactly
    those ids are supervised; without them the re-tokenized text is one token per word,
    and the count check against usage.completion_tokens catches and lists it."""
    from tests.payload.extract.helpers import build_model
    from tests.payload.extract.templates import bpe_tokenizer

    tok = bpe_tokenizer()
    d = tmp_path / "bpe"
    build_model(len(tok)).save_pretrained(d)
    tok.save_pretrained(d)
    emitted = "<think>\nthink about the sky\n</think>\n\nbecause the sky is blue<|im_end|>"
    canonical = tok(emitted, add_special_tokens=False)["input_ids"]
    sky = tok.convert_tokens_to_ids("Ġsky")
    at = canonical.index(sky)
    sampled = [*canonical[:at], *tok.convert_tokens_to_ids(["Ġ", "s", "k", "y"]),
               *canonical[at + 1:]]
    assert tok.decode(sampled) == tok.decode(canonical) == emitted
    usage = {"completion_tokens": len(sampled)}
    inp = write_jsonl(tmp_path / "in.jsonl", [record("ids", response_token_ids=sampled,
                                                     usage=usage),
                                              record("text", usage=usage)])
    out = tmp_path / "out"
    assert run_extract(inp, d, out) == 0
    by_id = {str(e["id"]): e for e in manifest(out)}
    for rid, want in (("ids", sampled), ("text", canonical)):
        f = load_sample(out, by_id[rid]["file"])
        ids, mask = f["input_ids"].tolist(), f["loss_mask"].tolist()
        assert [i for i, m in zip(ids, mask, strict=True) if m] == want
        assert mask[-1] == 0 or rid == "ids"  # Qwen3's template adds "\n" after <|im_end|>
    s = stats(out)
    assert (s["retokenized_mismatch"], s["supervised_from_token_ids"]) == (1, len(sampled))
    (line,) = next(out.glob("mismatches.*.jsonl")).read_text().splitlines()
    assert json.loads(line) == {"id": "text", "line": 2, "turn": 0,
                                "supervised": len(canonical),
                                "completion_tokens": len(sampled), "action": "kept"}
