"""`verify`: one probe per host, one round trip, compared with the role's needs.

The probe is a small python snippet run by the host's python. It reports, as one
JSON object: python version, which modules are importable (`find_spec`, no import,
so it is nearly free), commands on PATH, CUDA GPUs (`nvidia-smi -L`, only when the
role needs GPUs), free disk under remote_dir, plus the deploy state that later steps
need (releases present, where `current` points, size/mode/owner/sha256 of chosen
files such as the placed key). Deploy uses the same probe, so a no-op redeploy is
one round trip per host. The probe only reads; it hashes the key file on the host
and returns the hash, never the content.

When verify checks a role (`deep`), the same round trip also runs what the role file
asks for beyond that: `requires.cuda_torch` imports torch in a child of the probe's
python (only when torch is importable: it costs seconds, so roles that do not ask,
like the generator, keep a single cheap probe), `requires.files` are stat'ed, and the
role's `preflight` command runs under the probe's own python once the paths it
`needs` exist (e.g. the extractor's disk estimate, which needs the pushed payload and
the input on the host) and the role's modules import; when they do not, the verdict
says which and how to fix it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from handoff import console
from handoff.errors import RoleError
from handoff.parallel import HostReport
from handoff.remote import Session, sh_path
from handoff.roles import Preflight, Role, render_argv, render_value, unset_vars

# Eight of these run at once on small hosts, so the probe's own CPU shows in every deploy:
# modules only some requests need (hashlib, shutil, subprocess) are imported where used.
PROBE = r"""
import importlib.util, json, os, sys
a = json.loads(sys.argv[1])
home = os.path.expanduser("~")
def ab(p):
    return home if p == "~" else (os.path.join(home, p[2:]) if p.startswith("~/") else p)
def info(p):
    p = ab(p)
    try:
        st = os.stat(p)
    except OSError:
        return {"path": p, "exists": False}
    d = {"path": p, "exists": True, "size": st.st_size, "mode": st.st_mode & 0o7777,
         "uid": st.st_uid, "mtime": st.st_mtime}
    if a.get("hash") and os.path.isfile(p):
        import hashlib
        h = hashlib.sha256()
        try:
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            d["sha256"] = h.hexdigest()
        except OSError as e:
            d["error"] = str(e)
    return d
def found(m):
    try:
        return importlib.util.find_spec(m) is not None
    except Exception:
        return False
rd = ab(a["remote_dir"])
r = {"python": list(sys.version_info[:3]), "executable": sys.executable, "home": home,
     "uid": os.getuid(), "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
     "modules": dict((m, found(m)) for m in a.get("modules", [])),
     "remote_dir": rd}
if a.get("commands") or a.get("gpus"):
    import shutil
    r["commands"] = dict((c, shutil.which(c)) for c in a.get("commands", []))
else:
    r["commands"] = {}
if a.get("gpus"):
    smi = shutil.which("nvidia-smi")
    if smi:
        import subprocess
        try:
            out = subprocess.run([smi, "-L"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 timeout=20).stdout.decode()
            r["gpus"] = [l for l in out.splitlines() if l.startswith("GPU ")]
        except Exception as e:
            r["gpus"] = []
            r["gpu_error"] = str(e)
    else:
        r["gpus"] = None
p = rd
while not os.path.isdir(p) and p != os.path.dirname(p):
    p = os.path.dirname(p)
try:
    st = os.statvfs(p)
    r["disk_free"] = st.f_bavail * st.f_frsize
except OSError:
    r["disk_free"] = None
rel = os.path.join(rd, "releases")
releases = []
if os.path.isdir(rel):
    for name in os.listdir(rel):
        path = os.path.join(rel, name)
        if os.path.isdir(path) and not name.startswith("."):
            pyz = os.path.join(path, "payload.pyz")
            releases.append({"name": name, "mtime": os.stat(path).st_mtime,
                             "size": os.path.getsize(pyz) if os.path.isfile(pyz) else None})
r["releases"] = sorted(releases, key=lambda x: x["mtime"])
try:
    r["current"] = os.readlink(os.path.join(rd, "current"))
except OSError:
    r["current"] = None
r["dirs"] = dict((ab(d), os.path.isdir(ab(d))) for d in a.get("dirs", []))
r["files"] = dict((k, info(v)) for k, v in a.get("files", {}).items())
def run(argv, timeout):
    import subprocess
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout, cwd=home)
        return {"rc": p.returncode, "out": p.stdout.decode(errors="replace")[-4000:],
                "err": p.stderr.decode(errors="replace")[-2000:]}
    except Exception as e:
        return {"rc": None, "out": "", "err": "%s: %s" % (type(e).__name__, e)}
if a.get("torch_cuda") and found("torch"):
    t = run([sys.executable, "-c", a["torch_snippet"]], 180)
    try:
        r["torch"] = json.loads(t["out"].strip().splitlines()[-1])
    except Exception:
        r["torch"] = {"error": (t["err"].strip().splitlines() or ["exit %s" % t["rc"]])[-1]}
r["need"] = dict((k, {"path": ab(v), "exists": os.path.exists(ab(v))})
                 for k, v in a.get("need", {}).items())
r["preflight_wanted"] = bool(a.get("preflight_wanted"))
pf = a.get("preflight")
if pf:
    missing = [k for k, v in pf["needs"].items() if not os.path.exists(ab(v))]
    absent = [m for m, ok in r["modules"].items() if not ok]
    if missing:
        r["preflight"] = {"missing": missing}
    elif absent:
        r["preflight"] = {"modules": absent}
    else:
        argv = [sys.executable if x == pf["self"] else ab(x) if x.startswith("~/") else x
                for x in pf["argv"]]
        r["preflight"] = run(argv, pf["timeout"])
print(json.dumps(r))
"""

# The CUDA check goes through torch, not only nvidia-smi: a CPU wheel, or a wheel built
# for a newer CUDA than the driver, shows GPUs in nvidia-smi and none to torch.
TORCH_CUDA = (
    "import json,torch;print(json.dumps({'torch':torch.__version__,'cuda':torch.version.cuda,"
    "'available':torch.cuda.is_available(),'gpus':torch.cuda.device_count()}))"
)
# Stands for `{python}` in a preflight argv: the probe runs it with its own interpreter,
# the one verify just checked (it may be the venv `verify --install` made).
SELF_PYTHON = "@@probe-python@@"


@dataclass
class Facts:
    raw: dict[str, Any]

    @property
    def python(self) -> tuple[int, ...]:
        return tuple(self.raw["python"])

    @property
    def home(self) -> str:
        return str(self.raw["home"])

    @property
    def uid(self) -> int:
        return int(self.raw["uid"])

    def file(self, name: str) -> dict[str, Any]:
        return dict(self.raw.get("files", {}).get(name) or {"exists": False})

    @property
    def dirs(self) -> dict[str, bool]:
        """Absolute path -> is a directory, for the folders the probe was asked about."""
        return {str(k): bool(v) for k, v in (self.raw.get("dirs") or {}).items()}

    @property
    def releases(self) -> list[dict[str, Any]]:
        return list(self.raw.get("releases", []))

    @property
    def current(self) -> str | None:
        cur = self.raw.get("current")
        return str(cur) if cur else None


def check_vars(role: Role, variables: dict[str, Any], shard: str | None = None) -> dict[str, Any]:
    """The vars a role's checks render with: the job's folder as launch will use it, the
    shard this host would get, and `{python}` as the probe's own interpreter."""
    v = dict(variables)
    job = v.get("job") or role.name
    v.setdefault("job_dir", f"{str(v.get('remote_dir', '~/.handoff')).rstrip('/')}/jobs/{job}")
    v["shard"] = shard
    v["python"] = SELF_PYTHON
    return v


def deep_args(role: Role, variables: dict[str, Any], shard: str | None,
              preflight: bool = True) -> dict[str, Any]:
    """The probe's extra work for a role check: torch/CUDA, required files, the preflight
    (when asked: it may tokenize the whole input, so only `fab verify` runs it)."""
    v = check_vars(role, variables, shard)
    args: dict[str, Any] = {"torch_cuda": role.requires.cuda_torch, "torch_snippet": TORCH_CUDA}
    need = {}
    for template in role.requires.files:
        path = render_value(template, v)
        if path is not None:
            need[template] = path
    args["need"] = need
    pf = role.preflight if preflight else None
    args["preflight_wanted"] = pf is not None
    if pf is not None:
        needs = {t: render_value(t, v) for t in pf.needs}
        try:
            argv = [value for _, value in render_argv(pf.run, v, "preflight")]
        except RoleError:
            argv = []  # a var it needs is unset: evaluate() names it; nothing to run
        if argv and all(path is not None for path in needs.values()):
            args["preflight"] = {"argv": argv, "needs": needs, "self": SELF_PYTHON,
                                 "timeout": pf.timeout_s}
    return args


def probe(
    session: Session,
    role: Role | None,
    files: dict[str, str] | None = None,
    dirs: list[str] | None = None,
    hash_files: bool = True,
    *,
    deep: bool = False,
    shard: str | None = None,
    preflight: bool = False,
) -> Facts:
    """One round trip. `deep` (verify checking `role`) adds the role's torch/file checks,
    `preflight` its preflight command; `shard` is the `I/N` this host would get from a
    launch over the same targets."""
    req = role.requires if role else None
    args: dict[str, Any] = {
        "remote_dir": str(session.vars["remote_dir"]),
        "modules": req.modules_needed(session.vars) if req else [],
        "commands": list(req.commands) if req else [],
        "gpus": bool(req and req.gpus_needed(session.vars) > 0),
        "files": files or {},
        "dirs": dirs or [],
        "hash": hash_files,
    }
    timeout = 120.0
    if deep and role is not None:
        args.update(deep_args(role, session.vars, shard, preflight))
        timeout += 180.0 + (role.preflight.timeout_s if role.preflight and preflight else 0.0)
    facts = Facts(session.py(PROBE, args, "probe", timeout=timeout))
    session.home = facts.home
    return facts


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


def _gb(n: float | None) -> str:
    return "?" if n is None else f"{n / 1e9:.1f} GB"


def evaluate(facts: Facts, role: Role | None, variables: dict[str, Any]) -> Verdict:
    """Compare probe facts with the role's requirements; every miss carries its fix."""
    v = Verdict()
    python = str(variables.get("python", "python3"))
    want_py = role.requires.python if role else (3, 10)
    have_py = ".".join(map(str, facts.python))
    v.checks.append(Check(
        "python", ">= " + ".".join(map(str, want_py)), f"{have_py} ({facts.raw.get('executable')})",
        facts.python[: len(want_py)] >= want_py,
        f"install python {'.'.join(map(str, want_py))}+ on the host and set the `python` var "
        f"to it (now {python!r})",
    ))
    if role is None:
        return v
    remote_dir = str(variables.get("remote_dir", "~/.handoff"))
    for module, present in facts.raw.get("modules", {}).items():
        pip_req = role.install.get(module)
        if pip_req:
            fix = (f"fab verify --install (pip-installs {pip_req} into {remote_dir}/venv), or "
                   f"on the host: {python} -m pip install {shlex.quote(pip_req)}")
        elif module in role.requires.fixes:
            fix = _fill(role.requires.fixes[module], variables)
        else:
            fix = f"install the {module!r} module into {python} on the host (see the role's docs)"
        v.checks.append(Check(f"module {module}", "importable", "yes" if present else "missing",
                              bool(present), fix, pip_req if not present else None))
    for command, path in facts.raw.get("commands", {}).items():
        v.checks.append(Check(f"command {command}", "on PATH", path or "missing", bool(path),
                              f"install {command} on the host (e.g. apt-get install {command})"))
    need_gpus = role.requires.gpus_needed(variables)
    if need_gpus > 0:
        gpus = facts.raw.get("gpus")
        have = len(gpus) if gpus else 0
        fix = ("nvidia-smi not found: install the NVIDIA driver / use a CUDA image"
               if gpus is None else f"this host has {have} GPU(s); set `gpus` to at most {have} or use a bigger host")
        v.checks.append(Check("CUDA GPUs", f">= {need_gpus}", "no nvidia-smi" if gpus is None else str(have),
                              have >= need_gpus, fix))
    if role.requires.cuda_torch and "torch" in facts.raw.get("modules", {}):
        v.checks.append(_torch_check(facts, max(need_gpus, 1), variables))
    if role.requires.disk_gb > 0:
        free = facts.raw.get("disk_free")
        want = role.requires.disk_gb * 1e9
        v.checks.append(Check("free disk", f">= {_gb(want)}", _gb(free), free is not None and free >= want,
                              f"free space under {remote_dir} or set `remote_dir` to a bigger volume"))
    for template, fix in role.requires.files.items():
        v.checks.append(_file_check(facts, template, _fill(fix, variables), variables))
    if role.preflight is not None and facts.raw.get("preflight_wanted"):
        v.checks.append(_preflight_check(facts, role, variables))
    return v


def _fill(text: str, variables: dict[str, Any]) -> str:
    """A fix text with its `{var}`s filled where they are set (left as written otherwise)."""
    try:
        return render_value(text, variables) or text
    except (KeyError, ValueError, IndexError, RoleError):
        return text


def _torch_check(facts: Facts, need: int, variables: dict[str, Any]) -> Check:
    name, want = "CUDA via torch", f"available, >= {need} GPU(s)"
    t = facts.raw.get("torch")
    if not facts.raw.get("modules", {}).get("torch"):
        return Check(name, want, "not checked: torch is missing", False,
                     "install a CUDA build of torch first (see `module torch`)")
    if not isinstance(t, dict) or "error" in t:
        err = t.get("error") if isinstance(t, dict) else "no answer"
        return Check(name, want, f"import torch failed: {err}", False,
                     f"repair torch in {variables.get('python', 'python3')} on the host (run the import by hand)")
    gpus = int(t.get("gpus") or 0)
    have = (f"torch {t.get('torch')}, CUDA {t.get('cuda') or 'none (CPU build)'}, "
            f"available {'yes' if t.get('available') else 'no'}, {gpus} GPU(s)")
    ok = bool(t.get("available")) and gpus >= need
    if not t.get("cuda"):
        fix = "this torch is a CPU build: install the CUDA build matching the driver (see `module torch`)"
    elif not t.get("available"):
        fix = (f"torch is built for CUDA {t.get('cuda')} but sees no GPU: check the driver (nvidia-smi) "
               f"supports CUDA {t.get('cuda')}, CUDA_VISIBLE_DEVICES, and the container's GPU passthrough")
    else:
        fix = f"torch sees {gpus} GPU(s): set `gpus` (and `ranks`) to at most {gpus}, or use a bigger host"
    return Check(name, want, have, ok, fix)


def _file_check(facts: Facts, template: str, fix: str, variables: dict[str, Any]) -> Check:
    unset = unset_vars(template, variables)
    if unset:
        return Check(f"file {template}", "exists", f"var {', '.join(unset)} unset", False, fix)
    info = facts.raw.get("need", {}).get(template) or {}
    path = str(info.get("path") or render_value(template, variables))
    return Check(f"file {path}", "exists", "yes" if info.get("exists") else "missing",
                 bool(info.get("exists")), fix)


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
    res = facts.raw.get("preflight") or {}
    if "missing" in res:
        paths = [str(render_value(t, cv)) for t in res["missing"]]
        fixes = "; ".join(_fill(pf.needs[t], variables) for t in res["missing"])
        return Check(name, want, f"not run: {', '.join(paths)} not on the host", True, fixes, skipped=True)
    if "modules" in res:  # the preflight is the role's own code: it needs them too
        return Check(name, want, f"not run: needs {', '.join(res['modules'])} first", True,
                     "install the missing modules (fixes above), then verify again", skipped=True)
    lines = str(res.get("out") or "").strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else None
    except ValueError:
        verdict = None
    if not isinstance(verdict, dict) or "fits" not in verdict:
        err = (str(res.get("err") or "").strip().splitlines() or ["no output"])[-1]
        return Check(name, want, f"failed (exit {res.get('rc')}): {console.r(err)}", False,
                     f"run it on the host to see why: {_shown_command(pf, cv, variables)}")
    return _estimate_check(name, want, verdict, res.get("rc") == 0, cv)


def _shown_command(pf: Preflight, cv: dict[str, Any], variables: dict[str, Any]) -> str:
    """The preflight as a person would paste it into a shell on the host (`~/` kept live)."""
    parts = []
    for template, value in render_argv(pf.run, cv, "preflight"):
        parts.append(str(variables.get("python", "python3")) if value == SELF_PYTHON
                     else sh_path(value) if template != "{python}" else value)
    return " ".join(parts)


def _size(n: Any) -> str:
    """Bytes for people: GB for big figures (as the free disk), finer for small estimates."""
    if not isinstance(n, (int, float)):
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _estimate_check(name: str, want: str, d: dict[str, Any], rc_ok: bool, cv: dict[str, Any]) -> Check:
    """The preflight's JSON verdict with its numbers (the extractor's disk estimate)."""
    est, free, reserve = d.get("estimate_bytes"), d.get("free_bytes"), d.get("reserve_bytes") or 0
    have = (f"{_size(est)} for {d.get('samples', '?')} samples / {d.get('tokens', '?')} tokens "
            f"({d.get('bytes_per_token', '?')} B/token, {d.get('already_done', 0)} already done); "
            f"{_size(free)} free, {_size(reserve)} reserve")
    ok = bool(d.get("fits")) and rc_ok
    need = (est or 0) + reserve
    fix = (f"needs {_size(need)} but {_size(free)} free under {cv.get('job_dir')}: free space there, "
           f"point `remote_dir` at a bigger volume, shard over more hosts, or lower `max_length`")
    return Check(name, want, have, ok, fix)


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
    report.data["checks"] = [c.__dict__ for c in verdict.checks]


INSTALL = r"""
import json, os, subprocess, sys, venv
a = json.loads(sys.argv[1])
d = os.path.expanduser(a["venv"])
if not os.path.exists(os.path.join(d, "bin", "python")):
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(d)
py = os.path.join(d, "bin", "python")
p = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q"] + a["reqs"],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
print(json.dumps({"rc": p.returncode, "out": p.stdout.decode(errors="replace")[-2000:], "python": py}))
"""


def install_missing(session: Session, verdict: Verdict, report: HostReport) -> bool:
    """pip-install the missing installable modules into `<remote_dir>/venv`; True if tried."""
    reqs = [c.installable for c in verdict.missing if c.installable]
    if not reqs:
        return False
    venv_dir = str(session.vars["remote_dir"]).rstrip("/") + "/venv"
    report.log(f"installing {console.r(', '.join(reqs))} into {console.r(venv_dir)} …")
    res = session.py(INSTALL, {"venv": venv_dir, "reqs": reqs}, "pip install", timeout=900)
    if res["rc"] != 0:
        tail = " / ".join(str(res["out"]).strip().splitlines()[-3:])
        report.log(f"[red]pip install failed:[/] {console.r(tail)} (does the host reach a package index?)")
    else:
        report.log(f"installed; the host's python is now {console.r(res['python'])}")
    return True
