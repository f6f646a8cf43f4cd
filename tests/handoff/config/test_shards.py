"""The shard layout of each job, as this workstation launched it (handoff.config.shards):
recorded per job, every launch kept (a relaunch over other hosts leaves earlier answers in
each host's files), started over by another input, read back or refused when it is not one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handoff.config import shards, state
from payload.records import shard_of


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def test_a_launch_is_recorded_and_read_back(state_dir: Path) -> None:
    launch = shards.new_launch(["a", "b", "c"], sharded=True, input_sha256="s1", prompts=9,
                               per_shard=[3, 3, 3])
    shards.record("B3", launch)
    layout = shards.load("B3")
    assert layout is not None and layout.hosts == ("a", "b", "c") and layout.shards == 3
    assert [layout.spec(h) for h in ("a", "b", "c", "d")] == ["0/3", "1/3", "2/3", None]
    assert layout.prompts == 9 and layout.input_sha256 == "s1"
    path = state_dir / "jobs" / "B3.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert shards.load("other") is None


def test_owner_is_the_payloads_shard_in_any_launch_of_the_job() -> None:
    shards.record("j", shards.new_launch(["a", "b"], sharded=True, input_sha256="s"))
    layout = shards.record("j", shards.new_launch(["a", "b", "c"], sharded=True, input_sha256="s"))
    owns_a, owns_c = layout.owner("a"), layout.owner("c")
    assert owns_a is not None and owns_c is not None
    for key in (f"id-{i}" for i in range(200)):
        assert owns_a(key) == (shard_of(key, 2) == 0 or shard_of(key, 3) == 0)
        assert owns_c(key) == (shard_of(key, 3) == 2)
    never = layout.owner("z")
    assert never is not None and not never("id-1")
    unsharded = shards.record("u", shards.new_launch(["a", "b"], sharded=False, input_sha256="s"))
    assert unsharded.owner("b") is None and unsharded.shards == 1  # every id is each host's


def test_another_input_starts_the_record_over_and_old_launches_are_forgotten() -> None:
    shards.record("j", shards.new_launch(["a"], sharded=True, input_sha256="s1"))
    layout = shards.record("j", shards.new_launch(["a", "b"], sharded=True, input_sha256="s2"))
    assert len(layout.launches) == 1
    again = shards.record("j", shards.new_launch(["a", "b"], sharded=True, input_sha256="s2"))
    assert len(again.launches) == 1  # a resume over the same hosts replaces the launch
    for n in range(shards.MAX_LAUNCHES + 5):
        hosts = ["a", "b"] if n % 2 else ["a", "b", "c"]
        layout = shards.record("j", shards.new_launch(hosts, sharded=True, input_sha256="s2"))
    assert len(layout.launches) == shards.MAX_LAUNCHES


@pytest.mark.parametrize("text", ["not json", "[" * 100_000, json.dumps({"job": "j", "launches": []}),
                                  json.dumps({"job": "j", "launches": [{"hosts": ["a", "a"], "shards": 2}]}),
                                  json.dumps({"job": "j", "launches": [{"hosts": ["a"], "shards": 5}]})])
def test_a_file_that_is_not_a_layout_reads_as_none(state_dir: Path, text: str) -> None:
    (state_dir / "jobs").mkdir(parents=True)
    (state_dir / "jobs" / "j.json").write_text(text)
    assert shards.load("j") is None


def test_the_workstation_id_is_made_once() -> None:
    first = state.workstation_id()
    assert len(first) == 12 and state.workstation_id() == first
