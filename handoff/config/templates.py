"""`{var}` rendering of a role's commands and values (the syntax: handoff.config.roles).

A token is a string with `{var}` placeholders, or a list (an optional group: dropped when
any of its vars is unset; a `{?var}` or `{?var==value}` token in it is a switch). Every
rendered token is shell-quoted except `{python}` alone, which may be a command.
"""

from __future__ import annotations

import json
import re
import shlex
import string
from typing import Any

from handoff.config.flags import LITERAL_VARS
from handoff.errors import RoleError

Token = str | list[str]


class Text(str):
    """A value that is text, never a template: what a host said (its home, and the paths
    made from it) may hold `{…}`, and re-rendering it would let a 30-byte answer such as
    `{base_url:>300000000}` ask for 300 MB. Vars holding a Text are filled in as they are."""

    __slots__ = ()


def template_fields(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f]


def _as_text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_MAX_DEPTH = 8  # vars naming vars: enough for defaults, and a cycle cannot loop forever


def _switch(token: str) -> str | None:
    """The inside of a `{?var}` (or `{?var==value}`, `{?var!=value}`) switch token, else None."""
    if token.startswith("{?") and token.endswith("}") and token.count("{") == 1:
        return token[2:-1]
    return None


def switch_var(inside: str) -> str:
    """The var a switch reads: `backend` of `backend==vllm`."""
    return re.split(r"==|!=", inside, maxsplit=1)[0].strip()


def _switch_holds(inside: str, variables: dict[str, Any]) -> bool:
    """`var`: set and true; `var==value` / `var!=value`: its rendered value compared."""
    m = re.fullmatch(r"\s*([^=!\s]+)\s*(==|!=)\s*(.*?)\s*", inside)
    if not m:
        return _truthy(_lookup(inside, variables, 0))
    name, op, want = m.groups()
    equal = _lookup(name, variables, 0) == want
    return equal if op == "==" else not equal


def _lookup(name: str, variables: dict[str, Any], depth: int) -> str | None:
    value = variables.get(name)
    if value is None:
        return None
    # A literal var's braces are the payload's placeholders ({reasoning}), not vars.
    if isinstance(value, str) and not isinstance(value, Text) and name not in LITERAL_VARS \
            and template_fields(value):
        if depth >= _MAX_DEPTH:
            raise RoleError(f"var {name!r} refers to itself through other vars ({value!r})")
        return _render(value, variables, depth + 1)
    return _as_text(value)


def _render(template: str, variables: dict[str, Any], depth: int) -> str | None:
    values = {}
    for name in template_fields(template):
        value = _lookup(name, variables, depth)
        if value is None:
            return None
        values[name] = value
    return template.format(**values)


def render_value(template: str, variables: dict[str, Any]) -> str | None:
    """Fill `{var}`s (a var's value may name other vars); None when a var is unset."""
    return _render(template, variables, 0)


def unset_vars(template: str, variables: dict[str, Any], depth: int = 0) -> list[str]:
    """The unset vars a template needs, followed through vars naming vars: for `{ranks}`
    with `ranks: "{gpus}"` and no gpus, that is `gpus` (the one to set)."""
    missing: list[str] = []
    for name in template_fields(template):
        value = variables.get(name)
        if value is None:
            missing.append(name)
        elif isinstance(value, str) and not isinstance(value, Text) and name not in LITERAL_VARS \
                and template_fields(value) and depth < _MAX_DEPTH:
            missing += [m for m in unset_vars(value, variables, depth + 1) if m not in missing]
    return missing


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "false", "0", "no", "none", "null")


def render_argv(tokens: tuple[Token, ...], variables: dict[str, Any], what: str) -> list[tuple[str, str]]:
    """(template, value) pairs: optional groups with an unset var or a false switch dropped."""
    out: list[tuple[str, str]] = []
    for tok in tokens:
        group = tok if isinstance(tok, list) else [tok]
        switches = [name for name in map(_switch, group) if name]
        if switches and not all(_switch_holds(inside, variables) for inside in switches):
            continue  # a switch that is off drops its group
        plain = [t for t in group if not _switch(t)]
        rendered = [render_value(t, variables) for t in plain]
        if any(r is None for r in rendered):
            if isinstance(tok, list):
                continue  # optional group with an unset var
            missing = unset_vars(tok, variables)
            raise RoleError(
                f"{what} needs var {', '.join(missing)}; set it in the inventory "
                f"(vars: {{{missing[0]}: ...}}) or pass it as a flag"
            )
        for template, value in zip(plain, rendered, strict=True):
            assert value is not None
            out.append((template, value))
    return out


def render_command(tokens: tuple[Token, ...], variables: dict[str, Any], what: str) -> str:
    """A shell command line from role tokens; every value quoted except `{python}`."""
    return " ".join(value if template == "{python}" else shlex.quote(value)
                    for template, value in render_argv(tokens, variables, what))
