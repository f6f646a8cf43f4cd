"""`generate --turns all` (docs/generator.md, "Thinking answers and turns"; issue 20): every assistant turn
regenerated in order on the regenerated history, exactly once per (id, turn) across
kill -9 and resume; the fake checks each later turn is sent the regenerated history.
"""

from __future__ import annotations

import json
import random
import subprocess
import time

import pytest

from handoff.testing.fakeapi import answer_digest
from payload.records import derive_id, errors_path
from tests.payload.helpers import (
    REPO,
    assert_exactly_once,
    gen_args,
    payload_cmd,
    payload_env,
    read_jsonl,
    run_payload,
    status_of,
)

pytestmark = pytest.mark.timeout(180)


def write_conversations(path, n: int) -> list[str]:
    """n ShareGPT-style 3-turn conversations whose assistant turns are someone else's."""
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            msgs = [{"role": "system", "content": "be brief"}]
            for t in range(3):
                msgs += [{"role": "user", "content": f"conversation {i} question {t}"},
                         {"role": "assistant", "content": f"an old answer {i}/{t}"}]
            fh.write(json.dumps({"id": i, "source": "multi", "messages": msgs}) + "\n")
    return [str(i) for i in range(n)]


def expected(i: int) -> list[dict]:
    """The regenerated conversation before its last answer, as the record holds it."""
    msgs = [{"role": "system", "content": "be brief"}]
    for t in range(3):
        user = {"role": "user", "content": f"conversation {i} question {t}"}
        msgs.append(user)
        if t < 2:
            msgs.append({"role": "assistant", "content": f"answer {answer_digest([user])}",
                         "reasoning": "thinking"})
    return msgs


def lines(path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_every_turn_regenerated_once_across_two_kill9(fake_factory, key_file, tmp_path):
    n = 300
    fake = fake_factory(latency_s=0.1, check_history=True)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    journal = tmp_path / "out.turns.jsonl"
    ids = write_conversations(inp, n)
    args = gen_args(fake, key_file, inp, out, "--concurrency", "40", "--turns", "all")
    rng = random.Random(5)
    for round_no in (1, 2):
        proc = subprocess.Popen(payload_cmd(*args), cwd=REPO, env=payload_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Killed mid-run, once this round has answered more turns (a jittered point).
        goal = round_no * 200 + rng.randint(0, 60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if lines(out) + lines(journal) >= goal:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.kill()
        proc.wait()
    assert len(read_jsonl(out)) < n and lines(journal) > 0  # conversations were cut mid-way
    final = run_payload(*args, timeout=120)
    assert final.returncode == 0, final.stderr[-2000:]
    assert "turns of" in final.stderr  # the resume said it took journaled turns back
    done, failed = assert_exactly_once(ids, out)
    assert not failed and not read_jsonl(errors_path(out))
    for r in done:
        i = r["id"]
        assert r["messages"] == expected(i)  # the regenerated history, reasoning kept
        assert r["response"] == f"answer {answer_digest(expected(i))}"
        assert [t["index"] for t in r["turns"]] == [2, 4, 6]
        assert r["meta"] == {"source": "multi"}
        assert r["usage"]["completion_tokens"] == 3 * 32  # summed over the turns
        assert r["attempts"] == sum(t["attempts"] for t in r["turns"])
    # Every later turn was sent the regenerated history (the fake checked each).
    assert fake.stats.history_mismatches == 0
    assert fake.stats.history_checked >= n * (1 + 2)
    # Every (id, turn) answered: each turn's history was answered at least once, and again
    # only where a kill fell between an answer and its line (at most the turns in flight).
    histories = []
    for r in done:
        conv = r["messages"] + [{"role": "assistant", "content": r["response"]}]
        histories += [[{k: v for k, v in m.items() if k != "reasoning"} for m in conv[:j]]
                      for j in (2, 4, 6)]
    counts = [fake.stats.successes_by_prompt[derive_id(h)] for h in histories]
    assert min(counts) == 1
    assert sum(c - 1 for c in counts) <= 2 * 40
    assert fake.stats.successes == sum(counts)
    st = status_of(out)
    assert (st["state"], st["done"], st["failed"]) == ("finished", n, 0)
    # Answers counted per turn, across the resumed runs: each (id, turn) once.
    assert st["by_finish_reason"] == {"stop": 3 * n}
    assert sum(st["by_provider"].values()) == 3 * n


def test_turns_last_keeps_the_given_history(fake_factory, key_file, tmp_path):
    """The default regenerates the final turn only: earlier assistant turns are sent as
    written, and the record has no `turns`."""
    fake = fake_factory(record_bodies=True)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_conversations(inp, 5)
    assert run_payload(*gen_args(fake, key_file, inp, out)).returncode == 0
    done, _ = assert_exactly_once(ids, out)
    assert fake.stats.requests == 5
    assert all("an old answer" in b["messages"][2]["content"] for b in fake.stats.bodies)
    assert all("turns" not in r and len(r["messages"]) == 6 for r in done)
    assert not (tmp_path / "out.turns.jsonl").exists()


def test_which_turns_and_on_what_history():
    from payload.generate.turns import history, positions
    from payload.records import prompt_of
    conv = [{"role": "assistant", "content": "hello, ask me"},  # a greeting: kept as given
            {"role": "user", "content": "q1"}, {"role": "assistant", "content": "old1"},
            {"role": "user", "content": "q2"}]
    p = prompt_of({"id": 1, "messages": conv}, 1)
    assert positions(p, "last") == [4] and positions(p, "all") == [2, 4]
    done = [{"response": "new1", "reasoning": "why"}]
    assert history(p, [2, 4], done, 1) == [conv[0], conv[1],
                                           {"role": "assistant", "content": "new1"}, conv[3]]
    assert history(p, [2, 4], done, 1, with_reasoning=True)[2]["reasoning"] == "why"
    ended = prompt_of({"id": 2, "messages": conv[1:3]}, 1)  # ends with an assistant turn
    assert positions(ended, "last") == [1] == positions(ended, "all")
