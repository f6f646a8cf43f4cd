"""`python -m payload smoke`: one real request from the container, before a long run.

It proves the whole path at once (network egress, the key, the model slug, the provider
filter) and prints what an engineer checks by hand: model, serving provider, latency,
tokens, cost, the endpoint list's prices, and the key's usage and limit left (`GET /key`).
`fab smoke-test` records latency, tokens, cost and prices for `fab launch`'s estimate.

A thinking model may spend a short `--max-tokens` (64) on reasoning alone: an answer cut
there (`finish_reason: "length"`) with reasoning and no content proves the path as well,
and passes; the tokens line splits the completion into reasoning and content tokens
(`fab launch`'s estimate counts both).

Exit 0 only if the answer has content or reasoning; 3 on 401 (key refused) or 402 (out
of credit / key limit), naming the cause; 1 for any other failure (an empty answer too).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from payload.errors import PreflightRefused
from payload.generate import client
from payload.generate.client import Kind
from payload.generate.preflight import check_endpoints
from payload.redact import redact
from payload.report import Reporter

SMOKE_PROMPT = [{"role": "user", "content": "Reply with the single word: ready"}]


async def _key_info(session: aiohttp.ClientSession, base_url: str,
                    headers: dict[str, str]) -> tuple[int, dict[str, Any] | None]:
    try:
        async with session.get(base_url.rstrip("/") + "/key", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=30)) as resp:
            raw = await resp.read()
            data = json.loads(raw).get("data") if resp.status == 200 else None
            return resp.status, data if isinstance(data, dict) else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError, OSError):
        return 0, None


async def _prices(session: aiohttp.ClientSession, base_url: str, model: str,
                  provider: dict[str, Any] | None, headers: dict[str, str],
                  notes: Reporter) -> str:
    """The endpoint list's prices for the model (the highest among the endpoints the
    provider filter allows), as `fab launch`'s estimate reads them back; `unknown (why)`."""
    try:
        found, _ = await check_endpoints(session, base_url, model, provider, headers, notes)
    except PreflightRefused as exc:
        return f"unknown ({exc})"
    if found is None:
        return "unknown (the server lists no endpoint prices)"
    return (f"prompt ${found.prompt * 1e6:.4f}/M, completion ${found.completion * 1e6:.4f}/M, "
            f"request ${found.request:.6f}")


def _split(usage: dict[str, Any]) -> str:
    """` (reasoning R, content C)` from `completion_tokens_details.reasoning_tokens`."""
    details = usage.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    completion = usage.get("completion_tokens")
    if not isinstance(reasoning, int) or not isinstance(completion, int):
        return ""
    return f" (reasoning {reasoning}, content {completion - reasoning})"


def _money(value: Any) -> str:
    return f"${value:.6f}" if isinstance(value, (int, float)) else "unknown"


async def _smoke(base_url: str, api_key: str, model: str, provider: dict[str, Any] | None,
                 max_tokens: int, timeout: float) -> int:
    out, err = Reporter("stdout"), Reporter("stderr")  # the facts; notes and the verdict
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
               "X-Title": "handoff"}
    body = json.dumps(client.build_body(SMOKE_PROMPT, model=model, provider=provider,
                                        max_tokens=max_tokens, temperature=None, top_p=None,
                                        reasoning=None)).encode("utf-8")
    url = base_url.rstrip("/") + "/chat/completions"
    async with aiohttp.ClientSession(trust_env=True) as session:  # one request: env lookups ok
        outcome = await client.attempt(session, url, body, headers,
                                       aiohttp.ClientTimeout(total=timeout), client.env_proxy(url))
        key_status, key = await _key_info(session, base_url, headers)
        prices = await _prices(session, base_url, model, provider, headers, err)
    out.say(f"model:     {model}")
    empty = outcome.kind is Kind.OK and not (outcome.result.get("response") or "").strip() \
        and not (outcome.result.get("reasoning") or "").strip()
    if outcome.kind is Kind.OK:
        r = outcome.result
        usage = r.get("usage") or {}
        out.say(f"served by: {r.get('provider') or 'unknown'} ({r.get('model') or model})")
        out.say(f"latency:   {outcome.latency_s:.2f} s")
        out.say(f"tokens:    prompt {usage.get('prompt_tokens', '?')}, "
                f"completion {usage.get('completion_tokens', '?')}{_split(usage)}")
        out.say(f"cost:      {_money(usage.get('cost'))}")
        out.say(f"finish:    {r.get('finish_reason')}"
                + (" (cut by --max-tokens)" if outcome.cut else ""))
        # Redacted before it is cut: a key split by the cut would no longer be recognised.
        out.say(f"answer:    {redact(str(r.get('response')))[:200]!r}")
        if r.get("reasoning"):
            out.say(f"reasoning: {redact(str(r.get('reasoning')))[:200]!r}")
    out.say(f"prices:    {prices}")
    if key is not None:
        limit = key.get("limit")
        left = key.get("limit_remaining")
        expires = key.get("expires_at")
        out.say(f"key:       usage {_money(key.get('usage'))}, limit "
                f"{_money(limit) if limit is not None else 'none'}, left "
                f"{_money(left) if left is not None else 'unlimited'}, expires "
                f"{expires if isinstance(expires, str) and expires else 'never'}")
    else:
        out.say(f"key:       usage unknown (GET /key answered {key_status or 'nothing'})")
    if empty:
        err.say(f"smoke: FAILED: empty answer (finish_reason {outcome.result.get('finish_reason')!r},"
                " no content and no reasoning)")
        return 1
    if outcome.kind is Kind.OK:
        out.say("smoke: OK")
        return 0
    if outcome.kind is Kind.AUTH:
        err.say(f"smoke: FAILED: the API key was refused (401: {outcome.message})")
        return 3
    if outcome.kind is Kind.CREDIT:
        err.say(f"smoke: FAILED: out of credit or key limit reached (402: {outcome.message})")
        return 3
    err.say(f"smoke: FAILED: {outcome.status or ''} {outcome.type}: {outcome.message}".replace(
        "  ", " "))
    return 1


def run_smoke(*, base_url: str, api_key: str, model: str, provider: dict[str, Any] | None,
              max_tokens: int = 64, timeout: float = 120.0) -> int:
    return asyncio.run(_smoke(base_url, api_key, model, provider, max_tokens, timeout))
