"""`--max-cost`: a hard budget that is never overshot.

Before a request is sent, its worst-case cost is reserved; when the answer comes back,
the reservation is settled with the `usage.cost` OpenRouter reports. A request is only
sent if spent + outstanding reservations + its worst case stays within the budget; when
even an idle run could not afford one more worst case, the budget is reached.

The worst case is `request price + prompt price × prompt tokens + completion price ×
max_tokens`, where the request body's length in bytes bounds the prompt's tokens from
above (no tokenizer emits more tokens than bytes), with prices taken as the
maximum over the endpoints the provider filter allows (from the preflight). When no price
is known, DEFAULT_PRICES is used: deliberately above any current hosted price for an open
model, so a budget errs on the side of stopping early.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

# USD per token (prompt, completion) and per request when the endpoint list gives no pricing:
# $10 / M prompt tokens, $40 / M completion tokens (above Kimi-K2.5's hosted prices).
DEFAULT_PRICES = (10e-6, 40e-6, 0.0)
# Completion tokens assumed when --max-tokens is not given (the model's ceiling is unknown).
DEFAULT_WORST_COMPLETION_TOKENS = 32768


@dataclass(frozen=True)
class Prices:
    prompt: float
    completion: float
    request: float = 0.0

    def worst_case(self, prompt_chars: int, max_tokens: int) -> float:
        # `prompt_chars` is the body's length in bytes: an upper bound on its token count.
        return self.request + self.prompt * prompt_chars + self.completion * max_tokens


class BudgetReached(Exception):
    """The next request could push the spend over --max-cost."""


class Budget:
    def __init__(self, max_cost: float | None, already_spent: float = 0.0) -> None:
        self.max_cost = max_cost
        # `spent` counts money OpenRouter reported (usage.cost) plus the reservation of any
        # attempt whose outcome is unknown (timeout, reset): it may have been billed.
        self.spent = already_spent
        self.reserved = 0.0
        self._changed = asyncio.Event()

    @property
    def reached(self) -> bool:
        return self.max_cost is not None and self.spent >= self.max_cost

    async def reserve(self, worst: float) -> float:
        """Wait until `worst` fits beside the outstanding reservations; raise if it never can."""
        if self.max_cost is None:
            return 0.0
        while True:
            if self.spent + worst > self.max_cost + 1e-12:
                raise BudgetReached(f"budget ${self.max_cost:g} reached (spent ${self.spent:.4f})")
            if self.spent + self.reserved + worst <= self.max_cost + 1e-12:
                self.reserved += worst
                return worst
            # Others' answers will settle below their worst case: wait for one.
            self._changed.clear()
            await self._changed.wait()

    def settle(self, reserved: float, actual: float) -> None:
        self.reserved = max(0.0, self.reserved - reserved)
        self.spent += actual
        self._changed.set()
