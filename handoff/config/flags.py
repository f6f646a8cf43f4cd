"""Flag and var values checked where they are read: a bad one is a UsageError naming the
flag (or the inventory's file:line) and what it expects, never a ValueError traceback.

invoke converts a flag's value with the type of its default (`int("ten")` raises inside
invoke's parser, before any task code runs), so the fabfile takes numbers as strings and
the commands convert them here.
"""

from __future__ import annotations

import math
from typing import Any

from handoff.errors import UsageError


def _describe(minimum: float | None, maximum: float | None, whole: bool) -> str:
    kind = "a whole number" if whole else "a number"
    if minimum is not None and maximum is not None:
        return f"{kind} from {minimum:g} to {maximum:g}"
    if minimum is not None:
        return f"{kind} >= {minimum:g}" if minimum else f"{kind} >= 0"
    return kind


def number(name: str, value: Any, *, whole: bool = False, minimum: float | None = None,
           maximum: float | None = None, where: str = "") -> float | int:
    """`value` (a flag's string, a YAML value) as an int (`whole`) or float within bounds.
    `name` is what the user wrote (`--concurrency`, or a var name with `where` = file:line)."""
    expected = _describe(minimum, maximum, whole)
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
    if (minimum is not None and parsed < minimum) or (maximum is not None and parsed > maximum):
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
