"""Roles: one YAML file per kind of container (`roles/<name>.yml`).

The defaults ship with the package (`handoff/data/roles/`); a `roles/` folder in the
project directory overrides them file by file and may add more (handoff.config.paths).

A role says declaratively what the container needs (python version, importable
modules, commands, CUDA GPUs, free disk), whether it gets the API key, what
`launch` runs and with which default vars, and what `cancel` runs for `fab stop` on a job
that left work at the provider (the generator's live batches). Adding a kind of container is adding a
file; nothing here knows about "generator" or "extractor".

The launch command is a list of argv tokens with `{var}` placeholders. Every token
is shell-quoted when rendered, except `{python}` alone (it may be a command such as
`conda run -n x python`). A nested list is an optional group, dropped when any of
its vars is unset: `[--max-cost, "{max_cost}"]`. A `{?var}` token in a group is a
switch: the group is kept only when the var is set and true, and the token itself
renders nothing: `["{?trust_remote_code}", --trust-remote-code]`. A switch may compare
instead, `{?var==value}` or `{?var!=value}` (an unset var equals nothing), so a group can
follow another var: `["{?backend==vllm}", --tensor-parallel-size, "{tp}"]` passes a
vLLM-only flag only to the vLLM backend, whatever `tp` defaults to.

A var's value may itself name other vars (`ranks: "{gpus}"` as a role default), so a
default can follow another var the inventory sets.

Beyond modules, commands and GPUs a role can ask verify for more, still declaratively:
`requires.modules` entries may be `{module, when, fix}` (needed only when a condition
such as `"{ranks} < {gpus}"` holds; `fix` says how to install it by hand),
`requires.cuda_torch` (torch must see CUDA and enough devices, checked by importing
torch on the host; like the GPU count and a `{command, gpu_only: true}` entry of
`requires.commands` such as nvidia-smi, not asked of a host whose `gpus` is 0: a CPU
host), a module's `version` range (`{module: vllm, version: ">=0.32,<0.33"}`: verify
imports it on the host and compares its `__version__`), `requires.files` (paths that must exist, each with its fix) and a
`preflight` command whose JSON verdict verify reports (see `Preflight`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from handoff.config import paths
from handoff.config.templates import Token, render_value, switch_var, template_fields
from handoff.config.yamlfile import YamlError, line_of, load
from handoff.errors import RoleError, did_you_mean

_ROLE_KEYS = {"description", "requires", "install", "secret", "vars", "launch", "smoke", "preflight",
              "cancel"}
_REQ_KEYS = {"python", "modules", "commands", "gpus", "disk_gb", "cuda_torch", "files"}
_MODULE_KEYS = {"module", "when", "fix", "version"}
_COMMAND_KEYS = {"command", "gpu_only"}
_VERSION = re.compile(r"^\s*(>=|<|==)\s*(\d+(?:\.\d+)*)\s*$")
_PREFLIGHT_KEYS = {"name", "needs", "run", "timeout_s"}
_CONDITION = re.compile(r"^\s*(\S+)\s*(<=|>=|==|!=|<|>)\s*(\S+)\s*$")



@dataclass(frozen=True)
class Module:
    """An importable module the role needs; `when` makes it conditional on the vars."""

    name: str
    when: str | None = None  # e.g. "{ranks} < {gpus}": needed only when it holds
    fix: str = ""  # how to install it by hand, when pip-installing it is not the answer
    version: str = ""  # e.g. ">=0.32,<0.33": its __version__ must fall in this range


def _version_tuple(text: str) -> tuple[int, ...]:
    """The leading numbers of a version string: "0.32.0+cpu" -> (0, 32, 0)."""
    out: list[int] = []
    for part in text.split("+")[0].split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
        if m.group() != part:
            break
    return tuple(out)


def version_in_range(version: str, spec: str) -> bool:
    """Whether `version` satisfies every clause of `spec` (">=0.32,<0.33"; `==0.32` means
    0.32.*). Clauses compare the leading numbers, the length of the clause's own."""
    have = _version_tuple(version)
    if not have:
        return False
    for clause in spec.split(","):
        m = _VERSION.match(clause)
        if not m:
            raise RoleError(f"bad version range {spec!r} (want e.g. '>=0.32,<0.33')")
        op, want = m.group(1), tuple(int(x) for x in m.group(2).split("."))
        mine = have[:len(want)] + (0,) * max(0, len(want) - len(have))
        if not {">=": mine >= want, "<": mine < want, "==": mine == want}[op]:
            return False
    return True


@dataclass(frozen=True)
class Preflight:
    """A read-only command verify runs on the host (under the probe's own python).

    It prints one JSON line and exits 0 when the job fits (e.g. the extractor's disk
    estimate), non-zero when it does not. `needs` maps paths that must exist first to
    the fix when they do not (a payload not pushed yet, an input not placed yet): then
    verify says so instead of running it.
    """

    run: tuple[Token, ...]
    needs: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    name: str = "preflight"  # the check's name in verify's table


def condition_holds(expr: str, variables: dict[str, Any]) -> bool:
    """`"{a} < {b}"` with both sides rendered; numbers compare as numbers. Unset: False."""
    text = render_value(expr, variables)
    if text is None:
        return False
    m = _CONDITION.match(text)
    if not m:
        raise RoleError(f"bad condition {expr!r} (want e.g. '{{ranks}} < {{gpus}}')")
    left, op, right = m.groups()
    try:
        a: float | str = float(left)
        b: float | str = float(right)
    except ValueError:
        a, b = left, right
        if op not in ("==", "!="):
            raise RoleError(f"condition {expr!r}: {left!r} {op} {right!r} needs numbers") from None
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b,  # type: ignore[operator]
            "==": a == b, "!=": a != b}[op]


@dataclass(frozen=True)
class Requirements:
    python: tuple[int, ...] = (3, 10)
    modules: tuple[str, ...] = ()  # always needed
    commands: tuple[str, ...] = ()
    gpus: int | str = 0  # a count, or "{var}" resolved from the host's vars (e.g. "{gpus}")
    disk_gb: float = 0.0
    conditional: tuple[Module, ...] = ()  # needed only when their `when` holds
    fixes: dict[str, str] = field(default_factory=dict)  # module -> how to install it by hand
    cuda_torch: bool = False  # torch must report CUDA available and >= gpus devices
    files: dict[str, str] = field(default_factory=dict)  # path template -> fix when missing
    gpu_commands: tuple[str, ...] = ()  # of `commands`: needed only on a host with GPUs
    versions: dict[str, str] = field(default_factory=dict)  # module -> its version range

    def commands_needed(self, variables: dict[str, Any]) -> list[str]:
        """The commands to look for: a GPU-only one (nvidia-smi) not on a CPU host (gpus 0)."""
        gpus = self.gpus_needed(variables) > 0
        return [c for c in self.commands if gpus or c not in self.gpu_commands]

    def versions_needed(self, variables: dict[str, Any]) -> dict[str, str]:
        """module -> range, for the modules needed here that have one."""
        needed = set(self.modules_needed(variables))
        return {m: r for m, r in self.versions.items() if m in needed}

    def modules_needed(self, variables: dict[str, Any]) -> list[str]:
        return list(self.modules) + [m.name for m in self.conditional
                                     if m.when and condition_holds(m.when, variables)]

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
    preflight: Preflight | None = None
    # What `fab stop` runs on the host for a job that left work at the provider (the
    # generator's live batches), once the job's own process is gone: argv tokens like launch.
    cancel: tuple[Token, ...] = ()

    @property
    def kind(self) -> str:
        """What its jobs are, for how they are shown and estimated: `extractor` when its
        launch runs `payload extract`, else `generator` (the API's client, or a test's job)."""
        return "extractor" if "extract" in [t for t in self.launch if isinstance(t, str)] else "generator"


def _fail(path: Path, node: Any, key: Any, message: str) -> RoleError:
    line = line_of(node, key)
    return RoleError(f"{path}:{line}: {message}" if line else f"{path}: {message}")


def _reject_unknown(path: Path, node: dict[Any, Any], known: frozenset[str] | set[str],
                    what: str) -> None:
    """A misspelt key would otherwise be ignored silently; name it and list the known ones."""
    for key in node:
        if key not in known:
            raise _fail(path, node, key, f"unknown {what} {key!r}{did_you_mean(str(key), known)} "
                                         f"(known: {', '.join(sorted(known))})")


def _commands(path: Path, req: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(every command, the GPU-only ones): entries are a name or {command, gpu_only}."""
    names: list[str] = []
    gpu_only: list[str] = []
    for entry in req.get("commands", []):
        if isinstance(entry, dict):
            _reject_unknown(path, entry, _COMMAND_KEYS, "command key")
            if not isinstance(entry.get("command"), str):
                raise _fail(path, req, "commands", f"commands: bad entry {entry!r} (a name or "
                                                   "{command, gpu_only})")
            names.append(entry["command"])
            if entry.get("gpu_only"):
                gpu_only.append(entry["command"])
        else:
            names.append(str(entry))
    return names, gpu_only


def _modules(path: Path, req: dict[str, Any]) -> tuple[list[str], list[Module], dict[str, str]]:
    plain: list[str] = []
    conditional: list[Module] = []
    fixes: dict[str, str] = {}
    for entry in req.get("modules", []):
        if isinstance(entry, str):
            plain.append(entry)
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("module"), str):
            raise _fail(path, req, "modules", f"modules: bad entry {entry!r} (a name or {{module, when, fix}})")
        unknown = set(entry) - _MODULE_KEYS
        if unknown:
            raise _fail(path, req, "modules", f"modules: unknown key(s) {', '.join(sorted(unknown))} "
                                              f"(known: {', '.join(sorted(_MODULE_KEYS))})")
        when = entry.get("when")
        if when is not None and not _CONDITION.match(str(when)):
            raise _fail(path, req, "modules", f"modules: bad condition {when!r} (want e.g. '{{ranks}} < {{gpus}}')")
        version = str(entry.get("version") or "")
        if version:
            try:
                version_in_range("0", version)
            except RoleError as exc:
                raise _fail(path, req, "modules", f"modules: {exc}") from None
        mod = Module(entry["module"], str(when) if when is not None else None,
                     str(entry.get("fix") or ""), version)
        if mod.fix:
            fixes[mod.name] = mod.fix
        if mod.when:
            conditional.append(mod)
        else:
            plain.append(mod.name)
    return plain, conditional, fixes


def _preflight(path: Path, data: dict[str, Any]) -> Preflight | None:
    raw = data.get("preflight")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _fail(path, data, "preflight", "preflight must be a mapping with `run` (argv tokens) and `needs`")
    _reject_unknown(path, raw, _PREFLIGHT_KEYS, "preflight key")
    needs = raw.get("needs") or {}
    if not isinstance(needs, dict):
        raise _fail(path, raw, "needs", "preflight.needs must map paths to the fix when they are missing")
    run = _tokens(path, raw, "run")
    if not run:
        raise _fail(path, raw, "run", "preflight.run must be a non-empty list of argv tokens")
    return Preflight(run, {str(k): str(v) for k, v in needs.items()}, float(raw.get("timeout_s", 600)),
                     str(raw.get("name") or "preflight"))


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
    _reject_unknown(path, data, _ROLE_KEYS, "key")
    req = data.get("requires") or {}
    if not isinstance(req, dict):
        raise _fail(path, data, "requires", "requires must be a mapping")
    _reject_unknown(path, req, _REQ_KEYS, "requirement")
    for key in ("modules", "commands"):
        if not isinstance(req.get(key, []), list):
            raise _fail(path, req, key, f"{key} must be a list")
    gpus = req.get("gpus", 0)
    if not isinstance(gpus, (int, str)) or isinstance(gpus, bool):
        raise _fail(path, req, "gpus", "gpus must be a number or a '{var}'")
    if not isinstance(req.get("files") or {}, dict):
        raise _fail(path, req, "files", "files must map paths to the fix when they are missing")
    if not isinstance(req.get("cuda_torch", False), bool):
        raise _fail(path, req, "cuda_torch", "cuda_torch must be true or false")
    plain, conditional, fixes = _modules(path, req)
    commands, gpu_commands = _commands(path, req)
    versions = {str(e["module"]): str(e["version"]) for e in req.get("modules", [])
                if isinstance(e, dict) and e.get("version")}
    requires = Requirements(
        python=parse_version(str(req.get("python", ">=3.10"))),
        modules=tuple(plain),
        commands=tuple(commands),
        gpu_commands=tuple(gpu_commands),
        versions=versions,
        gpus=gpus,
        disk_gb=float(req.get("disk_gb", 0) or 0),
        conditional=tuple(conditional),
        fixes=fixes,
        cuda_torch=bool(req.get("cuda_torch", False)),
        files={str(k): str(v) for k, v in (req.get("files") or {}).items()},
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
        preflight=_preflight(path, data),
        cancel=_tokens(path, data, "cancel"),
    )


def var_names(role: Role) -> set[str]:
    """Every var the role defines or reads (`{var}` in its commands, conditions, fixes and
    paths): the names an inventory may set for it besides the built-in ones."""
    texts: list[str] = []

    def tokens(items: tuple[Token, ...]) -> None:
        for tok in items:
            texts.extend(tok if isinstance(tok, list) else [tok])

    tokens(role.launch)
    tokens(role.smoke)
    tokens(role.cancel)
    if role.preflight is not None:
        tokens(role.preflight.run)
        texts.extend(role.preflight.needs)
    req = role.requires
    if isinstance(req.gpus, str):
        texts.append(req.gpus)
    texts.extend(m.when for m in req.conditional if m.when)
    texts.extend(req.fixes.values())
    texts.extend(req.files)
    texts.extend(str(v) for v in role.vars.values() if isinstance(v, str))
    names = set(role.vars)
    for text in texts:
        if text.startswith("{?") and text.endswith("}"):
            names.add(switch_var(text[2:-1]))
            continue
        try:
            names.update(f.split(".")[0].split("[")[0] for f in template_fields(text))
        except ValueError:  # a literal brace in a fix text: no var there
            continue
    return names


def _dirs(directory: Path | None) -> list[Path]:
    return [directory] if directory is not None else paths.roles_dirs()


def known_roles(directory: Path | None = None) -> list[str]:
    """Role names in `directory`, else in the project's roles/ and the shipped defaults."""
    return sorted({p.stem for d in _dirs(directory) for p in d.glob("*.yml")})


def role_path(name: str, directory: Path | None = None) -> Path:
    """The file that defines role `name`: the first of the role folders that has it."""
    folders = _dirs(directory)
    for folder in folders:
        path = folder / f"{name}.yml"
        if path.is_file():
            return path
    known = ", ".join(known_roles(directory)) or "none"
    raise RoleError(f"unknown role {name!r}; known roles: {known} (a role is a file in "
                    f"{folders[0]}/)")


def get_role(name: str, directory: Path | None = None) -> Role:
    path = role_path(name, directory)
    st = path.stat()
    return _load_role_cached(path, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=32)
def _load_role_cached(path: Path, mtime_ns: int, size: int) -> Role:
    """Each host's target resolves its role: parse a file once per run, not once per host.
    Keyed by mtime and size so an edited role file is read again (Role is frozen: sharing
    one instance among targets is safe)."""
    return load_role(path)
