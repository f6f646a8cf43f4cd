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

import json
import math
from dataclasses import dataclass
from typing import Any

from handoff.errors import UsageError


def _describe(minimum: float | None, maximum: float | None, whole: bool,
              above: float | None = None) -> str:
    kind = "a whole number" if whole else "a number"

    def g(x: float) -> str:  # a seed's 2**63 - 1 in full, not 9.22337e+18
        return str(int(x)) if whole else f"{x:g}"

    if above is not None:
        return f"{kind} > {g(above)}"
    if minimum is not None and maximum is not None:
        return f"{kind} from {g(minimum)} to {g(maximum)}"
    if minimum is not None:
        return f"{kind} >= {g(minimum)}" if minimum else f"{kind} >= 0"
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
    "gpus": Rule(whole=True, minimum=0),  # 0: a CPU host (verify asks for no GPU, no CUDA)
    "max_cost": Rule(minimum=0),  # USD for the whole job
    "io_timeout": Rule(minimum=0.1),  # seconds
    "start_watch_s": Rule(minimum=0),  # seconds a fresh job is watched for an instant crash
    "key_limit": Rule(minimum=0),  # USD a minted child key may spend
    "key_ttl_hours": Rule(above=0),  # hours a minted child key lives
    # The generator's sampling (OpenRouter's ranges: temperature 0-2, top_p 0-1).
    "temperature": Rule(minimum=0, maximum=2),
    "top_p": Rule(minimum=0, maximum=1),
    "seed": Rule(whole=True, minimum=0, maximum=2**63 - 1),
    "max_timeouts": Rule(whole=True, minimum=0),  # a prompt's timed-out requests asked again
    # The generator's timeouts (seconds): a stream's silence once its answer began, the
    # wait for its first token, and one request in all.
    "idle_timeout": Rule(above=0),
    "first_token_timeout": Rule(above=0),
    "request_timeout": Rule(above=0),
    # The generator's batch mode: requests per batch, seconds between its first polls.
    "batch_requests": Rule(whole=True, minimum=1),
    "batch_poll": Rule(above=0),
}


def var(name: str, value: Any, *, flag: str | None = None, where: str = "") -> float | int | None:
    """The numeric var `name` checked by its rule (None stays None). The message names the
    flag that set it (`--max-cost`) or `var NAME`, after `where` (file:line, a host)."""
    if value is None:
        return None
    rule = VARS[name]
    return number(flag or f"var {name}", value, whole=rule.whole, minimum=rule.minimum,
                  maximum=rule.maximum, where=where, above=rule.above)



# --- the generator's JSON and choice vars ------------------------------------------------

# OpenRouter's `reasoning` object: effort OR a token budget, and whether to leave the text
# out of the answer. A misspelt key would be passed through and ignored by the provider (a
# run at the wrong effort, paid in full), so unknown keys are refused here.
REASONING_EFFORTS = ("max", "xhigh", "high", "medium", "low", "minimal", "none")
REASONING_KEYS = ("effort", "max_tokens", "exclude", "enabled")

# Vars whose value is one of a few words: (the words, what they do).
CHOICES: dict[str, tuple[str, ...]] = {
    "turns": ("last", "all"),  # generator and extractor: which assistant turns
    "token_ids": ("auto", "on", "off"),  # generator: ask the server for the sampled ids
    "mode": ("sync", "batch", "auto"),  # generator: the Batch API (batch), or not (sync)
    "stream": ("auto", "on", "off"),  # generator: streamed answers (off: one JSON body each)
    "on_mismatch": ("keep", "skip"),  # extractor: re-tokenized answers the server counted otherwise
}

# Vars passed to the payload as written: their braces are the payload's placeholders
# (`{reasoning}`, `{content}`), not vars to fill (handoff.config.roles renders them as is).
LITERAL_VARS = frozenset({"completion_format"})


def _label(flag: str | None, name: str, where: str) -> str:
    label = flag or f"var {name}"
    return f"{where}: {label}" if where else label


def json_object(name: str, value: Any, *, flag: str | None = None, where: str = "",
                allow_null: bool = False) -> Any:
    """A JSON object var (`reasoning`, `provider`): a mapping (YAML) or its JSON text (a flag),
    returned as a dict; `null` (with `allow_null`) is kept as the text "null" so the payload
    is told to send none. None stays None (unset)."""
    if value is None:
        return None
    label = _label(flag, name, where)
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise UsageError(f"{label}: expected a JSON object, e.g. '{{\"effort\": \"high\"}}'; "
                             f"{value!r} is not JSON ({exc})") from None
    if parsed is None and allow_null:
        return "null"
    if not isinstance(parsed, dict):
        raise UsageError(f"{label}: expected a JSON object, got {value!r}")
    return parsed


def reasoning(value: Any, *, flag: str | None = None, where: str = "") -> dict[str, Any] | None:
    """The generator's `reasoning` object, checked key by key (see REASONING_KEYS)."""
    obj = json_object("reasoning", value, flag=flag, where=where)
    if obj is None:
        return None
    label = _label(flag, "reasoning", where)
    unknown = [k for k in obj if k not in REASONING_KEYS]
    if unknown:
        raise UsageError(f"{label}: unknown key{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))} (known: {', '.join(REASONING_KEYS)})")
    effort = obj.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise UsageError(f"{label}: effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}")
    if "max_tokens" in obj:
        number(f"{label} max_tokens", obj["max_tokens"], whole=True, minimum=1)
        if effort is not None:
            raise UsageError(f"{label}: give effort or max_tokens, not both (OpenRouter takes one)")
    for key in ("exclude", "enabled"):
        if key in obj and not isinstance(obj[key], bool):
            raise UsageError(f"{label}: {key} must be true or false, got {obj[key]!r}")
    return obj


def choice(name: str, value: Any, *, flag: str | None = None, where: str = "") -> str | None:
    """A var that is one of CHOICES[name]; None stays None."""
    if value is None:
        return None
    words = CHOICES[name]
    if not isinstance(value, str) or value not in words:
        raise UsageError(f"{_label(flag, name, where)}: expected one of {', '.join(words)}, got {value!r}")
    return value


# The generator's sampling and retry vars (`fab launch` flags of the same names): each
# checked by its rule, in the order the launch plan shows them.
SAMPLING = ("temperature", "top_p", "seed", "reasoning", "provider", "turns", "max_timeouts",
            "token_ids", "mode", "stream", "idle_timeout", "first_token_timeout",
            "request_timeout")


def sampling_var(name: str, value: Any, *, flag: str | None = None, where: str = "") -> Any:
    """One of SAMPLING checked (None stays None): numbers by VARS, `reasoning` and `provider`
    as JSON objects, `turns`/`token_ids` as choices. The message names `flag` (or the var)."""
    if value is None:
        return None
    if name in VARS:
        return var(name, value, flag=flag, where=where)
    if name == "reasoning":
        return reasoning(value, flag=flag, where=where)
    if name == "provider":
        return json_object(name, value, flag=flag, where=where, allow_null=True)
    return choice(name, value, flag=flag, where=where)
