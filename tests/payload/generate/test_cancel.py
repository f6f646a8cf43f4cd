"""Cancellation stops the bill (issue 33; docs/generator.md "Cancellation"): requests in
flight are closed by a stop (SIGTERM after `--drain-timeout`, at once on a budget stop or
a 402), counted `cancelled` in the status, kept in the budget at their reserve, and asked
again by the next run, so every id still ends in exactly one file.

These use non-streamed requests (`--stream off`) that hang at the fake (its `hang` fault):
what the payload does. test_cancel_streams.py proves the same with streamed answers, at a
fake that counts the tokens it bills.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time

import pytest

from handoff.testing.fakeapi import FaultPlan
from payload.generate.budget import Budget
from payload.generate.inflight import InFlight
from payload.generate.progress import carried
from payload.records import errors_path
from tests.payload.helpers import (
    REPO,
    assert_exactly_once,
    gen_args,
    payload_cmd,
    payload_env,
    read_jsonl,
    run_payload,
    status_of,
    wait_for_status,
    write_prompts,
)

pytestmark = pytest.mark.timeout(120)


# -- the parts -----------------------------------------------------------------------------
def test_inflight_close_answers_none_and_a_cancelled_caller_closes_its_request():
    async def scenario() -> None:
        box = InFlight()
        closed: list[str] = []

        async def request(name: str, delay: float) -> str:
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                closed.append(name)
                raise
            return name

        assert await box.run(request("quick", 0)) == "quick"
        slow = [asyncio.create_task(box.run(request(f"slow{i}", 60))) for i in range(3)]
        await asyncio.sleep(0.01)  # all three are waiting on their answers
        assert len(box) == 3
        assert box.close() == 3
        # Each caller is told its request was closed (the cancellation taken back).
        assert await asyncio.gather(*slow) == [None, None, None]
        assert sorted(closed) == ["slow0", "slow1", "slow2"] and len(box) == 0

        # The caller cancelled (a worker cancelled): its request is closed with it.
        caller = asyncio.create_task(box.run(request("orphan", 60)))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.sleep(0)
        assert "orphan" in closed and len(box) == 0

        # A caller whose request was closed goes on as if never cancelled (a later timeout
        # still works: Python 3.11 counts cancellations).
        async def goes_on() -> str:
            assert await box.run(request("closed", 60)) is None
            task = asyncio.current_task()
            assert task is not None and getattr(task, "cancelling", lambda: 0)() == 0
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.sleep(5), 0.01)
            return "went on"

        going = asyncio.create_task(goes_on())
        await asyncio.sleep(0.01)
        assert box.close() == 1 and await going == "went on"

        # An answer that came before the close is kept.
        done = asyncio.create_task(box.run(request("answered", 0)))
        await asyncio.sleep(0.01)
        box.close()
        assert await done == "answered"

    asyncio.run(scenario())


def test_a_closed_request_keeps_its_reserve_in_the_budget():
    async def scenario() -> None:
        b = Budget(1.0, first_expectation=0.1)
        for _ in range(3):
            await b.admit()
        b.settle(0.1)
        reserve = b.closed()  # may have been billed: never counted as zero
        assert reserve == pytest.approx(0.1) and b.spent == pytest.approx(0.2)
        b.cancel()  # never sent: nothing spent
        assert b.spent == pytest.approx(0.2) and b.in_flight == 0

    asyncio.run(scenario())


def test_carried_reads_only_sane_counts(tmp_path):
    path = tmp_path / "s.json"
    assert carried(None) == (0, 0.0) and carried(path) == (0, 0.0)
    path.write_text(json.dumps({"cancelled": 7, "cancelled_cost": 0.25}))
    assert carried(path) == (7, 0.25)
    for hostile in ({"cancelled": -1, "cancelled_cost": -2}, {"cancelled": True},
                    {"cancelled": "7", "cancelled_cost": "0.2"}, [1, 2], "x"):
        path.write_text(json.dumps(hostile))
        assert carried(path) == (0, 0.0)
    path.write_text('{"cancelled": 3, "cancelled_cost": NaN}')
    assert carried(path) == (3, 0.0)
    path.write_text("{torn")
    assert carried(path) == (0, 0.0)


# -- end to end ----------------------------------------------------------------------------
def _hanging(first_quick: int, n: int) -> FaultPlan:
    """Requests after the first `first_quick` hang at the fake (60 s) up to request `n`."""
    return FaultPlan(schedule={i: "hang" for i in range(first_quick + 1, n + 1)}, hang_s=60)


def test_sigterm_drains_then_closes_and_the_next_run_asks_them_again(fake_factory, key_file,
                                                                   tmp_path):
    fake = fake_factory(faults=_hanging(5, 20))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 40)
    args = gen_args(fake, key_file, inp, out, "--stream", "off", "--concurrency", "15",
                    "--request-timeout", "120", "--drain-timeout", "1")
    proc = subprocess.Popen(payload_cmd(*args), cwd=REPO, env=payload_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_status(out, lambda st: st.get("done", 0) >= 5 and st.get("in_flight", 0) >= 15)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - t0
    assert proc.returncode == 3, err
    # Drained for 1 s (the hung requests never answer), then closed: not 60 s of hang.
    assert took < 10, took
    assert "SIGTERM: stopping; waiting up to 1s for in-flight requests, then closing" in err
    assert "drain: 15 requests still in flight after 1s were closed" in err
    st = status_of(out)
    assert (st["state"], st["stop_reason"], st["in_flight"]) == ("stopped", "signal", 0)
    assert (st["done"], st["failed"], st["cancelled"]) == (5, 0, 15)
    assert "cancelled 15" in err.strip().splitlines()[-1]  # the final progress line
    assert read_jsonl(tmp_path / "metrics.jsonl")[-1]["cancelled"] == 15
    # Closed ids were recorded neither as answered nor as failed.
    assert len(read_jsonl(out)) == 5 and not read_jsonl(errors_path(out))
    again = run_payload(*args)
    assert again.returncode == 0, again.stderr
    done, failed = assert_exactly_once(ids, out)
    assert len(done) == 40 and not failed
    st = status_of(out)
    assert (st["state"], st["done"], st["cancelled"]) == ("finished", 40, 15)  # cumulative
    assert read_jsonl(tmp_path / "metrics.jsonl")[-1]["cancelled"] == 15  # counted once


def test_budget_reached_closes_the_requests_in_flight_at_once(fake_factory, key_file,
                                                              tmp_path):
    # Priced at nothing (--prices), answers cost $0.001 each: all 20 go out at once; the
    # fifth answer brings the spend to the $0.0045 budget while 15 hang at the server.
    fake = fake_factory(cost_per_request=0.001, faults=_hanging(5, 20))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 30)
    args = gen_args(fake, key_file, inp, out, "--stream", "off", "--concurrency", "20",
                    "--request-timeout", "120", "--drain-timeout", "60",
                    "--prices", "0,0,0.0000001", "--max-cost", "0.0045")
    t0 = time.monotonic()
    proc = run_payload(*args, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert time.monotonic() - t0 < 20  # neither the 60 s hang nor the 60 s drain
    assert "the 15 requests in flight are closed" in proc.stderr
    st = status_of(out)
    assert (st["stop_reason"], st["done"], st["cancelled"], st["in_flight"]) == (
        "budget", 5, 15, 0)
    # Their cost is unknown but possible: each keeps the expectation by then (the mean of
    # five $0.001 answers and the $0.0000001 prior worth one answer), never zero.
    assert st["cancelled_cost"] == pytest.approx(15 * (0.0000001 + 5 * 0.001) / 6)
    assert st["cost"] == pytest.approx(0.005)
    # Resumed with the same budget: what the closed requests may have cost still counts.
    same = run_payload(*args)
    assert same.returncode == 3 and "held for requests closed before their answer" in same.stderr
    again = run_payload(*args[:-1], "1")
    assert again.returncode == 0, again.stderr
    done, _ = assert_exactly_once(ids, out)
    assert len(done) == 30 and status_of(out)["cancelled"] == 15


def test_402_closes_the_requests_in_flight_at_once(fake_factory, key_file, tmp_path):
    # The key's limit fits four answers: the fifth request is refused 402 while 15 hang.
    fake = fake_factory(cost_per_request=0.001, credit_limit=0.0045, faults=_hanging(5, 20))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 30)
    args = gen_args(fake, key_file, inp, out, "--stream", "off", "--concurrency", "20",
                    "--request-timeout", "120", "--drain-timeout", "60")
    t0 = time.monotonic()
    proc = run_payload(*args, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert time.monotonic() - t0 < 20
    assert "out of credit or key limit reached" in proc.stderr
    assert "requests in flight are closed" in proc.stderr
    st = status_of(out)
    assert (st["stop_reason"], st["done"], st["in_flight"]) == ("credit", 4, 0)
    # The 15 hanging, and any of the 4 prompts sent after the answers that were still on
    # their way when the 402 came: every request the fake had not answered was closed.
    refused = sum(n for kind, n in st["errors_by_kind"].items())
    assert 15 <= st["cancelled"] <= 19
    assert st["done"] + refused + st["cancelled"] == fake.stats.requests
    assert not read_jsonl(errors_path(out))  # the 402 is not the prompt's failure
    fake.credit_limit = None
    again = run_payload(*args)
    assert again.returncode == 0, again.stderr
    done, _ = assert_exactly_once(ids, out)
    assert len(done) == 30
