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


def test_a_shard_taken_over_moves_in_the_layout(state_dir: Path) -> None:
    """Issue 32 #4: a take-over adds a Move: the taker runs the shard (besides its own), the
    source keeps it among the shards whose records it may hold, the merge order gets the
    taker after the hosts; read back as written; a resume of it replaces it, another cut
    of the hosts does not drop it."""
    first = shards.record("j", shards.new_launch(["a", "b", "c"], sharded=True, input_sha256="s",
                                                 prompts=9, per_shard=[3, 3, 3]))
    moved = shards.Launch(**{**first.now.__dict__, "moves": (
        shards.Move(2, "c", "b", done=1, failed=1, fetched=5.0, spent=0.25),)})
    layout = shards.record("j", moved)
    assert len(layout.launches) == 1 and shards.load("j") == layout  # a take-over of the last
    now = layout.now
    assert [now.runs(h) for h in "abc"] == [(0,), (1, 2), ()]
    assert [now.held(h) for h in "abc"] == [(0,), (1, 2), (2,)]
    assert layout.holders == ("a", "b") and layout.order == ("a", "b", "c")
    assert [layout.spec(h) for h in "abc"] == ["0/3", "1,2/3", None]
    assert [m.shard for m in now.moved_to("b")] == [2] and now.runner(2) == "b"
    owns_b, owns_c = layout.owner("b"), layout.owner("c")
    assert owns_b is not None and owns_c is not None
    for key in (f"id-{i}" for i in range(100)):
        assert owns_b(key) == (shard_of(key, 3) in (1, 2)) and owns_c(key) == (shard_of(key, 3) == 2)
    # to a host not among the launch's: after them in the merge's order
    other = shards.record("k", shards.new_launch(["a", "b"], sharded=True, input_sha256="s"))
    taken = shards.record("k", shards.Launch(**{**other.now.__dict__, "moves": (
        shards.Move(0, "a", "z"),)}))
    assert taken.holders == ("b", "z") and taken.order == ("a", "b", "z") and taken.spec("z") == "0/2"
    bad = json.loads(taken.to_json())
    bad["launches"][0]["moves"][0]["shard"] = 7  # no such shard
    (state_dir / "jobs" / "k.json").write_text(json.dumps(bad))
    assert shards.load("k") is None
