"""Features equal a direct forward pass, alone and batched; layer indices are HF's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.payload.extract.helpers import (
    HIDDEN,
    NUM_LAYERS,
    load_sample,
    make_records,
    manifest,
    run_extract,
    stats,
    write_jsonl,
)


@pytest.fixture(scope="module")
def records() -> list:
    return make_records(16, seed=3)


@pytest.fixture(scope="module")
def batched(tmp_path_factory, model_dir: Path, records) -> Path:
    d = tmp_path_factory.mktemp("batched")
    inp = write_jsonl(d / "in.jsonl", records)
    assert run_extract(inp, model_dir, d / "out", "--layers", "1,4,8",
                       "--batch-tokens", "1024") == 0
    return d / "out"


@pytest.fixture(scope="module")
def alone(tmp_path_factory, model_dir: Path, records) -> Path:
    d = tmp_path_factory.mktemp("alone")
    inp = write_jsonl(d / "in.jsonl", records)
    # every sample is longer than 1 token, so each runs alone
    assert run_extract(inp, model_dir, d / "out", "--layers", "1,4,8",
                       "--batch-tokens", "1") == 0
    return d / "out"


def test_batches_really_were_batched_and_padded(batched: Path, records) -> None:
    entries = manifest(batched)
    assert len(entries) == len(records)
    lengths = {e["num_tokens"] for e in entries}
    assert len(lengths) > 3  # varied lengths: batches had padding to ignore


def test_features_equal_output_hidden_states(batched: Path, alone: Path, hf_model) -> None:
    import torch

    for out in (batched, alone):
        for e in manifest(out):
            f = load_sample(out, e["file"])
            t = e["num_tokens"]
            assert f["input_ids"].shape == (t,) and f["loss_mask"].shape == (t,)
            assert f["aux_hidden_states"].shape == (t, 3 * HIDDEN)
            assert f["hidden_state"].shape == (t, HIDDEN)
            with torch.inference_mode():
                hs = hf_model(input_ids=f["input_ids"][None], output_hidden_states=True
                              ).hidden_states
            assert len(hs) == NUM_LAYERS + 1
            want_aux = torch.cat([hs[1][0], hs[4][0], hs[8][0]], dim=-1)
            torch.testing.assert_close(f["aux_hidden_states"], want_aux, atol=1e-4, rtol=0)
            # hidden_state is HF's last tuple entry: the post-norm state
            torch.testing.assert_close(f["hidden_state"], hs[-1][0], atol=1e-4, rtol=0)
            assert int(f["loss_mask"].sum()) == e["num_supervised"] > 0


def test_batched_equals_alone(batched: Path, alone: Path) -> None:
    import torch

    a = {str(e["id"]): e for e in manifest(alone)}
    for e in manifest(batched):
        fb, fa = load_sample(batched, e["file"]), load_sample(alone, a[str(e["id"])]["file"])
        assert torch.equal(fb["input_ids"], fa["input_ids"])
        assert torch.equal(fb["loss_mask"], fa["loss_mask"])
        torch.testing.assert_close(fb["aux_hidden_states"], fa["aux_hidden_states"],
                                   atol=1e-4, rtol=0)
        torch.testing.assert_close(fb["hidden_state"], fa["hidden_state"], atol=1e-4, rtol=0)


def test_default_layers_and_meta(tmp_path: Path, model_dir: Path, hf_model) -> None:
    import json

    import torch

    inp = write_jsonl(tmp_path / "in.jsonl", make_records(2))
    assert run_extract(inp, model_dir, tmp_path / "out") == 0
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    n = NUM_LAYERS
    assert meta["layers"] == [2, n // 2, n - 3]
    assert meta["num_layers"] == n and meta["hidden_size"] == HIDDEN
    assert meta["final_normed"] is True and meta["dtype"] == "float32"
    e = manifest(tmp_path / "out")[0]
    f = load_sample(tmp_path / "out", e["file"])
    with torch.inference_mode():
        hs = hf_model(input_ids=f["input_ids"][None], output_hidden_states=True).hidden_states
    want = torch.cat([hs[2][0], hs[4][0], hs[5][0]], dim=-1)
    torch.testing.assert_close(f["aux_hidden_states"], want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("layers, fragment", [
    ("0,4,5", "index 0 is the embedding"),
    ("1,4,9", "out of range"),
    ("-1,4,5", "out of range"),
    ("2,2,5", "distinct"),
    ("2,5", "exactly three"),
    ("a,b,c", "three integers"),
])
def test_bad_layers_exit_2(tmp_path: Path, model_dir: Path, capsys, layers: str,
                           fragment: str) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", make_records(1))
    assert run_extract(inp, model_dir, tmp_path / "out", f"--layers={layers}") == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "out" / "manifest.jsonl").exists()


def test_bf16_features_and_nonfinite_rejected(tmp_path: Path, tokenizer) -> None:
    """A NaN embedding row poisons exactly the samples that contain that token."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from tests.payload.extract.helpers import build_model

    model = build_model(len(tokenizer))
    poison = tokenizer.convert_tokens_to_ids("poison")
    with torch.no_grad():
        model.get_input_embeddings().weight[poison] = float("nan")
    mdir = tmp_path / "poisoned"
    model.save_pretrained(mdir)
    tokenizer.save_pretrained(mdir)
    recs = make_records(6)
    recs[2]["response"] = "the poison word"
    inp = write_jsonl(tmp_path / "in.jsonl", recs)
    out = tmp_path / "out"
    assert run_extract(inp, mdir, out, "--dtype", "bfloat16") == 1
    ids = {str(e["id"]) for e in manifest(out)}
    assert ids == {str(r["id"]) for r in recs} - {str(recs[2]["id"])}
    err = [json.loads(x) for x in next(out.glob("errors.*.jsonl")).read_text().splitlines()]
    assert [(e["id"], e["error"]) for e in err] == [(recs[2]["id"], "nonfinite")]
    assert stats(out)["failed_nonfinite"] == 1
    f = load_sample(out, manifest(out)[0]["file"])
    assert f["aux_hidden_states"].dtype == torch.bfloat16
    # bf16 features track the fp32 model within bf16 precision
    ref = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32,
                                               local_files_only=True).eval()
    with torch.inference_mode():
        hs = ref(input_ids=f["input_ids"][None], output_hidden_states=True).hidden_states
    torch.testing.assert_close(f["hidden_state"].float(), hs[-1][0], atol=0.1, rtol=0.05)
