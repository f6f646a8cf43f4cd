"""Preflight: does the provider filter leave any endpoint for the model?

With a filter that matches nothing, OpenRouter answers every request 404
`constraint_filtered`: a 40,000-prompt run would record 40,000 permanent failures. The
endpoints list (`GET /models/{author}/{slug}/endpoints`) says up front; where a server
does not serve it (404, not JSON, unreachable), the check is skipped with a note.
The allowed endpoints' prices also give the budget its per-token price bound.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from payload.errors import PreflightRefused
from payload.generate.budget import Prices
from payload.report import Reporter

__all__ = ["PreflightRefused", "check_endpoints", "endpoint_allowed"]


def _names(ep: dict[str, Any]) -> set[str]:
    """Every spelling a filter entry may use for this endpoint's provider."""
    tag = str(ep.get("tag") or "").lower()
    name = str(ep.get("provider_name") or "").lower()
    names = {tag, tag.split("/")[0], name, name.replace(" ", ""), name.replace(" ", "-")}
    return {n for n in names if n}


def endpoint_allowed(ep: dict[str, Any], provider: dict[str, Any] | None) -> bool:
    if not provider:
        return True
    names = _names(ep)
    quants = provider.get("quantizations")
    if quants and str(ep.get("quantization") or "unknown").lower() not in {
            str(q).lower() for q in quants}:
        return False
    ignore = provider.get("ignore")
    if ignore and names & {str(x).lower() for x in ignore}:
        return False
    only = provider.get("only")
    if only and not names & {str(x).lower() for x in only}:
        return False
    order = provider.get("order")
    return not (order and provider.get("allow_fallbacks") is False
                and not names & {str(x).lower() for x in order})


def _price(value: Any) -> float:
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return 0.0


async def check_endpoints(session: aiohttp.ClientSession, base_url: str, model: str,
                          provider: dict[str, Any] | None, headers: dict[str, str],
                          reporter: Reporter | None = None
                          ) -> tuple[Prices | None, int | None]:
    """(price bound, max completion tokens) over the allowed endpoints, or (None, None) when
    the list is not served. Raises PreflightRefused when the filter leaves nothing."""
    say = reporter or Reporter()
    if model.count("/") != 1:
        say.say(f"preflight: model {model!r} is not author/slug, so its endpoint list "
                "(GET /models/{author}/{slug}/endpoints) cannot be asked; the provider "
                "filter and the prices are not checked")
        return None, None
    author, slug = model.split(":")[0].split("/")
    url = f"{base_url.rstrip('/')}/models/{author}/{slug}/endpoints"
    try:
        async with session.get(url, headers=headers,
                               timeout=aiohttp.ClientTimeout(total=30)) as resp:
            raw = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        say.say(f"preflight: endpoint list unreachable ({type(exc).__name__}); skipped")
        return None, None
    try:
        data = json.loads(raw)
        endpoints = data["data"]["endpoints"]
        if status != 200 or not isinstance(endpoints, list):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        say.say(f"preflight: endpoint list not served (HTTP {status}); check skipped")
        return None, None
    allowed = [ep for ep in endpoints if isinstance(ep, dict) and endpoint_allowed(ep, provider)]
    if not allowed:
        seen = ", ".join(f"{ep.get('tag') or ep.get('provider_name')}"
                         f"({ep.get('quantization') or 'unknown'})"
                         for ep in endpoints if isinstance(ep, dict)) or "none"
        raise PreflightRefused(
            f"the provider filter {json.dumps(provider)} leaves no endpoint for {model} "
            f"(endpoints: {seen}); every request would fail with 404. Change --provider.")
    priced = [ep["pricing"] for ep in allowed if isinstance(ep.get("pricing"), dict)]
    prices = Prices(prompt=max(_price(p.get("prompt")) for p in priced),
                    completion=max(_price(p.get("completion")) for p in priced),
                    request=max(_price(p.get("request")) for p in priced)) if priced else None
    caps = [ep.get("max_completion_tokens") or ep.get("context_length") for ep in allowed]
    max_completion = max((c for c in caps if isinstance(c, int)), default=None)
    return prices, max_completion
