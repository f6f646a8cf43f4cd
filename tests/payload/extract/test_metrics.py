"""The extractor's metrics.jsonl writer (payload/extract/metrics.py): one line per interval,
a resumed run appending (its totals carried on), a torn last line cut away, ranks sharing
the file, and a write failure that never stops the extraction."""

from __future__ import annotations

import json
import time
from pathlib import Path

from payload.extract.metrics import Metrics


def status(**kw) -> dict:
    st = {"state": "running", "done": 0, "failed": 0, "tokens_written": 0, "bytes_written": 0,
          "supervised_written": 0, "skipped_overlong": 0, "dropped_unsupervised": 0,
          "skipped_mismatch": 0, "retokenized_mismatch": 0}
    st.update(kw)
    return st


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_one_line_per_interval_and_a_final_one(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    m = Metrics(path, 5.0, time.time() - 2, "launch-1")
    assert m.tick(status(done=3, tokens_written=300, bytes_written=1000, supervised_written=90))
    assert not m.tick(status(done=4))  # the last line is younger than 5 s
    assert m.tick(status(state="finished", done=5, tokens_written=500, bytes_written=2000,
                         supervised_written=150, failed=1, skipped_overlong=2,
                         retokenized_mismatch=3), final=True)
    first, last = lines(path)
    assert first["role"] == "extractor" and first["run"] == last["run"]
    assert first["samples"] == 3 and first["samples_interval"] == 3 and first["interval_s"] >= 2
    assert (last["state"], last["samples"], last["tokens"], last["supervised_tokens"],
            last["bytes_written"], last["failed"], last["dropped"], last["mismatches"]) == (
        "finished", 5, 500, 150, 2000, 1, 2, 3)
    assert (last["samples_interval"], last["tokens_interval"]) == (2, 200)
    assert last["interval_s"] < 5 and last["t"] >= first["t"]
    assert all(len(json.dumps(x)) < 2048 for x in (first, last))


def test_a_resumed_run_appends_and_carries_its_totals(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    Metrics(path, 5.0, time.time(), "pid1").tick(
        status(state="stopped", done=4, tokens_written=400, bytes_written=4000,
               supervised_written=100), final=True)
    # killed mid-write: a torn line with no newline
    with path.open("ab") as fh:
        fh.write(b'{"t": 12, "role": "extr')
    m = Metrics(path, 5.0, time.time() - 1, "pid2")
    # the resumed run: 4 already done, 3 written now (its own tokens and bytes only)
    assert m.tick(status(done=7, tokens_written=300, bytes_written=3000, supervised_written=60))
    got = lines(path)  # every line parses: the torn one was cut away
    assert len(got) == 2 and got[0]["run"] != got[1]["run"]
    now = got[1]
    assert (now["samples"], now["tokens"], now["bytes_written"], now["supervised_tokens"]) == (
        7, 700, 7000, 160)
    assert (now["samples_interval"], now["tokens_interval"]) == (3, 300)
    assert now["interval_s"] < 5  # since this process started, not since the old line


def test_ranks_of_one_launch_share_the_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    ranks = [Metrics(path, 5.0, time.time(), "launch-7") for _ in range(2)]
    assert ranks[0].tick(status(done=2))
    assert not ranks[1].tick(status(done=3))  # the other rank's line is fresh: no second one
    assert ranks[1].tick(status(state="finished", done=4), final=True)  # the last to end
    got = lines(path)
    assert [x["samples"] for x in got] == [2, 4] and got[-1]["state"] == "finished"
    assert len({x["run"] for x in got}) == 1


def test_a_write_failure_is_said_once_and_never_raises(tmp_path: Path, capsys) -> None:
    m = Metrics(tmp_path / "missing" / "metrics.jsonl", 5.0, time.time(), "x")
    assert not m.tick(status(done=1))
    assert not m.tick(status(done=2), final=True)
    err = capsys.readouterr().err
    assert err.count("metrics: cannot write") == 1 and "goes on" in err
