"""The trainers' OWN data-loading code reads the extractor's output and reproduces the
target model's logits (fp32, within 1e-4), for features extracted batched and alone.

SpecForge 0.2.0: its offline reader (`data.hidden_states_path=OUT`), feature store,
loader, EAGLE-3 normalizer and collator, then its TargetHead (the target's lm_head)
through the step strategy's own target preparation.

speculators 0.9.0: the `speculators train` flags (`--data-path OUT --target-layer-ids
... --on-missing raise`) resolved by its own config, its vocab map built from our
token_freq.pt, its draft model with the verifier's norm and lm_head loaded from the
target, `create_train_val_loaders` with its file transfer, and the draft's forward
pass: the teacher logits are what its `verifier_lm_head` computes there.

The target's norm weights are random (see conftest.build_model), so a final state taken
on the wrong side of the norm shows: each trainer's check is also run on output with
the other final state, and must fail. The trainers are test-only dependencies
(scripts/bootstrap installs them with --no-deps); without them these tests skip.
"""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.payload.extract.helpers import (
    REPO,
    make_records,
    manifest,
    read_features,
    reference,
    run_extract,
    write_jsonl,
)

TOL = 1e-4
BATCHED, ALONE = "4096", "1"  # --batch-tokens: padded batches, or one sample a pass
DRAFT_VOCAB = 32  # < the target's vocab: the trainer's vocab map comes from token_freq.pt


def needs(*modules: str) -> None:
    for m in modules:
        pytest.importorskip(m, reason=f"trainer package {m!r} is not installed (test-only: "
                                      "scripts/bootstrap installs it)")


@pytest.fixture(scope="module")
def extracted(tmp_path_factory, model_dir: Path):
    """extracted(fmt, batch_tokens, *flags): one output dir per combination, made once."""
    records = make_records(12, seed=31)
    made: dict[tuple[str, ...], Path] = {}

    def get(fmt: str, batch_tokens: str, *flags: str) -> Path:
        key = (fmt, batch_tokens, *flags)
        if key not in made:
            d = tmp_path_factory.mktemp(f"{fmt}-{batch_tokens}")
            inp = write_jsonl(d / "in.jsonl", records)
            assert run_extract(inp, model_dir, d / "out", "--format", fmt,
                               "--batch-tokens", batch_tokens, *flags) == 0
            made[key] = d / "out"
        return made[key]

    return get


# -- SpecForge -----------------------------------------------------------------------
def specforge_error(out: Path, model_dir: Path, hf_model: Any, batch_size: int) -> float:
    """Max |teacher logit - target logit| over every supervised-or-not position SpecForge
    trains on; also checks its loader sees every sample with our ids and mask."""
    import torch
    from specforge.algorithms.eagle3.providers import create_registration
    from specforge.modeling.target.target_head import TargetHead
    from specforge.runtime.data_plane.feature_dataloader import FeatureDataLoader
    from specforge.runtime.data_plane.feature_store import LocalFeatureStore
    from specforge.training.strategies.base import _prepare_eagle_target

    provider = create_registration().providers.offline_for("text")
    max_len = 4096
    refs = provider.build_reader(str(out), run_id="t", ttt_length=7, max_len=max_len).read()
    assert len(refs) == len(manifest(out))
    loader = FeatureDataLoader(
        LocalFeatureStore("t"), refs=refs, batch_size=batch_size, drop_last=False,
        collate_fn=provider.build_collator(), strategy="eagle3",
        per_sample_transform=provider.build_normalizer(max_len, ttt_length=7,
                                                       use_usp_preprocess=False))
    # TargetHead.from_pretrained would cast to bf16; the same head, kept in fp32
    head = TargetHead(str(model_dir))
    head.load_weights(model_path=str(model_dir))
    head.freeze_weights()
    head.eval()
    ours = {tuple(f["input_ids"].tolist()): f for f in read_features(out, "specforge").values()}
    worst, seen = 0.0, 0
    for batch in loader:
        t = batch.tensors
        with torch.no_grad():
            _, logits, _ = _prepare_eagle_target(
                target_head=head, target_repr=batch.metadata["target_repr"],
                input_ids=t["input_ids"], target=t["target"], loss_mask=t["loss_mask"],
                device=torch.device("cpu"))
        for b in range(t["input_ids"].shape[0]):
            n = int(t["attention_mask"][b].sum())
            ids = t["input_ids"][b, :n]
            mine = ours[tuple(ids.tolist())]
            want_mask = mine["loss_mask"].clone()
            want_mask[-1] = 0  # SpecForge's normalizer never supervises the last position
            assert torch.equal(t["loss_mask"][b, :n], want_mask)
            ref = reference(hf_model, ids).logits
            # the target head shifts: position p predicts what the target saw at p+1
            worst = max(worst, float((logits[b, :n - 1] - ref[1:n]).abs().max()))
            seen += 1
    assert seen == len(ours)
    return worst


@pytest.mark.parametrize("batch_tokens, batch_size", [(BATCHED, 4), (ALONE, 1)])
def test_specforge_reproduces_the_target_logits(extracted, model_dir, hf_model,
                                                batch_tokens: str, batch_size: int) -> None:
    needs("specforge")
    out = extracted("specforge", batch_tokens)
    assert specforge_error(out, model_dir, hf_model, batch_size) < TOL


def test_specforge_check_fails_on_a_prenorm_final_state(extracted, model_dir, hf_model,
                                                        ) -> None:
    needs("specforge")
    out = extracted("specforge", BATCHED, "--final-state", "prenorm")
    assert specforge_error(out, model_dir, hf_model, 4) > 100 * TOL


def doc_command(trainer: str, having: str | None = None) -> list[str]:
    """The first `<trainer> train ...` command of docs/training.md (the first with
    `having` in it, if given), as argv after `train`."""
    text = (REPO / "docs" / "training.md").read_text()
    joined = text.replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if ln.startswith(f"{trainer} train ")
                and (having is None or having in ln))
    argv = shlex.split(line.replace("[", "").replace("]", ""))[2:]
    return argv


def test_specforge_run_config_from_the_docs(extracted, model_dir, tmp_path) -> None:
    """docs/training.md's run.yaml and command, with this output's paths and ids, pass
    SpecForge's own config validation as an offline run over OUT, and the capture layers
    SpecForge resolves from it are meta.json's (its default for this target, too)."""
    needs("specforge")
    import yaml
    from specforge.algorithms.model_providers import resolve_eagle_capture_layers
    from specforge.config import load_config

    out = extracted("specforge", BATCHED)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["layers"] == [2, 4, 5]
    ids = meta["eagle_aux_hidden_state_layer_ids"]
    assert ids == [1, 3, 4]
    text = (REPO / "docs" / "training.md").read_text()
    run = yaml.safe_load(text.split("with `run.yaml`:\n```yaml\n", 1)[1].split("```", 1)[0])
    run["model"].update(target_model_path=str(model_dir), aux_hidden_state_layer_ids=ids)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    argv = doc_command("specforge")
    assert argv[:2] == ["--config", "run.yaml"]
    overrides = [a.replace("/data/features", str(out)) for a in argv[2:]]
    config = load_config(str(tmp_path / "run.yaml"), overrides)
    assert config.mode == "offline" and config.data.hidden_states_path == str(out)
    target = argparse.Namespace(num_hidden_layers=meta["num_layers"])
    assert resolve_eagle_capture_layers(config, {}, target) == ids
    default = config.model_copy(deep=True)
    default.model.aux_hidden_state_layer_ids = None
    assert resolve_eagle_capture_layers(default, {}, target) == ids


# -- speculators ---------------------------------------------------------------------
def speculators_error(out: Path, model_dir: Path, hf_model: Any, save: Path) -> float:
    """Max |teacher logit - target logit| over every position its loaders deliver
    (train and val splits), on the draft vocabulary its vocab map selects."""
    return max(float((r.teacher - r.ref).abs().max())
               for r in speculators_rows(out, model_dir, hf_model, save))


@dataclass
class LoadedRow:
    """One row as speculators' loader hands it to the draft, and the target's own view."""

    teacher: Any  # [T-1, draft vocab]: its verifier_lm_head's logits
    ref: Any  # the target's logits there
    aux: Any  # [T-1, 3H]: the draft's input (the batch's `hidden_states`)
    ref_aux: Any  # the target's states at target_layer_ids there


def speculators_rows(out: Path, model_dir: Path, hf_model: Any, save: Path,
                     having: str | None = None, draft_vocab: int = DRAFT_VOCAB,
                     ) -> list[LoadedRow]:
    """Every row its loaders deliver (train and val splits), teacher logits on the draft
    vocabulary its vocab map selects (`draft_vocab` ids); the trainer's flags are
    docs/training.md's first `speculators train` command (with `having` in it)."""
    import torch
    from hs_connectors.transfer import HiddenStatesBackend
    from speculators.model import SpeculatorModel
    from speculators.models.eagle3.data import shift_batch
    from speculators.train import cli as train_cli
    from speculators.train.config import TrainConfig
    from speculators.train.dataloader import create_train_val_loaders

    meta = json.loads((out / "meta.json").read_text())
    # docs/training.md's command with this output's paths and ids, plus what a CPU needs
    argv = doc_command("speculators", having)
    at = argv.index("--target-layer-ids") + 1
    argv[at:at + 3] = map(str, meta["target_layer_ids"])
    subst = {"/models/target": str(model_dir), "/data/features": str(out),
             "./draft": str(save), "32000": str(draft_vocab)}
    argv = [subst.get(a, a) for a in argv]
    assert argv[argv.index("--on-missing") + 1] == "raise"
    argv += ["--hidden-states-dtype", "float32", "--num-workers", "0", "--total-seq-len", "256",
             "--loss-implementation", "eager", "--draft-attn-impl", "eager"]
    args = argparse.Namespace(**TrainConfig.resolve(argv).flatten())
    assert (args.data_path, args.verifier_name_or_path) == (str(out), str(model_dir))
    d2t, t2d, draft_vocab = train_cli.parse_vocab_mappings(args)
    model_class = SpeculatorModel.registry[args.speculator_type]
    draft = train_cli.build_draft_model(args, model_class, t2d, d2t, draft_vocab).eval()
    assert draft.target_layer_ids == meta["target_layer_ids"]
    # its vocab map is our token_freq.pt's most frequent ids
    freq = torch.load(out / "token_freq.pt", weights_only=True)
    top = sorted(freq, key=lambda i: (-freq[i], i))[:draft_vocab]
    picked = t2d.nonzero().flatten().tolist()
    # the most frequent ids; a draft vocab larger than the ids seen takes them all, then more
    assert sorted(picked) == sorted(top) if draft_vocab < len(freq) else set(top) <= set(picked)
    transfer = HiddenStatesBackend.registry[args.hidden_states_backend].from_train_args(
        args, args.data_path)
    loaders = create_train_val_loaders(
        data_path=args.data_path, total_seq_len=args.total_seq_len,
        hidden_states_dtype=getattr(torch, args.hidden_states_dtype), transfer=transfer,
        vllm_endpoint=args.vllm_endpoint, on_missing=args.on_missing,
        verifier_name_or_path=args.verifier_name_or_path,
        request_timeout=args.request_timeout, max_retries=args.max_retries,
        generation_validation_retries=args.generation_validation_retries,
        max_consecutive_generation_failures=args.max_consecutive_generation_failures,
        hidden_size=draft.config.transformer_layer_config.hidden_size,
        num_target_layers=len(draft.target_layer_ids), num_workers=args.num_workers,
        prefetch_factor=args.prefetch_factor, preprocess=shift_batch,
        train_data_ratio=args.train_data_ratio, seed=args.seed)
    _, call_kwargs = model_class.get_trainer_kwargs(**vars(args))
    captured: dict[str, Any] = {}
    draft.verifier_lm_head.register_forward_hook(
        lambda _m, _i, out_: captured.__setitem__("teacher", out_))
    full = {tuple(f["input_ids"][1:].tolist()): f["input_ids"]
            for f in read_features(out, "speculators").values()}
    rows: list[LoadedRow] = []
    layers, n = meta["target_layer_ids"], meta["num_layers"]
    keys = ("hidden_states", "input_ids", "document_ids", "loss_mask", "position_ids",
            "verifier_last_hidden_states")
    for loader in loaders:
        for batch in loader:
            assert batch["error_records"] == 0
            with torch.no_grad():
                draft(**{k: batch[k] for k in keys}, **call_kwargs)
            teacher = captured["teacher"][0]
            docs = batch["document_ids"][0]
            for d in docs.unique().tolist():
                if d < 0:
                    continue  # padding
                at = (docs == d).nonzero().flatten()
                ids = full[tuple(batch["input_ids"][0, at].tolist())]
                target = reference(hf_model, ids)
                # shift_batch: logits of positions 1.., states of positions ..T-1
                ref_aux = torch.cat([target.prenorm if k == n else target.hidden_states[k]
                                     for k in layers], dim=-1)[:-1]
                rows.append(LoadedRow(teacher[at], target.logits[1:][:, t2d],
                                      batch["hidden_states"][0, at], ref_aux))
    assert len(rows) == len(full)  # every row, once, across the train and val splits
    return rows


@pytest.mark.parametrize("batch_tokens", [BATCHED, ALONE])
def test_speculators_reproduces_the_target_logits(extracted, model_dir, hf_model, tmp_path,
                                                  batch_tokens: str) -> None:
    needs("speculators", "hs_connectors")
    out = extracted("speculators", batch_tokens)
    assert speculators_error(out, model_dir, hf_model, tmp_path) < TOL


def test_speculators_check_fails_on_a_postnorm_final_state(extracted, model_dir, hf_model,
                                                           tmp_path) -> None:
    """The bug the issue found: post-norm states loaded as they are give wrong teachers."""
    needs("speculators", "hs_connectors")
    out = extracted("speculators", BATCHED, "--final-state", "postnorm")
    assert speculators_error(out, model_dir, hf_model, tmp_path) > 100 * TOL


# -- the smaller forms: FP8 (speculators) and gzip (SpecForge) ------------------------
# FP8 keeps 3 mantissa bits: each stored value within 1/16 of itself, the dequantized
# bf16 within 1/256 more. Through the target's norm and lm_head that came to at most
# ~1.4% of the largest |logit| on the peaked model (max |error| 0.085 of logits up to
# ~6.8; measured with this loader): the tolerance below is 3%, and top-1 must agree on
# >= 99% of positions (measured 100%; the flat-headed fixture keeps ~96% even so, see
# helpers.build_model).
FP8_REL_TOL = 0.03
FP8_TOP1 = 0.99
# the draft's input: each value within 1/16 + 1/256 (bf16) of its token's largest
FP8_AUX_TOL = 1 / 16 + 1 / 256


def aux_error(rows: list[LoadedRow]) -> float:
    """Max over tokens of max |loaded - target| / max |target| (the FP8 scale's unit)."""
    return max(float(((r.aux - r.ref_aux).abs().amax(-1) / r.ref_aux.abs().amax(-1)).max())
               for r in rows)


def test_speculators_fp8_reproduces_the_target_within_fp8_tolerance(
        tmp_path_factory, peaked_model_dir, peaked_hf_model, tmp_path) -> None:
    """`--feature-dtype fp8` read by speculators' own loader with its FP8 backend
    (docs/training.md's `--hidden-states-backend fp8` command: FP8Transfer dequantizes to
    bf16): the teacher logits within the FP8 tolerance of the target's, the same top-1 on
    >= 99% of positions, at about half the disk of bf16 features of the same samples."""
    needs("speculators", "hs_connectors")
    import torch

    d = tmp_path_factory.mktemp("fp8")
    inp = write_jsonl(d / "in.jsonl", make_records(12, seed=31))
    outs = {}
    for fd in ("bf16", "fp8"):
        outs[fd] = d / fd
        assert run_extract(inp, peaked_model_dir, outs[fd], "--format", "speculators",
                           "--feature-dtype", fd, "--batch-tokens", BATCHED) == 0
    meta = json.loads((outs["fp8"] / "meta.json").read_text())
    assert (meta["feature_dtype"], meta["dtype"]) == ("float8_e4m3fn", "float32")
    assert meta["hidden_states_backend"] == "fp8"
    vocab = peaked_hf_model.config.vocab_size  # the whole vocabulary: every logit compared
    rows = speculators_rows(outs["fp8"], peaked_model_dir, peaked_hf_model, tmp_path,
                            having="--hidden-states-backend fp8", draft_vocab=vocab)
    worst = max(float((r.teacher - r.ref).abs().max() / r.ref.abs().max()) for r in rows)
    agree = sum(int((r.teacher.argmax(-1) == r.ref.argmax(-1)).sum()) for r in rows)
    positions = sum(len(r.ref) for r in rows)
    print(f"fp8 through speculators' loader: max |error| / max |logit| {worst:.4f}, top-1 "
          f"{agree}/{positions}, draft input {aux_error(rows):.4f}")
    assert worst < FP8_REL_TOL, worst
    assert agree / positions >= FP8_TOP1, (agree, positions)
    assert aux_error(rows) < FP8_AUX_TOL
    # The scales matter, though not to the teacher (the target's RMSNorm is blind to a
    # per-token scale): the plain file backend hands the draft the raw FP8 values.
    raw = speculators_rows(outs["fp8"], peaked_model_dir, peaked_hf_model, tmp_path / "raw",
                           draft_vocab=vocab)
    assert aux_error(raw) > 10

    def disk(out: Path) -> int:
        return sum(p.stat().st_size for p in [*(out / "hidden_states").iterdir(),
                                              *out.glob("data-*.arrow")])

    tokens = sum(e["num_tokens"] for e in manifest(outs["fp8"]))
    assert tokens == sum(e["num_tokens"] for e in manifest(outs["bf16"]))
    ratio = disk(outs["fp8"]) / disk(outs["bf16"])
    # H=64 here: (4H + 4 + 24) / (4*2H + 24) = 0.53 a token (0.5003 at Kimi's H=7168)
    assert 0.5 < ratio < 0.56, ratio
    assert torch.float8_e4m3fn == read_features(outs["fp8"], "speculators")[
        str(manifest(outs["fp8"])[0]["id"])]["raw"]["hidden_states"].dtype


@pytest.mark.parametrize("batch_tokens, batch_size", [(BATCHED, 4)])
def test_specforge_reads_gzip_features(extracted, model_dir, hf_model, batch_tokens: str,
                                       batch_size: int) -> None:
    """`--compress gzip`: SpecForge's own reader finds the .ckpt.gz files and its feature
    store opens them; the logits are the target's, as from .ckpt files."""
    needs("specforge")
    out = extracted("specforge", batch_tokens, "--compress", "gzip")
    assert list(out.rglob("*.ckpt.gz")) and not list(out.rglob("*.ckpt"))
    assert specforge_error(out, model_dir, hf_model, batch_size) < TOL
