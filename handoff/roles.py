"""Roles: one YAML file per kind of container (`roles/<name>.yml`).

A role says declaratively what the container needs (python version, importable
modules, commands, CUDA GPUs, free disk), whether it gets the API key, what
`launch` runs and with which default vars. Adding a kind of container is adding a
file; nothing here knows about "generator" or "extractor".

The launch command is a list of argv tokens with `{var}` placeholders. Every token
is shell-quoted when rendered, except `{python}` alone (it may be a command such as
`conda run -n x python`). A nested list is an optional group, dropped when any of
its vars is unset: `[--max-cost, "{max_cost}"]`.
"""

from __future__ import annotations

import json
import shlex
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handoff.errors import RoleError
from handoff.state import REPO_ROOT
from handoff.yamlfile import YamlError, line_of, load

ROLES_DIR = REPO_ROOT / "roles"
_ROLE_KEYS = {"description", "requires", "install", "secret", "vars", "launch", "smoke"}
_REQ_KEYS = {"python", "modules", "commands", "gpus", "disk_gb"}

Token = str | list[str]


@dataclass(frozen=True)
class Requirements:
    python: tuple[int, ...] = (3, 10)
    modules: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    gpus: int | str = 0  # a count, or "{var}" resolved from the host's vars (e.g. "{gpus}")
    disk_gb: float = 0.0

    def gpus_needed(self, variables: dict[str, Any]) -> int:
        if isinstance(self.gpus, int):
            return self.gpus
        value = render_value(self.gpus, variables)
        if value in (None, "", "None"):
            return 1  # the role needs GPUs but the host did not say how many: at least one
        try:
            return int(value)
        except ValueError:
            raise RoleError(f"gpus must be a number, got {value!r}") from None


@dataclass(frozen=True)
class Role:
    name: str
    path: Path
    description: str = ""
    requires: Requirements = field(default_factory=Requirements)
    install: dict[str, str] = field(default_factory=dict)  # module -> pip requirement
    secret: bool = False
    vars: dict[str, Any] = field(default_factory=dict)
    launch: tuple[Token, ...] = ()
    smoke: tuple[Token, ...] = ()


def _fail(path: Path, node: Any, key: Any, message: str) -> RoleError:
    line = line_of(node, key)
    return RoleError(f"{path}:{line}: {message}" if line else f"{path}: {message}")


def _tokens(path: Path, data: Any, key: str) -> tuple[Token, ...]:
    raw = data.get(key) or []
    if not isinstance(raw, list):
        raise _fail(path, data, key, f"{key} must be a list of argv tokens")
    out: list[Token] = []
    for tok in raw:
        if isinstance(tok, list) and all(isinstance(t, (str, int, float)) for t in tok):
            out.append([str(t) for t in tok])
        elif isinstance(tok, (str, int, float)):
            out.append(str(tok))
        else:
            raise _fail(path, data, key, f"{key}: bad token {tok!r} (a string or a list)")
    return tuple(out)


def parse_version(text: str) -> tuple[int, ...]:
    text = text.strip().lstrip(">=").strip()
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        raise RoleError(f"bad python version requirement {text!r} (want e.g. '>=3.10')") from None


def load_role(path: Path) -> Role:
    try:
        data = load(path)
    except YamlError as exc:
        raise RoleError(str(exc)) from None
    if not isinstance(data, dict):
        raise RoleError(f"{path}: a role file must be a mapping")
    for key in data:
        if key not in _ROLE_KEYS:
            raise _fail(path, data, key, f"unknown key {key!r} (known: {', '.join(sorted(_ROLE_KEYS))})")
    req = data.get("requires") or {}
    if not isinstance(req, dict):
        raise _fail(path, data, "requires", "requires must be a mapping")
    for key in req:
        if key not in _REQ_KEYS:
            raise _fail(path, req, key, f"unknown requirement {key!r} (known: {', '.join(sorted(_REQ_KEYS))})")
    for key in ("modules", "commands"):
        if not isinstance(req.get(key, []), list):
            raise _fail(path, req, key, f"{key} must be a list")
    gpus = req.get("gpus", 0)
    if not isinstance(gpus, (int, str)) or isinstance(gpus, bool):
        raise _fail(path, req, "gpus", "gpus must be a number or a '{var}'")
    requires = Requirements(
        python=parse_version(str(req.get("python", ">=3.10"))),
        modules=tuple(str(m) for m in req.get("modules", [])),
        commands=tuple(str(c) for c in req.get("commands", [])),
        gpus=gpus,
        disk_gb=float(req.get("disk_gb", 0) or 0),
    )
    for key in ("install", "vars"):
        if not isinstance(data.get(key) or {}, dict):
            raise _fail(path, data, key, f"{key} must be a mapping")
    secret = data.get("secret")
    if secret not in (None, False, "none", "openrouter", True):
        raise _fail(path, data, "secret", "secret must be `openrouter` or `none`")
    return Role(
        name=path.stem,
        path=path,
        description=str(data.get("description", "")).strip(),
        requires=requires,
        install={str(k): str(v) for k, v in (data.get("install") or {}).items()},
        secret=secret in ("openrouter", True),
        vars=dict(data.get("vars") or {}),
        launch=_tokens(path, data, "launch"),
        smoke=_tokens(path, data, "smoke"),
    )


def roles_dir() -> Path:
    return ROLES_DIR


def known_roles(directory: Path | None = None) -> list[str]:
    directory = directory or roles_dir()
    return sorted(p.stem for p in directory.glob("*.yml"))


def get_role(name: str, directory: Path | None = None) -> Role:
    directory = directory or roles_dir()
    path = directory / f"{name}.yml"
    if not path.is_file():
        known = ", ".join(known_roles(directory)) or "none"
        raise RoleError(f"unknown role {name!r}; known roles: {known} (a role is a file in {directory}/)")
    return load_role(path)


# --- rendering ------------------------------------------------------------------------


def _fields(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f]


def _as_text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render_value(template: str, variables: dict[str, Any]) -> str | None:
    """Fill `{var}`s; None when a var is unset (the caller decides if that is an error)."""
    values = {}
    for name in _fields(template):
        value = variables.get(name)
        if value is None:
            return None
        values[name] = _as_text(value)
    return template.format(**values)


def render_command(tokens: tuple[Token, ...], variables: dict[str, Any], what: str) -> str:
    """A shell command line from role tokens; every value quoted except `{python}`."""
    parts: list[str] = []
    for tok in tokens:
        group = tok if isinstance(tok, list) else [tok]
        rendered = [render_value(t, variables) for t in group]
        if any(r is None for r in rendered):
            if isinstance(tok, list):
                continue  # optional group with an unset var
            missing = [f for f in _fields(tok) if variables.get(f) is None]
            raise RoleError(
                f"{what} needs var {', '.join(missing)}; set it in the inventory "
                f"(vars: {{{missing[0]}: ...}}) or pass it as a flag"
            )
        for template, value in zip(group, rendered, strict=True):
            assert value is not None
            parts.append(value if template == "{python}" else shlex.quote(value))
    return " ".join(parts)
