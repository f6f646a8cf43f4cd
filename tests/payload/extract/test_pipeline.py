"""The run's stages on their own: start and select need the model's config and tokenizer,
never its weights; the preflight refuses through payload.errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from payload.errors import ExitCode, UsageError
from tests.payload.extract.helpers import extract_args, make_records, write_jsonl


def args_for(inp: Path, model: Path, out: Path, *extra: str):
    return extract_args("--input", str(inp), "--model", str(model), "--output-dir", str(out),
                        "--dtype", "float32", "--progress", "none", *extra)


def test_start_and_select_count_every_record(tmp_path: Path, model_dir: Path) -> None:
    from payload.extract import pipeline

    recs = make_records(6)
    lines = [*recs, recs[0], "not json", {"id": "empty", "messages": []}]
    recs[3]["response"] = ""  # renders an empty answer: only the end of turn is supervised
    inp = write_jsonl(tmp_path / "in.jsonl", lines)
    run = pipeline.start(args_for(inp, model_dir, tmp_path / "out", "--format", "specforge"))
    assert (run.stats.format, run.stats.final_state) == ("specforge", "postnorm")
    samples = pipeline.select(run, pipeline.load_renderer(run))
    s = run.stats
    assert (s.lines, s.bad_lines, s.duplicates, s.owned) == (9, 2, 1, 6)
    assert [x.key for x in samples] == [str(r["id"]) for r in recs]
    assert all(x.num_supervised > 0 for x in samples)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["format"] == "specforge" and meta["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    pipeline.settle(run)
    assert json.loads(next((tmp_path / "out").glob("stats.*.json")).read_text())["state"] == (
        "starting")


def test_check_disk_refuses_as_a_usage_error(tmp_path: Path, model_dir: Path) -> None:
    from payload.extract import pipeline
    from payload.extract.preflight import DiskTooSmall

    inp = write_jsonl(tmp_path / "in.jsonl", make_records(3))
    run = pipeline.start(args_for(inp, model_dir, tmp_path / "out", "--reserve", "1000T"))
    samples = pipeline.select(run, pipeline.load_renderer(run))
    with pytest.raises(DiskTooSmall, match="refusing: need") as err:
        pipeline.check_disk(run, samples)
    assert isinstance(err.value, UsageError) and err.value.exit_code == ExitCode.USAGE
