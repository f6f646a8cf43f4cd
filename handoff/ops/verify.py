"""`verify`: the probe's facts compared with the role's needs; every miss comes with its fix.

The facts come from one probe per host (handoff.host.facts): deploy runs the same probe as its
first step, so verifying costs no extra round trip. `evaluate` turns facts + role + vars
into a Verdict (a list of Checks with what was wanted, what was found and the fix);
`probe_step` is deploy's and verify's first step; `install_missing` is `verify --install`
(handoff.host.remote_code.install on the host).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from handoff import console
from handoff.config.layout import RemoteLayout, key_record
from handoff.config.roles import Preflight, Role, version_in_range
from handoff.config.templates import render_argv, render_value, unset_vars
from handoff.errors import HandoffError, RoleError
from handoff.host import remote_code
from handoff.host.facts import (
    KEY_FILE,
    KEY_RECORD,
    SELF_PYTHON,
    Facts,
    PreflightFacts,
    check_vars,
    disk_needed,
    disk_short,
    gather,
)
from handoff.host.session import sh_path
from handoff.host.targets import Target
from handoff.run.parallel import HostReport
from handoff.run.plan import HostContext, Skipped, Step
from payload import units


@dataclass
class Check:
    name: str
    want: str
    have: str
    ok: bool
    fix: str = ""
    installable: str | None = None  # pip requirement, when `verify --install` can fix it
    skipped: bool = False  # could not be checked yet (not a failure); `fix` says what unblocks it


@dataclass
class Verdict:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def missing(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


def evaluate(facts: Facts, role: Role | None, variables: dict[str, Any],
             flags: str = "") -> Verdict:
    """Compare probe facts with the role's requirements; every miss carries its fix.
    `flags`: the `--host … --role …` of this host, so a suggested command acts on it alone
    (a bare `fab verify --install` would act on every remembered host)."""
    v = Verdict()
    python = str(variables.get("python", "python3"))
    want_py = role.requires.python if role else (3, 10)
    have_py = ".".join(map(str, facts.python))
    v.checks.append(Check(
        "python", ">= " + ".".join(map(str, want_py)), f"{have_py} ({facts.executable})",
        facts.python[: len(want_py)] >= want_py,
        f"install python {'.'.join(map(str, want_py))}+ on the host and set the `python` var "
        f"to it (now {python!r})",
    ))
    if role is None:
        return v
    layout = RemoteLayout.of(variables)
    remote_dir = layout.root
    for module, present in facts.modules.items():
        pip_req = role.install.get(module)
        if pip_req:
            fix = (f"fab verify --install{' ' + flags if flags else ''} (pip-installs {pip_req} "
                   f"into {layout.venv}), or "
                   f"on the host: {python} -m pip install {shlex.quote(pip_req)}")
        elif module in role.requires.fixes:
            fix = _fill(role.requires.fixes[module], variables)
        else:
            fix = f"install the {module!r} module into {python} on the host (see the role's docs)"
        v.checks.append(Check(f"module {module}", "importable", "yes" if present else "missing",
                              bool(present), fix, pip_req if not present else None))
    for command, path in facts.commands.items():
        v.checks.append(Check(f"command {command}", "on PATH", path or "missing", bool(path),
                              f"install {command} on the host (e.g. apt-get install {command})"))
    for module, spec in role.requires.versions_needed(variables).items():
        if module in facts.versions:
            v.checks.append(_version_check(module, spec, facts.versions[module], variables, role))
    need_gpus = role.requires.gpus_needed(variables)
    if need_gpus > 0:
        gpus = facts.gpus
        have = len(gpus) if gpus else 0
        fix = ("nvidia-smi not found: install the NVIDIA driver / use a CUDA image"
               if gpus is None else f"this host has {have} GPU(s); set `gpus` to at most {have} or use a bigger host")
        v.checks.append(Check("CUDA GPUs", f">= {need_gpus}", "no nvidia-smi" if gpus is None else str(have),
                              have >= need_gpus, fix))
    if role.requires.cuda_torch and "torch" in facts.modules and need_gpus > 0:
        v.checks.append(_torch_check(facts, max(need_gpus, 1), variables))
    if role.requires.disk_gb > 0:
        free = facts.disk_free
        want = disk_needed(role)
        v.checks.append(Check("free disk", f">= {units.size(want)}", units.size(free),
                              free is not None and free >= want,
                              f"free space under {remote_dir} or set `remote_dir` to a bigger volume"))
    for template, fix in role.requires.files.items():
        v.checks.append(_file_check(facts, template, _fill(fix, variables), variables))
    if role.preflight is not None and facts.preflight_wanted:
        v.checks.append(_preflight_check(facts, role, variables))
    return v


def _fill(text: str, variables: dict[str, Any]) -> str:
    """A fix text with its `{var}`s filled where they are set (left as written otherwise)."""
    try:
        return render_value(text, variables) or text
    except (KeyError, ValueError, IndexError, RoleError):
        return text


def _version_check(module: str, spec: str, got: str, variables: dict[str, Any],
                   role: Role) -> Check:
    """The module's __version__ against the role's range; an import that fails says why."""
    fix = _fill(role.requires.fixes.get(module, ""), variables) or \
        f"install {module}{spec} into the `python` var's interpreter"
    if got.startswith("error: "):
        return Check(f"{module} version", spec, f"import failed: {got[7:]}", False, fix)
    return Check(f"{module} version", spec, got or "no __version__", version_in_range(got, spec),
                 fix)


def _torch_check(facts: Facts, need: int, variables: dict[str, Any]) -> Check:
    name, want = "CUDA via torch", f"available, >= {need} GPU(s)"
    t = facts.torch
    if not facts.modules.get("torch"):
        return Check(name, want, "not checked: torch is missing", False,
                     "install a CUDA build of torch first (see `module torch`)")
    if t is None or t.error is not None:
        err = t.error if t is not None else "no answer"
        return Check(name, want, f"import torch failed: {err}", False,
                     f"repair torch in {variables.get('python', 'python3')} on the host (run the import by hand)")
    gpus = t.gpus
    have = (f"torch {t.version}, CUDA {t.cuda or 'none (CPU build)'}, "
            f"available {'yes' if t.available else 'no'}, {gpus} GPU(s)")
    ok = t.available and gpus >= need
    if not t.cuda:
        fix = "this torch is a CPU build: install the CUDA build matching the driver (see `module torch`)"
    elif not t.available:
        fix = (f"torch is built for CUDA {t.cuda} but sees no GPU: check the driver (nvidia-smi) "
               f"supports CUDA {t.cuda}, CUDA_VISIBLE_DEVICES, and the container's GPU passthrough")
    else:
        fix = f"torch sees {gpus} GPU(s): set `gpus` (and `ranks`) to at most {gpus}, or use a bigger host"
    return Check(name, want, have, ok, fix)


def _file_check(facts: Facts, template: str, fix: str, variables: dict[str, Any]) -> Check:
    unset = unset_vars(template, variables)
    if unset:
        return Check(f"file {template}", "exists", f"var {', '.join(unset)} unset", False, fix)
    info = facts.need.get(template)
    path = (info.path if info is not None else "") or str(render_value(template, variables))
    exists = info is not None and info.exists
    return Check(f"file {path}", "exists", "yes" if exists else "missing", exists, fix)


def _preflight_check(facts: Facts, role: Role, variables: dict[str, Any]) -> Check:
    pf = role.preflight
    assert pf is not None
    cv = check_vars(role, variables)
    name, want = pf.name, "fits (exit 0)"
    tops = [t for t in pf.run if isinstance(t, str)] + list(pf.needs)
    unset = sorted({m for t in tops for m in unset_vars(t, cv)})
    if unset:
        return Check(name, want, f"not run: var {', '.join(unset)} unset", True,
                     f"set {', '.join(unset)} in the inventory vars to check this before launch "
                     f"(launch runs the same check on the host anyway)", skipped=True)
    res = facts.preflight or PreflightFacts()
    if res.missing:
        paths = [str(render_value(t, cv)) for t in res.missing]
        fixes = "; ".join(_fill(pf.needs[t], variables) for t in res.missing)
        return Check(name, want, f"not run: {', '.join(paths)} not on the host", True, fixes, skipped=True)
    if res.modules:  # the preflight is the role's own code: it needs them too
        return Check(name, want, f"not run: needs {', '.join(res.modules)} first", True,
                     "install the missing modules (fixes above), then verify again", skipped=True)
    lines = res.out.strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else None
    except ValueError:
        verdict = None
    if not isinstance(verdict, dict) or "fits" not in verdict:
        err = (res.err.strip().splitlines() or ["no output"])[-1]
        return Check(name, want, f"failed (exit {res.rc}): {console.r(err)}", False,
                     f"run it on the host to see why: {_shown_command(pf, cv, variables)}")
    return _estimate_check(name, want, verdict, res.rc == 0, cv)


def _shown_command(pf: Preflight, cv: dict[str, Any], variables: dict[str, Any]) -> str:
    """The preflight as a person would paste it into a shell on the host (`~/` kept live)."""
    parts = []
    for template, value in render_argv(pf.run, cv, "preflight"):
        parts.append(str(variables.get("python", "python3")) if value == SELF_PYTHON
                     else sh_path(value) if template != "{python}" else value)
    return " ".join(parts)


def _size(n: Any) -> str:
    return units.size(n) if isinstance(n, (int, float)) else "?"


def _estimate_check(name: str, want: str, d: dict[str, Any], rc_ok: bool, cv: dict[str, Any]) -> Check:
    """The preflight's JSON verdict with its numbers (the extractor's disk estimate)."""
    est, free, reserve = d.get("estimate_bytes"), d.get("free_bytes"), d.get("reserve_bytes") or 0
    # what the files hold, when the payload says (fp8 features, gzip counted uncompressed)
    form = "".join(f", {v}" for v in (_text(d.get("feature_dtype")), _text(d.get("compress")))
                   if v)
    have = (f"{_size(est)} for {d.get('samples', '?')} samples / {d.get('tokens', '?')} tokens "
            f"({d.get('bytes_per_token', '?')} B/token{form}, {d.get('already_done', 0)} already "
            f"done); {_size(free)} free, {_size(reserve)} reserve")
    ok = bool(d.get("fits")) and rc_ok
    need = (est or 0) + reserve
    fix = (f"needs {_size(need)} but {_size(free)} free under {cv.get('job_dir')}: free space there, "
           f"point `remote_dir` at a bigger volume, shard over more hosts, or lower `max_length`")
    if d.get("format") == "speculators" and d.get("feature_dtype") != "float8_e4m3fn":
        fix += "; or halve it: `feature_dtype: fp8` (speculators reads it)"
    return Check(name, want, have, ok, fix)


def _text(value: Any) -> str:
    """A short plain word from the host's JSON, or "" (a number, a list: not shown)."""
    return value[:40] if isinstance(value, str) else ""


def report_verdict(report: HostReport, verdict: Verdict, show_all: bool = True) -> None:
    rows = []
    for c in verdict.checks:
        if not show_all and c.ok:
            continue
        mark = "[yellow]skipped[/]" if c.skipped else "[green]ok[/]" if c.ok else "[bold red]missing[/]"
        shown_fix = console.r(c.fix) if (c.skipped or not c.ok) else ""
        rows.append([console.r(c.name), console.r(c.want), console.r(c.have), mark, shown_fix])
    if rows:
        report.log(console.table(None, ["check", "want", "have", "", "fix"], rows))
    report.data_as(Verified).checks = [c.__dict__ for c in verdict.checks]


def install_missing(ctx: HostContext, verdict: Verdict) -> bool:
    """pip-install the missing installable modules into `<remote_dir>/venv`; True if tried."""
    reqs = [c.installable for c in verdict.missing if c.installable]
    if not reqs:
        return False
    ctx.ready()  # pip-installing changes the host: not before the plan's key is known readable
    venv_dir = ctx.session.target.layout.venv
    ctx.report.log(f"installing {console.r(', '.join(reqs))} into {console.r(venv_dir)} …")
    res = ctx.session.run_code(remote_code.INSTALL, {"venv": venv_dir, "reqs": reqs},
                               "pip install", timeout=900)
    if res["rc"] != 0:
        tail = " / ".join(str(res["out"]).strip().splitlines()[-3:])
        ctx.report.log(f"[red]pip install failed:[/] {console.r(tail)} (does the host reach a package index?)")
    else:
        ctx.report.log(f"installed; the host's python is now {console.r(res['python'])}")
    return True


# --- the probe as a plan step (deploy's and verify's first) -------------------------------


def probe_step(target: Target, *, check: bool, install: bool = False, key: bool = False,
               shard: str | None = None, preflight: bool = False, dirs: list[str] | None = None,
               show_all: bool = False) -> Step:
    """Probe the host (one round trip) and, with `check`, hold it against the role.

    `key` also hashes the placed key (push-key compares it on the host), `dirs` are the
    folders later steps may create, `shard` the share a launch over the same targets
    would give this host, `preflight` runs the role's preflight (`fab verify` only: it may
    tokenize the whole input), `show_all` prints every check rather than only the misses.
    """
    role = target.role
    req = role.requires if role else None
    wants = []
    if req:
        wants.append("python >= " + ".".join(map(str, req.python)))
        wants += req.modules_needed(target.vars) + req.commands_needed(target.vars)
        wants += [f"{m} {r}" for m, r in req.versions_needed(target.vars).items()]
        if req.gpus_needed(target.vars):
            wants.append(f"{req.gpus_needed(target.vars)} CUDA GPU(s)")
        if req.disk_gb:
            wants.append(f"{req.disk_gb:g} GB free")
        if req.cuda_torch and req.gpus_needed(target.vars):
            wants.append("CUDA through torch")
        wants += [render_value(f, target.vars) or f for f in req.files]
        if preflight and role is not None and role.preflight is not None:
            wants.append(role.preflight.name + (f" (shard {shard})" if shard else ""))
    name = role.name if role else "no role"
    desc = f"probe the host and check role {name}: {', '.join(wants)}" if check else "probe the host (read-only)"
    detail = f"{target.vars['python']} -c <remote_code/probe.py> (one round trip, reads only)"
    if install:
        detail += f"; pip-install missing modules into {target.layout.venv}"
    return Step("probe", desc, detail, "always",
                Probe(check=check, install=install, key=key, shard=shard,
                      preflight=check and preflight, dirs=list(dirs or []), show_all=show_all),
                run=_probe, changes=False)


@dataclass
class Verified:
    """A host's verify result: every check as a record, and the verdict."""

    checks: list[dict[str, Any]] = field(default_factory=list)
    verdict: Verdict | None = None


@dataclass(frozen=True)
class Probe:
    """What the probe step of deploy/verify reads: check the role's needs (or only room),
    `--install`, hash the key file, the shard a preflight checks, the folders to report."""

    check: bool
    install: bool = False
    key: bool = False
    shard: str | None = None
    preflight: bool = False
    dirs: list[str] = field(default_factory=list)
    show_all: bool = False


def _probe(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    p = step.args(Probe)
    key_path = str(s.vars["key_path"])
    files = {KEY_FILE: key_path, KEY_RECORD: key_record(key_path)} if p.key else {}
    role = s.target.role
    check = p.check

    def probe() -> Facts:
        ctx.facts = gather(s, role, files=files, dirs=list(p.dirs), deep=check,
                           shard=p.shard, preflight=p.preflight)
        return ctx.facts

    facts = probe()
    if not check:
        # push-script and push-key check only what they need: room under remote_dir.
        short = disk_short(facts, role, s.layout.root)
        if short:
            raise HandoffError(f"{s.label}: {short}; nothing was changed")
        return Skipped(f"probed (python {'.'.join(map(str, facts.python))})")
    verdict = evaluate(facts, role, s.vars, s.target.flags())
    if not verdict.ok and p.install and install_missing(ctx, verdict):
        verdict = evaluate(probe(), role, s.vars, s.target.flags())
    report_verdict(ctx.report, verdict, show_all=p.show_all)
    ctx.report.data_as(Verified).verdict = verdict
    if not verdict.ok:
        names = ", ".join(c.name for c in verdict.missing)
        raise HandoffError(f"{s.label}: missing {names} (fixes above); nothing was changed")
    return Skipped(f"verified ({len(verdict.checks)} checks ok)")
