"""`--max-cost` end to end (docs/generator.md, "Budget"; issue 9 case 5, issue 13 case 5).

The fake charges a fixed cost per answer and lists it as the endpoints' request price; it
can also leave `usage.cost` out of its answers, or its prices out of the endpoint list.
"""

from __future__ import annotations

import pytest

from tests.payload.helpers import (
    assert_exactly_once,
    gen_args,
    read_jsonl,
    run_payload,
    status_of,
    write_prompts,
)

pytestmark = pytest.mark.timeout(120)


def test_one_dollar_at_one_cent_spends_most_of_it(fake_factory, key_file, tmp_path):
    """The worst-case reservation stopped at once having spent $0; the expected cost lets
    the run spend between $0.50 and $1.00 + what was in flight, then stop (exit 3)."""
    fake = fake_factory(cost_per_request=0.01, latency_s=0.2, serve_endpoints=False)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 400)
    args = gen_args(fake, key_file, inp, out, "--concurrency", "200")
    proc = run_payload(*args, "--max-cost", "1")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "budget $1 reached" in proc.stderr
    spent = fake.stats.total_cost
    st = status_of(out)
    # The fake's own books; at most the last wave (dispatched on the expectation) beyond $1.
    assert 0.5 <= spent <= 1.0 + 0.01 * st["window"] + 1e-9
    assert spent <= 1.0 + 1e-9  # here the expectation is exact: no overshoot at all
    assert (st["state"], st["stop_reason"], st["budget_enforced"]) == ("stopped", "budget", True)
    assert st["cost"] == pytest.approx(spent)
    assert len(read_jsonl(out)) == fake.stats.successes
    again = run_payload(*args, "--max-cost", "10")
    assert again.returncode == 0, again.stderr[-2000:]
    assert_exactly_once(ids, out)


@pytest.mark.serial  # peak concurrency >= 1800: run alone (scripts/test's serial pass)
def test_ample_budget_keeps_the_full_concurrency_in_flight(fake_factory, key_file, tmp_path):
    """$100 at 2000 concurrency and $0.002 an answer: the worst case allowed ~76 in flight;
    the expectation keeps ~2000."""
    fake = fake_factory(cost_per_request=0.002, latency_s=1.0)  # 2000 in flight = throughput x latency: 0.5 s sat at ~1400-1800 on 2 cores
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 8000)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "2000",
                                 "--max-cost", "100"), timeout=110)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert fake.stats.peak_concurrency >= 1800
    assert_exactly_once(ids, out)
    assert status_of(out)["cost"] == pytest.approx(16.0)


def test_no_usage_cost_is_priced_from_tokens(fake_factory, key_file, tmp_path):
    """Issue 13 case 5: a server without usage.cost let `--max-cost 0.05` run every request.
    With endpoint prices, answers are priced from their usage and the budget holds."""
    fake = fake_factory(cost_per_request=0.001, report_cost=False, latency_s=0.05)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 2000)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "100",
                                 "--max-cost", "0.05"))
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert fake.stats.successes <= 50 + 1
    st = status_of(out)
    assert st["budget_enforced"] is True and st["stop_reason"] == "budget"
    assert st["cost"] == pytest.approx(fake.stats.total_cost)


def test_no_cost_and_no_prices_is_announced_then_priced_with_prices_flag(fake_factory,
                                                                        key_file, tmp_path):
    """With neither usage.cost nor prices the budget cannot be enforced: said at start, in
    a warning at the first answer and in the status file; `--prices` enforces it."""
    fake = fake_factory(cost_per_request=0.001, report_cost=False, serve_endpoints=False)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = write_prompts(inp, 200)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--max-cost", "0.05"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no prices are known" in proc.stderr
    assert "--max-cost $0.05 cannot be enforced" in proc.stderr and "--prices" in proc.stderr
    st = status_of(out)
    assert st["budget_enforced"] is False
    assert_exactly_once(ids, out)
    out2 = tmp_path / "out2.jsonl"
    priced = run_payload(*gen_args(fake, key_file, inp, out2, "--max-cost", "0.05",
                                   "--prices", "0,0,0.001"))
    assert priced.returncode == 3, priced.stderr[-2000:]
    st2 = status_of(out2)
    assert st2["budget_enforced"] is True and st2["stop_reason"] == "budget"
    assert st2["cost"] <= 0.05 + 1e-9 and len(read_jsonl(out2)) == 50


def test_prices_flag_is_checked(fake_factory, key_file, tmp_path):
    fake = fake_factory()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 3)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--prices", "cheap"))
    assert proc.returncode == 2 and "PROMPT,COMPLETION" in proc.stderr
