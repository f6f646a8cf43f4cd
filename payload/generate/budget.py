"""`--max-cost`: a budget that caps the spend without idling the run.

A request is dispatched while the money spent plus what the requests in flight are
expected to cost stays under the budget. The expectation comes from the costs seen in
this run (the mean cost per answered attempt); before the first answers, from the
endpoint prices with `--max-tokens` (else the endpoints' completion ceiling), and with no
price at all from a deliberately high default. So with an ample budget the run keeps
`--concurrency` requests in flight, and when the budget is reached the overshoot is at
most what the requests then in flight actually cost beyond their expectation.

A worst-case reservation (the previous design) never overshot, but with no prices it
reserved $1.31 per request: a $1 budget stopped before sending anything, and a $100
budget allowed 76 requests in flight where 2000 were asked for.

What an answer cost: its `usage.cost` when the server reports one; otherwise its usage
tokens × the endpoint prices (`Prices.of`); with neither, the budget cannot be enforced,
which `generate` says at start and in the status file (`budget_enforced: false`).

A request closed before its answer (a stop: `InFlight`) may have been billed for what the
server generated until then: its cost is unknown but possible, so its reserve (the
expectation) stays spent, never zero (`closed`); the run carries that sum over
to the next one (the status file's `cancelled_cost`), as it does the recorded costs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from payload.errors import BudgetReached

__all__ = ["DEFAULT_FIRST_EXPECTATION", "DEFAULT_PRICES", "Budget", "BudgetReached", "Prices",
           "parse_prices"]

# USD per token (prompt, completion) when nothing better is known: $10 / M prompt tokens,
# $40 / M completion tokens (above Kimi-K2.5's hosted prices). Used only for the
# expectation before the first answers.
DEFAULT_PRICES = (10e-6, 40e-6, 0.0)
# Expected cost of one request before any answer when neither prices nor --max-tokens are
# known: 25x what the seed run paid per sample ($0.002), so the first wave stays small.
DEFAULT_FIRST_EXPECTATION = 0.05


@dataclass(frozen=True)
class Prices:
    """USD per prompt token, per completion token, per request."""

    prompt: float
    completion: float
    request: float = 0.0

    def expected(self, prompt_bytes: int, completion_tokens: int) -> float:
        # The body's length in bytes bounds the prompt's token count from above (no tokenizer
        # emits more tokens than bytes): an upper estimate before anything is known.
        return self.request + self.prompt * prompt_bytes + self.completion * completion_tokens

    def of(self, usage: dict[str, Any] | None) -> float | None:
        """An answer's cost from its token counts; None without any."""
        if not usage:
            return None
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(pt, int) and not isinstance(ct, int):
            return None
        return (self.request + self.prompt * (pt if isinstance(pt, int) else 0)
                + self.completion * (ct if isinstance(ct, int) else 0))


def parse_prices(text: str) -> Prices:
    """`--prices PROMPT,COMPLETION[,REQUEST]`: USD per million tokens (request: USD each)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (2, 3) or any(v < 0 for v in values):
        raise ValueError("--prices takes PROMPT,COMPLETION[,REQUEST]: USD per million prompt "
                         "and completion tokens (and USD per request), e.g. 0.6,2.5")
    request = values[2] if len(values) == 3 else 0.0
    return Prices(values[0] / 1e6, values[1] / 1e6, request)


class Budget:
    def __init__(self, max_cost: float | None, already_spent: float = 0.0,
                 first_expectation: float = DEFAULT_FIRST_EXPECTATION) -> None:
        self.max_cost = max_cost
        # Money reported (or priced from tokens) for this job, cumulative over resumed runs,
        # plus the expectation of any attempt whose outcome is unknown (timeout, reset):
        # it may have been billed.
        self.spent = already_spent
        self.first_expectation = first_expectation
        self.in_flight = 0
        self._seen_cost = 0.0
        self._seen_answers = 0
        self._changed = asyncio.Event()

    @property
    def expectation(self) -> float:
        """Expected cost of the next attempt: the mean seen in this run, with the first
        expectation as a prior worth one answer (so it fades after a few answers)."""
        return (self.first_expectation + self._seen_cost) / (1 + self._seen_answers)

    @property
    def reached(self) -> bool:
        return self.max_cost is not None and self.spent >= self.max_cost

    async def admit(self) -> None:
        """Wait until one more request fits: spent + (in flight + 1) x expectation <= budget.
        Raises BudgetReached when not even one fits with nothing in flight."""
        if self.max_cost is None:
            self.in_flight += 1
            return
        while True:
            expect = self.expectation
            if self.spent + (self.in_flight + 1) * expect <= self.max_cost + 1e-12:
                self.in_flight += 1
                return
            if self.in_flight == 0:
                raise BudgetReached(f"budget ${self.max_cost:g} reached (spent "
                                    f"${self.spent:.4f}; one more answer is expected to cost "
                                    f"${expect:.4f})")
            self._changed.clear()
            await self._changed.wait()

    def settle(self, cost: float | None, *, unknown: bool = False) -> None:
        """An admitted attempt ended. `cost` is what it cost (None: nothing known, e.g. an
        error answer); `unknown` marks an attempt that may have been billed unseen."""
        self.in_flight -= 1
        if unknown:
            self.spent += self.expectation
        elif cost is not None:
            self.spent += cost
            self._seen_cost += cost
            self._seen_answers += 1
        else:
            self._seen_answers += 1  # answered at no reported cost (an error)
        self._changed.set()

    def closed(self) -> float:
        """An admitted request was closed before its answer: what it may have cost is
        unknown, so its reserve (the expectation) stays spent; returns that reserve."""
        self.in_flight -= 1
        reserve = self.expectation
        self.spent += reserve
        self._changed.set()
        return reserve

    def cancel(self) -> None:
        """An admitted attempt was never sent."""
        self.in_flight -= 1
        self._changed.set()
