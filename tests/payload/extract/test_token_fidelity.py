"""Token fidelity end to end (issue 19, the generator side): `generate` asks a server that
can return the sampled token ids for them (`return_token_ids`, vLLM's field; never asked of
OpenRouter), stores them as `response_token_ids` (per turn with `--turns all`), and
`extract` supervises exactly those ids: the supervised tokens equal what the fake sampled,
not a re-tokenization of the text (the fake's ids are nothing the tokenizer would make)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from payload.records import derive_id
from tests.payload.extract.helpers import load_sample, manifest, run_extract, stats
from tests.payload.helpers import gen_args, read_jsonl, run_payload, status_of

pytestmark = pytest.mark.timeout(300)


def supervised_ids(out: Path) -> dict[str, list[int]]:
    found = {}
    for e in manifest(out):
        f = load_sample(out, e["file"])
        ids, mask = f["input_ids"].tolist(), f["loss_mask"].tolist()
        found[str(e["id"])] = [i for i, m in zip(ids, mask, strict=True) if m]
    return found


def sent(messages: list[dict]) -> list[dict]:
    """A history as the generator sends it: role and content only."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def test_sampled_ids_from_the_fake_are_the_supervised_tokens(fake_factory, key_file, tmp_path,
                                                             model_dir) -> None:
    fake = fake_factory(token_ids=True, token_vocab=60, record_bodies=True)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    with inp.open("w") as fh:
        for i in range(6):
            fh.write(json.dumps({"id": i, "messages": [
                {"role": "user", "content": f"tell me about the sky {i}"}]}) + "\n")
    proc = run_payload(*gen_args(fake, key_file, inp, out))
    assert proc.returncode == 0, proc.stderr
    assert all(b.get("return_token_ids") is True for b in fake.stats.bodies)  # auto: asked
    recs = read_jsonl(out)
    assert len(recs) == 6
    for r in recs:
        want = fake.stats.token_ids_by_prompt[derive_id(r["messages"])]
        assert r["response_token_ids"] == want and len(want) == r["usage"]["completion_tokens"]
    feats = tmp_path / "features"
    assert run_extract(out, model_dir, feats) == 0
    got = supervised_ids(feats)
    for r in recs:
        assert got[str(r["id"])] == r["response_token_ids"], r["id"]
    s = stats(feats)
    # every supervised token came from the stored ids (a count of tokens), none re-tokenized
    assert s["supervised_from_token_ids"] == sum(len(r["response_token_ids"]) for r in recs)
    assert s["supervised_retokenized"] == 0 and s["retokenized_mismatch"] == 0


def test_turns_all_stores_and_supervises_every_turns_ids(fake_factory, key_file, tmp_path,
                                                         model_dir) -> None:
    fake = fake_factory(token_ids=True, token_vocab=60, check_history=True)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    with inp.open("w") as fh:
        for i in range(3):
            msgs = []
            for t in range(3):
                msgs += [{"role": "user", "content": f"why is the sky blue {i} {t}"},
                         {"role": "assistant", "content": "an old answer"}]
            fh.write(json.dumps({"id": i, "messages": msgs}) + "\n")
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--turns", "all"))
    assert proc.returncode == 0, proc.stderr
    assert fake.stats.history_mismatches == 0
    recs = read_jsonl(out)
    assert len(recs) == 3
    expected: dict[str, list[int]] = {}
    for r in recs:
        msgs = r["messages"]
        turns = []
        for j, m in enumerate(msgs):
            if m["role"] == "assistant":
                # each earlier turn's ids beside its text, what the fake sampled for it
                assert m["response_token_ids"] == \
                    fake.stats.token_ids_by_prompt[derive_id(sent(msgs[:j]))]
                turns.append(m["response_token_ids"])
        assert r["response_token_ids"] == fake.stats.token_ids_by_prompt[derive_id(sent(msgs))]
        assert len(turns) == 2 and all("response_token_ids" not in t for t in r["turns"])
        expected[str(r["id"])] = [i for ids in [*turns, r["response_token_ids"]] for i in ids]
    feats = tmp_path / "features"
    assert run_extract(out, model_dir, feats, "--turns", "all") == 0
    assert supervised_ids(feats) == expected
    s = stats(feats)
    assert s["supervised_from_token_ids"] == sum(map(len, expected.values()))
    assert s["supervised_retokenized"] == 0


def test_a_server_that_refuses_the_field_is_asked_without_it(fake_factory, key_file,
                                                             tmp_path) -> None:
    fake = fake_factory(refuse_fields=("return_token_ids",))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    with inp.open("w") as fh:
        for i in range(20):
            fh.write(json.dumps({"id": i, "prompt": f"question {i}"}) + "\n")
    proc = run_payload(*gen_args(fake, key_file, inp, out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("the server refused return_token_ids") == 1
    recs = read_jsonl(out)
    assert len(recs) == 20 and not any("response_token_ids" in r for r in recs)
    assert all(r["attempts"] <= 2 for r in recs)  # a refusal is no attempt's failure
    assert status_of(out)["failed"] == 0
    # --token-ids on: the refusal is the server's answer, every prompt the same: exit 3
    out2 = tmp_path / "on.jsonl"
    proc = run_payload(*gen_args(fake, key_file, inp, out2, "--token-ids", "on"))
    assert proc.returncode == 3, proc.stderr
    assert "return_token_ids" in status_of(out2)["last_error"]
    # --token-ids off: never asked
    fake2 = fake_factory(record_bodies=True)
    proc = run_payload(*gen_args(fake2, key_file, inp, tmp_path / "off.jsonl",
                                 "--token-ids", "off"))
    assert proc.returncode == 0 and not any("return_token_ids" in b for b in fake2.stats.bodies)


def test_openrouter_is_never_asked_for_token_ids() -> None:
    from payload.errors import UsageError
    from payload.generate.client import build_body, sampled_ids
    from payload.generate.settings import token_ids_for

    assert not token_ids_for("https://openrouter.ai/api/v1", "auto")
    assert token_ids_for("http://127.0.0.1:8000/v1", "auto")
    assert not token_ids_for("http://127.0.0.1:8000/v1", "off")
    with pytest.raises(UsageError, match="OpenRouter cannot return the sampled token ids"):
        token_ids_for("https://openrouter.ai/api/v1", "on")
    body = build_body([{"role": "user", "content": "x"}], model="m", provider=None,
                      max_tokens=None, temperature=None, top_p=None, reasoning=None)
    assert "return_token_ids" not in body
    # only a list of non-negative ints is kept as ids
    assert sampled_ids([1, 2, 3]) == [1, 2, 3]
    for bad in ([], [1, -1], [1, 2.0], [True], "12", None, [[1]]):
        assert sampled_ids(bad) is None
