"""Defaults shared by the payload and the control plane (handoff imports these; the
payload never imports handoff). Defined here once."""

from __future__ import annotations

from typing import Any

BASE_URL = "https://openrouter.ai/api/v1"
MODEL = "moonshotai/kimi-k2.5"
# Kimi-K2.5 at INT4 (the quantisation the drafts are trained against), without the two
# providers whose INT4 endpoints answered differently from the reference deployment.
PROVIDER: dict[str, Any] = {"quantizations": ["int4"], "ignore": ["fireworks", "baseten"]}
CONCURRENCY = 2000
