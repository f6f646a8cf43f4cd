"""Where a host's shard comes from on a launch, and shards that move
(handoff.ops.jobs.moves, issue 32 #4): a relaunch over the hosts that run the job gets each
its own shard(s) again, in any order; one over others is cut anew; a take-over sends the
taker only the ids of the moved shard the dead host's fetched copy lacks, never an id of
another shard the copy may claim; the refusal names the way out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handoff.config import shards
from handoff.errors import UsageError
from handoff.ops.jobs import moves
from payload.records import shard_of
from tests.support.workstation import Workstation


@pytest.fixture
def layout(ws: Workstation) -> shards.ShardLayout:
    return shards.record("J", shards.new_launch(["a", "b", "c"], sharded=True, input_sha256="s",
                                                prompts=60, per_shard=[20, 20, 20]))


def copy(dest: Path, host: str, answers: list[str], failures: list[str] = (),  # type: ignore[assignment]
         cost: float = 0.02) -> Path:
    folder = dest / host / "J"
    folder.mkdir(parents=True)
    (folder / "output.jsonl").write_text("".join(json.dumps({"id": i, "response": "x"}) + "\n"
                                                 for i in answers) + '{"id": "torn-lin')
    (folder / "output.errors.jsonl").write_text("".join(json.dumps({"id": i, "error": {}}) + "\n"
                                                        for i in failures))
    (folder / "status.json").write_text(json.dumps({"state": "running", "cost": cost}))
    return folder


def test_a_relaunch_over_the_same_hosts_keeps_each_hosts_shard(layout: shards.ShardLayout) -> None:
    again = moves.placement("J", ["c", "a", "b"], sharded=True, input_sha256="s")
    assert again.reused and {h: a.spec for h, a in again.hosts.items()} == \
        {"a": "0/3", "b": "1/3", "c": "2/3"}  # by the record, not the order given
    assert moves.leaving(again) == []
    fewer = moves.placement("J", ["a", "b"], sharded=True, input_sha256="s")
    assert not fewer.reused and [a.spec for a in fewer.hosts.values()] == ["0/2", "1/2"]
    assert moves.leaving(fewer) == ["c"]
    other = moves.placement("J", ["a"], sharded=True, input_sha256="other")
    assert moves.leaving(other) == []  # another input: another job (the probe refuses it)


def test_a_take_over_sends_only_the_moved_shards_ids_not_in_hand(
        ws: Workstation, layout: shards.ShardLayout, tmp_path: Path) -> None:
    keys = [f"p{i}" for i in range(200)]
    c_shard = [k for k in keys if shard_of(k, 3) == 2]
    a_shard = [k for k in keys if shard_of(k, 3) == 0]
    # c's copy: some of its answers and failures, and (hostile, or stale) ids of a's shard,
    # which must never be left out on b: b would skip a prompt nobody asked.
    copy(tmp_path, "c", c_shard[:5] + a_shard[:3], failures=c_shard[5:7])
    taker = ws.targets("b")[0]
    placed, after = moves.take_over("J", "c", taker, tmp_path, input_sha256="s")
    move = placed.take_over
    assert move is not None and (move.done, move.failed) == (5, 2)
    sent = [json.loads(line) for line in move.exclusions.decode().splitlines()]
    assert sorted(sent) == sorted(c_shard[:7])
    assert placed.hosts["b"].spec == "1,2/3" and placed.hosts["b"].exclude
    assert (placed.hosts["b"].runs, placed.hosts["b"].of, placed.hosts["b"].less) == (2, 3, 0.02)
    assert after.holders == ("a", "b") and after.now.moves[0].shard == 2
    assert "shard 2/3 moves from c to b (take-over): 7 of its ids are in hand" in placed.notes[0]

    with pytest.raises(UsageError, match="it runs no shard of job J"):
        moves.take_over("J", "z", taker, tmp_path, input_sha256="s")
    with pytest.raises(UsageError, match="a shard moves to another host"):
        moves.take_over("J", "b", taker, tmp_path, input_sha256="s")
    with pytest.raises(UsageError, match="is not the one job J runs"):
        moves.take_over("J", "c", taker, tmp_path, input_sha256="other")
    with pytest.raises(UsageError, match="not launched from this workstation"):
        moves.take_over("K", "c", taker, tmp_path, input_sha256="s")


def test_a_refused_relaunch_names_the_way_out() -> None:
    said = moves.refusal("J", {"c": None, "a": "running"}, ["b"], ("a", "b", "c"))
    assert said is not None
    assert "a still runs its shard and c cannot be reached" in said
    assert "`fab launch --job J --take-over c --host b`" in said and "--host a,b,c" in said
    assert moves.refusal("J", {"c": "stopped", "a": "finished"}, ["b"]) is None


def test_a_role_that_cannot_leave_ids_out_takes_no_shard_over(
        ws: Workstation, layout: shards.ShardLayout, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    from handoff.cli import commands

    prompts = tmp_path / "J.jsonl"
    prompts.write_text('{"id": 1, "prompt": "q"}\n')
    assert commands.launch("s", "batch", local_input=str(prompts), remote_input=None,
                           flags={}, take_over="c", dest=str(tmp_path), dry_run=True) == 2
    assert "launch command takes no {exclude_ids}" in capfd.readouterr().err
