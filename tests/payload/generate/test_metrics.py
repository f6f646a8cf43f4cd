"""The generator's metrics.jsonl (payload/generate/metrics.py) and the records' answered_at,
on a real run against the fake OpenRouter: lines every interval and a final one, counts that
add up to the records, a resumed run appending with its own run id and the reasoning tokens
carried on, a torn last line cut away."""

from __future__ import annotations

import json
import time
from pathlib import Path

from payload.generate.metrics import SAMPLE, Latencies
from tests.payload.helpers import gen_args, read_jsonl, run_payload, write_prompts


def metric_lines(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_run_writes_its_time_series_and_stamps_each_record(fake_factory, key_file, tmp_path):
    # 60 answers of 0.1 s at 4 in flight: about 1.5 s, so more than one 1 s interval
    fake = fake_factory(latency_s=0.1, thinking="field", reasoning_tokens=40)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 60)
    t0 = time.time()
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "4",
                                 "--status-every", "1"))
    assert proc.returncode == 0, proc.stderr
    records = read_jsonl(out)
    assert len(records) == 60
    stamps = [r["answered_at"] for r in records]
    assert all(t0 <= t <= time.time() for t in stamps)
    assert all(list(r)[list(r).index("attempts") + 1] == "answered_at" for r in records)

    lines = metric_lines(tmp_path)
    assert len(lines) >= 2, lines
    assert {x["role"] for x in lines} == {"generator"} and len({x["run"] for x in lines}) == 1
    last = lines[-1]
    assert (last["state"], last["done"], last["failed"], last["in_flight"]) == (
        "finished", 60, 0, 0)
    assert sum(x["answers"] for x in lines) == 60  # each answer in exactly one interval
    assert last["reasoning_tokens"] == sum(
        r["usage"]["completion_tokens_details"]["reasoning_tokens"] for r in records) > 0
    assert last["completion_tokens"] == sum(r["usage"]["completion_tokens"] for r in records)
    assert abs(last["cost"] - sum(r["usage"]["cost"] for r in records)) < 1e-6
    assert last["bytes_written"] == out.stat().st_size
    timed = [x["latency_s"] for x in lines if x["answers"]]
    assert timed and all(0.1 <= q["p50"] <= q["p90"] <= q["p99"] < 5 for q in timed)
    assert [x["t"] for x in lines] == sorted(x["t"] for x in lines)
    assert all(len(json.dumps(x)) < 2048 for x in lines)


def test_a_resumed_run_appends_its_own_lines(fake_factory, key_file, tmp_path):
    fake = fake_factory(thinking="field", reasoning_tokens=30)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 20)
    assert run_payload(*gen_args(fake, key_file, inp, out)).returncode == 0
    first = metric_lines(tmp_path)
    # a kill mid-write left a torn line; then more prompts, and the same command again
    with (tmp_path / "metrics.jsonl").open("ab") as fh:
        fh.write(b'{"t": 1, "role": "gener')
    write_prompts(inp, 30)
    assert run_payload(*gen_args(fake, key_file, inp, out)).returncode == 0
    lines = metric_lines(tmp_path)  # every line parses: the torn one was cut away
    assert lines[:len(first)] == first
    again = lines[len(first):]
    assert again and {x["run"] for x in again}.isdisjoint({x["run"] for x in first})
    assert again[-1]["done"] == 30
    assert again[-1]["reasoning_tokens"] == sum(
        r["usage"]["completion_tokens_details"]["reasoning_tokens"] for r in read_jsonl(out))


def test_latency_quantiles_of_an_interval_from_a_bounded_sample():
    lat = Latencies()
    for i in range(10 * SAMPLE):
        lat.add(i / (10 * SAMPLE))
    count, q = lat.take()
    assert count == 10 * SAMPLE and len(lat.sample) == 0
    assert q is not None and abs(q["p50"] - 0.5) < 0.05 and abs(q["p99"] - 0.99) < 0.02
    assert lat.take() == (0, None)
