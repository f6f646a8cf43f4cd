"""Resume after kill -9 (in every format), preflight refusal, shard and rank partitions,
meta guard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.payload.extract.helpers import (
    HIDDEN,
    REPO,
    make_records,
    manifest,
    read_features,
    run_extract,
    samples_like,
    stats,
    write_jsonl,
)

FORMATS = ("native", "specforge", "speculators")
# every format, and the smaller forms of the two trainers' (fmt, then its storage flags)
LAYOUTS = [(f,) for f in FORMATS] + [("specforge", "--compress", "gzip"),
                                     ("speculators", "--feature-dtype", "fp8")]


def layout_of(case: tuple[str, ...]) -> tuple[str, str, str | None]:
    """(format, feature dtype, compression) of a LAYOUTS case (the tests' model is fp32)."""
    fp8, gz = "--feature-dtype" in case, "--compress" in case
    return case[0], "float8_e4m3fn" if fp8 else "float32", "gzip" if gz else None


def sample_files(out: Path, fmt: str, compress: str | None = None) -> list[Path]:
    """Complete sample files under their final names (speculators: rows and pending)."""
    suffix = ".safetensors" if fmt != "specforge" else ".ckpt.gz" if compress else ".ckpt"
    return [p for p in out.rglob(f"*{suffix}") if not p.name.startswith(".")]


def spawn(inp: Path, model: Path, out: Path, *extra: str, env: dict | None = None,
          ) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.payload.extract.harness", "--input", str(inp), "--model",
         str(model), "--output-dir", str(out), "--dtype", "float32", "--progress", "plain",
         *extra],
        cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def assert_complete(out: Path, records: list, fmt: str = "native",
                    feature_dtype: str = "float32", compress: str | None = None) -> None:
    """Every id listed exactly once, its file complete; speculators: dense rows that
    match the dataset, nothing pending."""
    from payload.extract import formats

    entries = manifest(out)
    counts = Counter(str(e["id"]) for e in entries)
    assert counts == Counter(str(r["id"]) for r in records)  # every id exactly once
    layout = formats.make(fmt, out, HIDDEN, feature_dtype, compress)
    for e in entries:
        if isinstance(layout, formats.Speculators):
            f = layout.rows.read(out / e["file"])
            assert f is not None and f.key == str(e["id"])
            assert (f.num_tokens, f.num_supervised) == (e["num_tokens"], e["num_supervised"])
        else:
            assert isinstance(layout, formats.Native | formats.SpecForge)
            assert layout.check(out / e["file"]) == (e["num_tokens"], e["num_supervised"])
    assert len(sample_files(out, fmt, compress)) == len(entries)
    if fmt == "speculators":
        read_features(out, fmt)  # the rows are dense and each hs_{row} is its row
        assert not (out / "pending").exists()
    assert not list(out.rglob(".*.tmp-*")), "temp files left behind"


def kill_when_stalled(proc: subprocess.Popen, marker: Path) -> Path:
    """Wait for the harness's stall marker, kill -9 the run; returns what it stalled on."""
    try:
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the extractor never reached the stall"
            time.sleep(0.05)
        stalled = Path(marker.read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    return stalled


@pytest.mark.parametrize("case", LAYOUTS, ids=lambda c: "-".join(c).replace("--", ""))
def test_kill_9_mid_write_then_resume(tmp_path: Path, model_dir: Path,
                                      case: tuple[str, ...]) -> None:
    fmt, feature_dtype, compress = layout_of(case)
    flags = ("--format", *case)
    records = make_records(12, seed=5)
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    out, marker = tmp_path / "out", tmp_path / "stalled"
    # batches of ~1 sample, so samples are written one by one as a long run would
    proc = spawn(inp, model_dir, out, "--batch-tokens", "1", *flags,
                 env={"STALL_AFTER": "5", "STALL_MARKER": str(marker)})
    half = kill_when_stalled(proc, marker)
    assert half.exists() and ".tmp-" in half.name  # the half file sits under a temp name
    final = half.with_name(half.name[1:half.name.index(".tmp-")])
    assert not final.exists()
    assert len(sample_files(out, fmt, compress)) == 5
    # Two writer threads: the one that wrote the marker and, at times, the other one are
    # both stalled half-way when the kill lands, so one or two half files exist.
    halves = [p for p in out.rglob("*") if ".tmp-" in p.name]
    assert half in halves and 1 <= len(halves) <= 2

    assert run_extract(inp, model_dir, out, *flags) == 0
    s = stats(out)
    assert (s["already_done"], s["written"]) == (5, 7)
    assert s["temp_files_removed"] == len(halves)
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]
    assert_complete(out, records, fmt, feature_dtype, compress)
    # a third run finds everything done and still lists each id once
    rows_before = {str(e["id"]): e["file"] for e in manifest(out)}
    assert run_extract(inp, model_dir, out, *flags) == 0
    assert stats(out)["already_done"] == 12 and stats(out)["written"] == 0
    assert_complete(out, records, fmt, feature_dtype, compress)
    assert {str(e["id"]): e["file"] for e in manifest(out)} == rows_before  # stable rows


def test_speculators_kill_9_while_numbering_rows(tmp_path: Path, model_dir: Path) -> None:
    """A finalize cut short (5 of 12 pending files renamed to rows) is completed by the
    next run: it finds all 12 done, and no row is missing or doubled."""
    records = make_records(12, seed=6)
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    out, marker = tmp_path / "out", tmp_path / "stalled"
    proc = spawn(inp, model_dir, out, "--format", "speculators",
                 env={"STALL_ROWS_AFTER": "5", "STALL_MARKER": str(marker)})
    kill_when_stalled(proc, marker)
    assert len(list((out / "hidden_states").iterdir())) == 5
    assert len(list((out / "pending").rglob("*.safetensors"))) == 7
    assert not (out / "manifest.jsonl").exists()  # the manifest comes after the rows
    assert run_extract(inp, model_dir, out, "--format", "speculators") == 0
    assert (stats(out)["already_done"], stats(out)["written"]) == (12, 0)
    assert_complete(out, records, "speculators")


@pytest.mark.parametrize("fmt", ["native", "speculators"])
def test_sigterm_drains_and_exits_3(tmp_path: Path, model_dir: Path, fmt: str) -> None:
    records = make_records(40, seed=11)
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out"
    proc = spawn(inp, model_dir, out, "--batch-tokens", "1", "--format", fmt,
                 env={"WRITE_DELAY": "0.05"})
    try:
        deadline = time.monotonic() + 90
        while len(sample_files(out, fmt)) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, err
    assert "stopped by SIGTERM" in err
    s = stats(out)
    assert s["state"] == "stopped" and 2 <= s["written"] < 40
    # the manifest was merged (speculators: rows numbered) on the way out: it lists
    # exactly the files on disk
    assert len(manifest(out)) == s["written"] == len(sample_files(out, fmt))
    if fmt == "speculators":
        assert len(read_features(out, fmt)) == s["written"]
    assert run_extract(inp, model_dir, out, "--format", fmt) == 0
    assert_complete(out, records, fmt)


def test_sigterm_while_the_model_loads_stops_at_once(tmp_path: Path, model_dir: Path) -> None:
    """A load takes minutes (a vLLM engine start) and torchrun kills its worker 30 s after
    forwarding SIGTERM: the signal during the load stops the run at once (exit 3, state
    stopped), not after the load; the rerun does everything."""
    records = make_records(6, seed=12)
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    out, marker = tmp_path / "out", tmp_path / "loading"
    proc = spawn(inp, model_dir, out, env={"STALL_LOAD": str(marker)})
    try:
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, err
    assert took < 20 and "stopped by SIGTERM while the model loaded" in err, (took, err)
    s = stats(out)
    assert s["state"] == "stopped" and s["written"] == 0, s
    assert run_extract(inp, model_dir, out) == 0
    assert_complete(out, records)


@pytest.mark.parametrize("case", [("native",), ("specforge", "--compress", "gzip")],
                         ids=["native", "specforge-gzip"])
def test_truncated_final_file_is_not_done(tmp_path: Path, model_dir: Path,
                                          case: tuple[str, ...]) -> None:
    """A file cut short under its final name (a machine crash) is redone, never counted;
    a .ckpt.gz also when only its describing tail is lost or its first member is cut."""
    fmt, feature_dtype, compress = layout_of(case)
    records = make_records(3)
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out"
    assert run_extract(inp, model_dir, out, "--format", *case) == 0
    entries = manifest(out)
    victims = [out / e["file"] for e in entries]
    data = [v.read_bytes() for v in victims]
    victims[0].write_bytes(data[0][: len(data[0]) - 100])
    cut = 2
    if compress:  # the archive whole, its tail gone; the archive cut, the tail kept
        from payload.extract.formats.specforge import read_tail

        found = read_tail(victims[1])
        assert found is not None and found[0]["tokens"] == entries[1]["num_tokens"]
        victims[1].write_bytes(data[1][:found[1]])
        victims[2].write_bytes(data[2][:found[1] // 2] + data[2][found[1]:])
        cut = 0
    (out / "manifest.jsonl").unlink()  # and the manifest lost too: rebuilt from the parts
    assert run_extract(inp, model_dir, out, "--format", *case) == 0
    assert (stats(out)["already_done"], stats(out)["written"]) == (cut, 3 - cut)
    assert [v.read_bytes() for v in victims] == data  # the same bytes again
    assert_complete(out, records, fmt, feature_dtype, compress)


def test_torn_manifest_part_line_does_not_swallow_the_next(tmp_path: Path) -> None:
    from payload.extract.writer import ManifestPart, merge_manifest

    for name in ("a", "b"):
        (tmp_path / "samples").mkdir(exist_ok=True)
        (tmp_path / "samples" / name).write_bytes(b"x")
    part = ManifestPart(tmp_path, "r0")
    part.add("a", "samples/a", 3, 1)
    part.close()
    with part.path.open("a") as fh:
        fh.write('{"id": "gone", "fi')  # killed mid-append
    part = ManifestPart(tmp_path, "r0")
    part.add("b", "samples/b", 4, 2)
    part.close()
    assert merge_manifest(tmp_path) == 2
    assert [e["id"] for e in manifest(tmp_path)] == ["a", "b"]


def test_preflight_refuses_with_numbers(tmp_path: Path, model_dir: Path, capsys) -> None:
    import shutil

    from payload.extract.formats import Native
    from payload.extract.preflight import estimate

    records = make_records(8)
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out"
    out.mkdir()
    # leave only 10 KiB usable: the features need far more
    reserve = shutil.disk_usage(out).free - 10 * 1024
    assert run_extract(inp, model_dir, out, "--reserve", str(reserve)) == 2
    err = capsys.readouterr().err
    assert "refusing: need" in err and "--force" in err and "short by" in err
    assert not list(out.rglob("*.safetensors")) and stats(out)["state"] == "refused"
    # --force runs anyway, and the estimate was the exact on-disk size (block-rounded)
    assert run_extract(inp, model_dir, out, "--reserve", str(reserve), "--force") == 0
    files = list(out.rglob("*.safetensors"))
    assert len(files) == 8
    est = estimate(samples_like(manifest(out)), Native(out, HIDDEN, "float32"), block=1)
    assert est.bytes == sum(f.stat().st_size for f in files) == stats(out)["bytes_written"]
    assert stats(out)["estimate_bytes"] >= est.bytes


def test_preflight_only_prints_estimate(tmp_path: Path, model_dir: Path, capsys) -> None:
    import shutil

    inp = write_jsonl(tmp_path / "in.jsonl", make_records(4))
    out = tmp_path / "out"
    # verify runs it with its own flags: it must leave nothing that a later launch trips on
    assert run_extract(inp, model_dir, out, "--preflight-only", "--max-length", "64") == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["fits"] is True and report["samples"] == 4 and report["tokens"] > 0
    assert report["bytes_per_token"] == 4 * HIDDEN * 4 + 9
    assert not out.exists()
    reserve = shutil.disk_usage(tmp_path).free
    assert run_extract(inp, model_dir, out, "--preflight-only", "--reserve", str(reserve)) == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["fits"] is False
    assert run_extract(inp, model_dir, out) == 0  # the launch, with other flags, just runs
    capsys.readouterr()
    assert run_extract(inp, model_dir, out, "--preflight-only") == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (report["samples"], report["already_done"]) == (0, 4)


def test_preflight_check_unit(tmp_path: Path) -> None:
    from payload.extract.preflight import DiskTooSmall, Estimate, check

    est = Estimate(samples=10, tokens=1000, bytes=10_000_000, per_token=10_000)
    assert "free" in check(est, tmp_path, reserve=0, force=False, free=lambda p: 10**8)
    with pytest.raises(DiskTooSmall, match=r"need 80000000 bytes \+ reserve 0 > free"):
        check(est, tmp_path, reserve=0, sharers=8, force=False, free=lambda p: 10**7 * 5)
    assert "--force: running anyway" in check(est, tmp_path, reserve=0, force=True,
                                               free=lambda p: 10)


@pytest.mark.parametrize("fmt", ["native", "speculators"])
def test_shard_union_covers_every_id_once(tmp_path: Path, model_dir: Path,
                                          monkeypatch, fmt: str) -> None:
    records = make_records(15, seed=7)
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out"
    owned = []
    files: dict[str, str] = {}
    for i in range(3):
        assert run_extract(inp, model_dir, out, "--shard", f"{i}/3", "--format", fmt) == 0
        owned.append(stats(out)["owned"])
        now = {str(e["id"]): e["file"] for e in manifest(out)}
        assert {k: now[k] for k in files} == files  # a sample keeps its file (its row)
        files = now
    assert sum(owned) == 15 and all(n > 0 for n in owned)
    assert_complete(out, records, fmt)
    if fmt == "speculators":
        return  # its rows across torchrun ranks: test_concurrent_ranks_merge_one_manifest
    # hosts x torchrun ranks: shard 0/2 and 1/2, each with two ranks, into a fresh dir
    out2 = tmp_path / "out2"
    for shard in ("0/2", "1/2"):
        for r in (0, 1):
            monkeypatch.setenv("RANK", str(r))
            monkeypatch.setenv("LOCAL_RANK", str(r))
            monkeypatch.setenv("WORLD_SIZE", "2")
            monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
            assert run_extract(inp, model_dir, out2, "--shard", shard) == 0
    assert_complete(out2, records)
    parts = sorted(p.name for p in (out2 / "manifest.parts").iterdir())
    assert parts == [f"shard{s}-of-2.rank{r}-of-2.jsonl" for s in (0, 1) for r in (0, 1)]


@pytest.mark.parametrize("fmt", ["native", "speculators"])
def test_concurrent_ranks_merge_one_manifest(tmp_path: Path, model_dir: Path, fmt: str) -> None:
    """Two torchrun-style ranks as real processes at once: no barrier, one clean manifest
    (speculators: one dense set of rows, numbered by whichever rank ends last)."""
    records = make_records(10, seed=9)
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out"
    status = tmp_path / "status.json"
    procs = [spawn(inp, model_dir, out, "--status-file", str(status), "--format", fmt,
                   env={"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                        "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "launch-1"})
             for r in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert_complete(out, records, fmt)
    per_rank = [json.loads((out / f"stats.shard0-of-1.rank{r}-of-2.json").read_text())
                for r in (0, 1)]
    assert sum(s["written"] for s in per_rank) == 10
    # the job status sums both ranks of this launch, in the shape `fab status` reads
    st = json.loads(status.read_text())
    assert (st["state"], st["done"], st["failed"], st["total"], st["ranks"]) == (
        "finished", 10, 0, 10, 2)
    # what a status reader shows as the kind of features
    final = "prenorm" if fmt == "speculators" else "postnorm"
    assert (st["format"], st["final_state"]) == (fmt, final)
    # metrics.jsonl beside the status: both ranks wrote the job's lines, the last says finished
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    entries = manifest(out)
    last = lines[-1]
    assert {x["role"] for x in lines} == {"extractor"} and len({x["run"] for x in lines}) == 1
    assert (last["state"], last["samples"], last["failed"]) == ("finished", 10, 0)
    assert last["tokens"] == sum(e["num_tokens"] for e in entries)
    assert last["supervised_tokens"] == sum(e["num_supervised"] for e in entries)
    assert last["bytes_written"] > 0
    assert sum(x["samples_interval"] for x in lines) == 10


def test_meta_mismatch_refused(tmp_path: Path, model_dir: Path, capsys) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", make_records(2))
    out = tmp_path / "out"
    assert run_extract(inp, model_dir, out) == 0
    assert run_extract(inp, model_dir, out, "--layers", "1,4,8") == 2
    assert "other settings (layers: [2, 4, 5] there, [1, 4, 8] now)" in capsys.readouterr().err


def test_usage_errors_exit_2(tmp_path: Path, model_dir: Path, capsys) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", make_records(1))
    assert run_extract(tmp_path / "missing.jsonl", model_dir, tmp_path / "o") == 2
    assert run_extract(inp, tmp_path, tmp_path / "o") == 2  # no config.json
    assert run_extract(inp, model_dir, tmp_path / "o", "--shard", "3/3") == 2
    assert run_extract(inp, model_dir, tmp_path / "o", "--dtype", "int8") == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "never downloads" in err and "0-based" in err
    import torch

    if not torch.cuda.is_available():
        assert run_extract(inp, model_dir, tmp_path / "o", "--device", "cuda") == 2
        assert "torch sees no CUDA device" in capsys.readouterr().err


def test_import_is_torch_free() -> None:
    code = ("import sys, payload.extract as e; assert callable(e.run) and "
            "callable(e.add_arguments); bad = {'torch', 'transformers', 'safetensors'} & "
            "set(sys.modules); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
