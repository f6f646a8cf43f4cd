"""The smaller feature forms: `--feature-dtype fp8` (speculators: hs-connectors' FP8
layout, bit for bit) and `--compress gzip` (SpecForge's .ckpt.gz), their sizes, the
preflight, the settings guard and the combinations refused. The trainers' own loaders
read them in test_trainers.py; kill -9 and resume in test_resume.py."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
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
    samples_like,
    stats,
    write_jsonl,
)

FP8 = "float8_e4m3fn"


@pytest.fixture(scope="module")
def inp(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("smaller-in")
    records = make_records(6, seed=8)
    for i, r in enumerate(records):  # long samples: the per-file overhead is then noise
        r["response"] = " ".join(["the answer is blue"] * (60 + 10 * i))
    return write_jsonl(d / "in.jsonl", records)


@pytest.fixture(scope="module")
def out_of(tmp_path_factory, model_dir: Path, inp: Path):
    """out_of(fmt, *flags): the module's input extracted that way (once)."""
    made: dict[tuple[str, ...], Path] = {}

    def get(fmt: str, *flags: str) -> Path:
        key = (fmt, *flags)
        if key not in made:
            out = tmp_path_factory.mktemp("smaller") / "out"
            assert run_extract(inp, model_dir, out, "--format", fmt, *flags) == 0
            made[key] = out
        return made[key]

    return get


# -- FP8 -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_fp8_bytes_are_hs_connectors_bytes(dtype: str) -> None:
    """quantize(aux, final) is hs-connectors' quantize_tensor_to_fp8 of the [T, 4, H]
    speculators row, bit for bit: values, scales, an all-zero token, huge and tiny ones."""
    pytest.importorskip("hs_connectors", reason="test-only: scripts/bootstrap installs it")
    import torch
    from hs_connectors.fp8_utils import quantize_tensor_to_fp8

    from payload.extract.feature_dtype import quantize

    torch.manual_seed(3)
    dt = getattr(torch, dtype)
    b, t, h = 3, 7, 32
    aux = (torch.randn(b, t, 3 * h) * torch.logspace(-3, 3, t)[None, :, None]).to(dt)
    final = torch.randn(b, t, h).to(dt)
    aux[0, 2], final[0, 2] = 0, 0  # a token of zeros: the clamp keeps its scale usable
    final[1, 4, 5] = torch.finfo(dt).max / 2
    q_aux, q_final, scale = quantize(aux, final)
    assert q_aux.dtype == q_final.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    for i in range(b):
        row = torch.cat([aux[i], final[i]], dim=-1).view(t, 4, h)
        want, want_scale = quantize_tensor_to_fp8(row)
        mine = torch.cat([q_aux[i], q_final[i]], dim=-1).view(t, 4, h)
        assert torch.equal(mine.view(torch.uint8), want.view(torch.uint8))
        assert torch.equal(scale[i].view(t, 1, 1), want_scale)


def test_fp8_rows_are_the_hs_connectors_layout(out_of, hf_model) -> None:
    """The row file: exactly `token_ids`, `hidden_states` F8_E4M3 [T,4,H] and
    `hidden_states_scales` F32 [T,1,1]; dequantized, the target's states within FP8's
    rounding (1/16 of the token's largest value); meta.json says how to train on it."""
    import torch

    from payload.extract.writer import read_header

    out = out_of("speculators", "--feature-dtype", "fp8")
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["dtype"], meta["feature_dtype"], meta["compress"]) == ("float32", FP8, None)
    assert meta["hidden_states_backend"] == "fp8" and "hidden_states_scales" in meta["keys"]
    for key, f in read_features(out, "speculators").items():
        header, _ = read_header(out / f["file"])
        t = len(f["input_ids"])
        assert {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"} \
            == {"token_ids": ("I64", [t]), "hidden_states": ("F8_E4M3", [t, 4, HIDDEN]),
                "hidden_states_scales": ("F32", [t, 1, 1])}
        ref = reference(hf_model, f["input_ids"])
        n = len(ref.hidden_states) - 1
        want = torch.stack([ref.prenorm if k == n else ref.hidden_states[k]
                            for k in meta["layers"]] + [ref.prenorm], dim=1)  # [T, 4, H]
        got = torch.cat([f["aux"].view(t, 3, HIDDEN), f["final"][:, None]], dim=1)
        per_token = (got - want).abs().amax((1, 2)) / want.abs().amax((1, 2))
        assert float(per_token.max()) <= 1 / 16, key


def test_fp8_halves_the_disk_and_the_preflight_counts_it_exactly(out_of, tokenizer, inp: Path,
                                                                  model_dir: Path, tmp_path: Path,
                                                                  capsys) -> None:
    """~1/2 the bytes of bf16 features a token (0.53 at H=64, 0.5003 at Kimi's H=7168);
    the preflight's file sizes are exact, and --preflight-only reports the fp8 figure."""
    from payload.extract import formats
    from payload.extract.preflight import estimate

    sizes = {}
    for fd in ("bf16", "fp8"):
        out = out_of("speculators", "--feature-dtype", fd)
        files = list((out / "hidden_states").iterdir())
        tokens = sum(e["num_tokens"] for e in manifest(out))
        on_disk = sum(p.stat().st_size for p in [*files, *out.glob("data-*.arrow")])
        layout = formats.make("speculators", out, HIDDEN, {"bf16": "bfloat16", "fp8": FP8}[fd])
        theory = layout.bytes_per_token()
        assert theory == 4 * HIDDEN * (2 if fd == "bf16" else 1) + (4 if fd == "fp8" else 0) + 24
        assert abs(on_disk / tokens / theory - 1) < 0.01, (fd, on_disk / tokens, theory)
        samples = samples_like(manifest(out))
        assert sum(layout.sample_bytes(s) for s in samples) == \
            sum(p.stat().st_size for p in files) == stats(out)["bytes_written"]
        assert estimate(samples, layout, len(tokenizer), block=1).bytes >= on_disk
        sizes[fd] = on_disk / tokens
    assert 0.5 < sizes["fp8"] / sizes["bf16"] < 0.55
    kimi = {fd: formats.make("speculators", Path("x"), 7168, dt).bytes_per_token()
            for fd, dt in (("bf16", "bfloat16"), ("fp8", FP8))}
    assert kimi == {"bf16": 57368, "fp8": 28700}  # the figures docs/training.md quotes

    capsys.readouterr()
    fresh = tmp_path / "preflight-out"
    assert run_extract(inp, model_dir, fresh, "--preflight-only", "--format", "speculators",
                       "--feature-dtype", "fp8") == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (report["feature_dtype"], report["bytes_per_token"]) == (FP8, 4 * HIDDEN + 28)
    assert not fresh.exists()


# -- gzip ----------------------------------------------------------------------------
def test_gzip_holds_the_same_archive_as_ckpt(out_of, tokenizer) -> None:
    """Each .ckpt.gz is a gzip stream (any gzip reader, SpecForge's `gzip.open`, gzip -t)
    of the same torch.save archive, tensors equal to the .ckpt's bit for bit; the
    preflight's bound holds; the ratio measured here is printed (fp32 features: tests)."""
    import torch

    from payload.extract import formats
    from payload.extract.formats.specforge import read_tail
    from payload.extract.preflight import estimate

    plain, gz = out_of("specforge"), out_of("specforge", "--compress", "gzip")
    assert json.loads((gz / "meta.json").read_text())["compress"] == "gzip"
    a, b = read_features(plain, "specforge"), read_features(gz, "specforge")
    assert set(a) == set(b)
    for key in a:
        assert b[key]["file"].endswith(".ckpt.gz") and a[key]["file"] + ".gz" == b[key]["file"]
        for name, tensor in a[key]["raw"].items():
            assert torch.equal(tensor, b[key]["raw"][name]), (key, name)
    files = sorted(gz.rglob("*.ckpt.gz"))
    subprocess.run(["gzip", "-t", *map(str, files)], check=True)
    for p in files:
        info, start = read_tail(p)
        with gzip.open(p, "rb") as fh:
            data = fh.read()
        assert info["isize"] == len(data) and info["csize"] == start
        torch.load(io.BytesIO(data), weights_only=True)  # SpecForge's load_feature_file
    gz_bytes = sum(p.stat().st_size for p in files)
    raw_bytes = sum(p.stat().st_size for p in plain.rglob("*.ckpt"))
    print(f"gzip on fp32 tiny-model features: {gz_bytes / raw_bytes:.3f} of .ckpt")
    assert gz_bytes < raw_bytes and stats(gz)["bytes_written"] == gz_bytes
    layout = formats.make("specforge", gz, HIDDEN, "float32", "gzip")
    samples = samples_like(manifest(gz))
    assert estimate(samples, layout, len(tokenizer), block=1).bytes >= raw_bytes


# -- what is refused -----------------------------------------------------------------
@pytest.mark.parametrize(("flags", "says"), [
    (("--feature-dtype", "fp8"), "add --format speculators"),
    (("--feature-dtype", "fp8", "--format", "specforge"), "add --format speculators"),
    (("--compress", "gzip"), "add --format specforge"),
    (("--compress", "gzip", "--format", "speculators"), "use --feature-dtype fp8"),
    (("--feature-dtype", "int4"), "--feature-dtype must be one of bf16, fp16, fp32, fp8"),
])
def test_a_form_its_trainer_does_not_read_is_a_usage_error(tmp_path: Path, model_dir: Path,
                                                           inp: Path, capsys, flags,
                                                           says: str) -> None:
    assert run_extract(inp, model_dir, tmp_path / "out", *flags) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_the_payload_cli_refuses_it_with_exit_2(tmp_path: Path, model_dir: Path,
                                                inp: Path) -> None:
    """The same through `python -m payload extract`: exit 2, naming the fix."""
    import sys

    proc = subprocess.run([sys.executable, "-m", "payload", "extract", "--input", str(inp),
                           "--model", str(model_dir), "--output-dir", str(tmp_path / "o"),
                           "--compress", "gzip"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "add --format specforge" in proc.stderr, proc.stderr


def test_the_feature_dtype_is_a_setting_of_the_output_dir(tmp_path: Path, model_dir: Path,
                                                          inp: Path, capsys) -> None:
    """A resumed run must store what the dir holds; a meta.json from before
    --feature-dtype meant features in the model's dtype (and no compression)."""
    out = tmp_path / "out"
    assert run_extract(inp, model_dir, out, "--format", "specforge") == 0
    assert run_extract(inp, model_dir, out, "--format", "specforge", "--feature-dtype",
                       "bf16") == 2
    assert "feature_dtype: 'float32' there, 'bfloat16' now" in capsys.readouterr().err
    assert run_extract(inp, model_dir, out, "--format", "specforge", "--compress", "gzip") == 2
    assert "compress: None there, 'gzip' now" in capsys.readouterr().err
    meta = json.loads((out / "meta.json").read_text())
    for k in ("feature_dtype", "compress"):
        del meta[k]
    (out / "meta.json").write_text(json.dumps(meta))
    assert run_extract(inp, model_dir, out, "--format", "specforge", "--feature-dtype",
                       "fp32") == 0
    assert stats(out)["already_done"] == 6
    assert run_extract(inp, model_dir, out, "--format", "specforge", "--feature-dtype",
                       "fp16") == 2


def test_role_passes_feature_dtype_and_compress() -> None:
    """roles/extractor.yml hands `feature_dtype` and `compress` to the launch and to the
    preflight (so `fab verify` counts the bytes the launch will write)."""
    import yaml

    role = yaml.safe_load((REPO / "roles" / "extractor.yml").read_text())
    assert role["vars"]["feature_dtype"] is None and role["vars"]["compress"] is None
    for argv in (role["launch"], role["preflight"]["run"]):
        assert ["--feature-dtype", "{feature_dtype}"] in argv
        assert ["--compress", "{compress}"] in argv


def test_default_layers_of_a_6_layer_model_name_the_flag() -> None:
    """2,N//2,N-3 is 2,3,3 at N=6: the refusal names --layers, not a duplicate the user
    never typed (it said "--layers must be three distinct indices, got (2, 3, 3)")."""
    from payload.errors import UsageError
    from payload.extract.config import resolve_layers

    assert resolve_layers(None, 7) == (2, 3, 4)
    with pytest.raises(UsageError, match="need at least 7; pass --layers"):
        resolve_layers(None, 6)
    assert resolve_layers((1, 3, 6), 6) == (1, 3, 6)
