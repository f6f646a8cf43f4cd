"""The budget's arithmetic: expectations from the costs seen, prices, `--prices`."""

from __future__ import annotations

import asyncio

import pytest

from payload.generate.budget import Budget, BudgetReached, Prices, parse_prices

pytestmark = pytest.mark.timeout(30)


def test_budget_expectation_from_costs_seen():
    async def scenario() -> None:
        b = Budget(1.0, first_expectation=0.05)
        for _ in range(20):  # 20 x $0.05 expected fill $1
            await b.admit()
        blocked = asyncio.create_task(b.admit())
        await asyncio.sleep(0)
        assert not blocked.done()
        b.settle(0.01)  # answers cost $0.01: the expectation drops, more fit
        await asyncio.wait_for(blocked, 1)
        assert b.expectation == pytest.approx((0.05 + 0.01) / 2)
        for _ in range(20):
            b.settle(0.01)
        assert b.spent == pytest.approx(0.21) and b.in_flight == 0
        b.settle_unknown = None
        await b.admit()
        b.settle(None, unknown=True)  # a timeout: may have been billed, counted as expected
        assert b.spent == pytest.approx(0.21 + b.expectation)
    asyncio.run(scenario())

    async def reached() -> None:
        b = Budget(0.02, already_spent=0.015, first_expectation=0.01)
        with pytest.raises(BudgetReached, match=r"budget \$0.02 reached"):
            await b.admit()
        nobudget = Budget(None)
        await nobudget.admit()
    asyncio.run(reached())
    assert Prices(1e-6, 2e-6, 0.01).expected(100, 1000) == pytest.approx(0.0121)
    assert Prices(1e-6, 2e-6, 0.01).of({"prompt_tokens": 10, "completion_tokens": 5}) == \
        pytest.approx(0.01002)
    assert Prices(1e-6, 2e-6).of({"cost": 1}) is None
    assert parse_prices("0.6,2.5") == Prices(0.6e-6, 2.5e-6, 0.0)
    with pytest.raises(ValueError, match="PROMPT,COMPLETION"):
        parse_prices("1")
