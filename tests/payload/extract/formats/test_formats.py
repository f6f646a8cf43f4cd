"""Each format's layout, read back as its trainer reads it (the trainers' own loaders are
in test_trainers.py): the target's states, before or after the final norm as the format
needs, the metadata each trainer needs, and the bytes a token costs on disk."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.payload.extract.helpers import (
    HIDDEN,
    REPO,
    make_records,
    manifest,
    read_features,
    reference,
    run_extract,
    stats,
    write_jsonl,
)

FORMATS = ("native", "specforge", "speculators")
LAYERS = "1,4,8"  # 8 = N: the last layer, where the formats' conventions differ


@pytest.fixture(scope="module")
def records() -> list:
    return make_records(10, seed=21)


@pytest.fixture(scope="module")
def output_of(tmp_path_factory, model_dir: Path, records):
    """output_of(fmt): the module's records extracted in that format (once per format)."""
    done: dict[str, Path] = {}

    def get(fmt: str) -> Path:
        if fmt not in done:
            d = tmp_path_factory.mktemp(f"fmt-{fmt}")
            inp = write_jsonl(d / "in.jsonl", records)
            assert run_extract(inp, model_dir, d / "out", "--format", fmt, "--layers", LAYERS,
                               "--batch-tokens", "2048") == 0
            done[fmt] = d / "out"
        return done[fmt]

    return get


def test_the_random_norms_make_pre_and_post_norm_differ(hf_model, tokenizer) -> None:
    """Otherwise every test below would pass with the wrong final state."""
    import torch

    ref = reference(hf_model, torch.tensor(tokenizer("the cat is blue")["input_ids"]))
    rms = ref.prenorm * torch.rsqrt(ref.prenorm.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert (rms - ref.postnorm).abs().max() > 0.1  # the norm's weights are not all 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_holds_the_target_states(output_of, fmt: str, records, hf_model) -> None:
    import torch

    out = output_of(fmt)
    feats = read_features(out, fmt)
    assert set(feats) == {str(r["id"]) for r in records}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format"] == fmt and meta["layers"] == [1, 4, 8]
    want_final = "prenorm" if fmt == "speculators" else "postnorm"
    assert meta["final_state"] == want_final
    assert meta["final_normed"] is (want_final == "postnorm")
    by_id = {str(e["id"]): e for e in manifest(out)}
    for key, f in feats.items():
        ref = reference(hf_model, f["input_ids"])
        # aux index N: HF's post-norm entry (native) or the trainers' raw last layer
        last = ref.postnorm if fmt == "native" else ref.prenorm
        want_aux = torch.cat([ref.hidden_states[1], ref.hidden_states[4], last], dim=-1)
        torch.testing.assert_close(f["aux"], want_aux, atol=1e-4, rtol=0)
        final = ref.prenorm if want_final == "prenorm" else ref.postnorm
        torch.testing.assert_close(f["final"], final, atol=1e-4, rtol=0)
        assert int(f["loss_mask"].sum()) == by_id[key]["num_supervised"] > 0
        assert f["input_ids"].dtype == torch.int64
        if fmt != "native":
            assert f["loss_mask"].dtype == torch.int64  # both trainers' contract


def test_specforge_files_and_meta(output_of) -> None:
    import torch

    fmt = "specforge"
    out = output_of(fmt)
    meta = json.loads((out / "meta.json").read_text())
    # SpecForge's layer id i is the output of decoder layer i: HF index k is id k-1
    assert meta["eagle_aux_hidden_state_layer_ids"] == [0, 3, 7]
    for f in read_features(out, fmt).values():
        raw = f["raw"]
        t = raw["input_ids"].shape[0]
        assert set(raw) == {"input_ids", "loss_mask", "aux_hidden_state", "hidden_state"}
        assert raw["aux_hidden_state"].shape == (1, t, 3 * HIDDEN)
        assert raw["hidden_state"].shape == (1, t, HIDDEN)
        assert raw["loss_mask"].shape == (t,) and raw["loss_mask"].dtype == torch.int64
    assert not list(out.rglob("*.safetensors"))


def test_speculators_rows_dataset_and_token_freq(output_of, tokenizer) -> None:
    import torch
    from datasets import load_from_disk

    fmt = "speculators"
    out = output_of(fmt)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["target_layer_ids"] == [1, 4, 8]
    assert meta["target_vocab_size"] == meta["vocab_size"] == len(tokenizer)
    ds = load_from_disk(str(out))
    assert set(ds.column_names) == {"input_ids", "loss_mask", "seq_len"}
    assert ds[0]["loss_mask"].dtype == torch.int64 and ds[0]["input_ids"].dtype == torch.int64
    feats = read_features(out, fmt)  # checks hs_{row} token_ids == row input_ids
    for f in feats.values():
        assert f["raw"]["hidden_states"].shape == (len(f["input_ids"]), 4, HIDDEN)
        assert set(f["raw"]) == {"token_ids", "hidden_states"}
    counts: Counter[int] = Counter()
    for f in feats.values():
        counts.update(f["input_ids"][f["loss_mask"].bool()].tolist())
    assert torch.load(out / "token_freq.pt", weights_only=True) == dict(counts)
    assert not (out / "pending").exists()  # every pending file became a row


def test_final_state_flag(tmp_path: Path, model_dir: Path, hf_model, capsys) -> None:
    """native keeps post-norm unless asked; an override of a trainer's need warns."""
    import torch

    inp = write_jsonl(tmp_path / "in.jsonl", make_records(3))
    assert run_extract(inp, model_dir, tmp_path / "pre", "--final-state", "prenorm") == 0
    meta = json.loads((tmp_path / "pre" / "meta.json").read_text())
    assert (meta["final_state"], meta["final_normed"]) == ("prenorm", False)
    for f in read_features(tmp_path / "pre", "native").values():
        torch.testing.assert_close(f["final"], reference(hf_model, f["input_ids"]).prenorm,
                                   atol=1e-4, rtol=0)
    capsys.readouterr()
    assert run_extract(inp, model_dir, tmp_path / "post", "--format", "speculators",
                       "--final-state", "postnorm") == 0
    assert "WARNING: --final-state postnorm, but the speculators format" in capsys.readouterr().err
    for f in read_features(tmp_path / "post", "speculators").values():
        torch.testing.assert_close(f["final"], reference(hf_model, f["input_ids"]).postnorm,
                                   atol=1e-4, rtol=0)


def test_one_dir_one_format(tmp_path: Path, model_dir: Path, capsys) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", make_records(2))
    out = tmp_path / "out"
    assert run_extract(inp, model_dir, out) == 0
    assert run_extract(inp, model_dir, out, "--format", "specforge") == 2
    err = capsys.readouterr().err
    assert "format: 'native' there, 'specforge' now" in err
    assert "final_state" not in err  # both postnorm
    # a meta.json written before these settings existed meant native, post-norm
    meta = json.loads((out / "meta.json").read_text())
    del meta["format"], meta["final_state"]
    (out / "meta.json").write_text(json.dumps(meta))
    assert run_extract(inp, model_dir, out) == 0
    assert stats(out)["already_done"] == 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_bytes_per_token_within_1_percent(tmp_path: Path, model_dir: Path, tokenizer,
                                         fmt: str) -> None:
    """Long samples, as real ones are: the per-file overhead is then noise."""
    from payload.extract import formats
    from tests.payload.extract.helpers import samples_like

    records = make_records(4, seed=5)
    for i, r in enumerate(records):
        r["response"] = " ".join(["the answer is blue"] * (100 + 10 * i))
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out"
    assert run_extract(inp, model_dir, out, "--format", fmt) == 0
    tokens = sum(e["num_tokens"] for e in manifest(out))
    assert tokens > 1500
    sample_files = [p for p in out.rglob("*") if p.suffix in (".safetensors", ".ckpt")]
    shared = [p for p in out.glob("data-*.arrow")]
    on_disk = sum(p.stat().st_size for p in sample_files + shared)
    fmt_obj = formats.make(fmt, out, HIDDEN, "float32")
    theory = fmt_obj.bytes_per_token()
    assert theory == 4 * HIDDEN * 4 + {"native": 9, "specforge": 16, "speculators": 24}[fmt]
    assert abs(on_disk / tokens / theory - 1) < 0.01, (on_disk / tokens, theory)
    # the preflight never underestimates; for safetensors files it is exact
    from payload.extract.preflight import estimate

    est = estimate(samples_like(manifest(out)), fmt_obj, len(tokenizer), block=1)
    files_only = sum(p.stat().st_size for p in sample_files)
    assert est.bytes >= on_disk
    if fmt != "specforge":
        assert sum(fmt_obj.sample_bytes(s) for s in samples_like(manifest(out))) == files_only
    assert stats(out)["bytes_written"] == files_only


def test_speculators_needs_datasets(tmp_path: Path, model_dir: Path, capsys,
                                    monkeypatch) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", make_records(1))
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails
    assert run_extract(inp, model_dir, tmp_path / "out", "--format", "speculators") == 2
    assert "pip install 'datasets>=4'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_role_passes_format_and_final_state() -> None:
    """roles/extractor.yml hands `format` and `final_state` to the launch and to the
    preflight as optional groups, and extract accepts what it renders."""
    import yaml

    from tests.payload.extract.helpers import extract_args

    role = yaml.safe_load((REPO / "roles" / "extractor.yml").read_text())
    assert role["vars"]["format"] is None and role["vars"]["final_state"] is None
    for argv in (role["launch"], role["preflight"]["run"]):
        assert ["--format", "{format}"] in argv
        assert ["--final-state", "{final_state}"] in argv
    args = extract_args("--input", "i", "--model", "m", "--output-dir", "o",
                        "--format", "speculators", "--final-state", "prenorm")
    assert (args.format, args.final_state) == ("speculators", "prenorm")
