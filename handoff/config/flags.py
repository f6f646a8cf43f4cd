"""Flag and var values checked where they are read: a bad one is a UsageError naming the
flag (or the inventory's file:line) and what it expects, never a ValueError traceback.

This is the one home of every numeric check: `VARS` holds the rule of each numeric var
(`max_cost`, `concurrency`, `key_limit`, ...) and `var()` applies it, with one message,
wherever the value comes from: the inventory at load (naming file:line), the task flag
that sets it (naming the flag), a host's key settings (naming the host).

invoke converts a flag's value with the type of its default (`int("ten")` raises inside
invoke's parser, before any task code runs), so the fabfile takes numbers as strings and
the commands convert them here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from handoff.errors import UsageError


def _describe(minimum: float | None, maximum: float | None, whole: bool,
              above: float | None = None) -> str:
    kind = "a whole number" if whole else "a number"
    if above is not None:
        return f"{kind} > {above:g}"
    if minimum is not None and maximum is not None:
        return f"{kind} from {minimum:g} to {maximum:g}"
    if minimum is not None:
        return f"{kind} >= {minimum:g}" if minimum else f"{kind} >= 0"
    return kind


def number(name: str, value: Any, *, whole: bool = False, minimum: float | None = None,
           maximum: float | None = None, where: str = "", above: float | None = None) -> float | int:
    """`value` (a flag's string, a YAML value) as an int (`whole`) or float within bounds
    (`above`: more than it). `name` is what the user wrote (`--concurrency`, or a var name
    with `where` = file:line)."""
    expected = _describe(minimum, maximum, whole, above)
    label = f"{where}: {name}" if where else name
    if isinstance(value, bool):
        raise UsageError(f"{label}: expected {expected}, got {value!r}")
    try:
        if isinstance(value, (int, float)):
            parsed: float | int = value
        else:
            text = str(value).strip()
            parsed = int(text) if whole else float(text)
    except ValueError:
        raise UsageError(f"{label}: expected {expected}, got {value!r}") from None
    if whole and isinstance(parsed, float):
        if not parsed.is_integer():
            raise UsageError(f"{label}: expected {expected}, got {value!r}")
        parsed = int(parsed)
    if isinstance(parsed, float) and not math.isfinite(parsed):
        raise UsageError(f"{label}: expected {expected}, got {value!r}")
    if ((minimum is not None and parsed < minimum) or (maximum is not None and parsed > maximum)
            or (above is not None and not parsed > above)):
        raise UsageError(f"{label}: expected {expected}, got {value!r}")
    return parsed


def whole(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
          default: int | None = None) -> int | None:
    """An optional whole-number flag (None stays None unless `default`)."""
    if value is None:
        return default
    return int(number(name, value, whole=True, minimum=minimum, maximum=maximum))


def real(name: str, value: Any, *, minimum: float | None = None,
         default: float | None = None) -> float | None:
    """An optional number flag (None stays None unless `default`)."""
    if value is None:
        return default
    return float(number(name, value, minimum=minimum))


@dataclass(frozen=True)
class Rule:
    """What a numeric var accepts: a whole number or any number, within bounds."""

    whole: bool = False
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None  # more than this (a bound it may not equal)


# Every numeric var, with its one rule. A budget of 0 passes this rule and is refused when
# it is split (a host's share must be at least $0.000001, handoff.ops.jobs.launch).
VARS: dict[str, Rule] = {
    "concurrency": Rule(whole=True, minimum=1),
    "max_tokens": Rule(whole=True, minimum=1),
    "gpus": Rule(whole=True, minimum=1),
    "max_cost": Rule(minimum=0),  # USD for the whole job
    "io_timeout": Rule(minimum=0.1),  # seconds
    "start_watch_s": Rule(minimum=0),  # seconds a fresh job is watched for an instant crash
    "key_limit": Rule(minimum=0),  # USD a minted child key may spend
    "key_ttl_hours": Rule(above=0),  # hours a minted child key lives
}


def var(name: str, value: Any, *, flag: str | None = None, where: str = "") -> float | int | None:
    """The numeric var `name` checked by its rule (None stays None). The message names the
    flag that set it (`--max-cost`) or `var NAME`, after `where` (file:line, a host)."""
    if value is None:
        return None
    rule = VARS[name]
    return number(flag or f"var {name}", value, whole=rule.whole, minimum=rule.minimum,
                  maximum=rule.maximum, where=where, above=rule.above)

