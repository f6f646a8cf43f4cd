"""`verify`: one probe per host, one round trip, compared with the role's needs.

The probe is a small python snippet run by the host's python. It reports, as one
JSON object: python version, which modules are importable (`find_spec`, no import,
so it is nearly free), commands on PATH, CUDA GPUs (`nvidia-smi -L`, only when the
role needs GPUs), free disk under remote_dir, plus the deploy state that later steps
need (releases present, where `current` points, size/mode/owner/sha256 of chosen
files such as the placed key). Deploy uses the same probe, so a no-op redeploy is
one round trip per host. The probe only reads; it hashes the key file on the host
and returns the hash, never the content.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from handoff import console
from handoff.parallel import HostReport
from handoff.remote import Session
from handoff.roles import Role

PROBE = r"""
import hashlib, importlib.util, json, os, shutil, subprocess, sys
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
     "commands": dict((c, shutil.which(c)) for c in a.get("commands", [])),
     "remote_dir": rd}
if a.get("gpus"):
    smi = shutil.which("nvidia-smi")
    if smi:
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
r["dirs"] = dict((d, os.path.isdir(ab(d))) for d in a.get("dirs", []))
r["files"] = dict((k, info(v)) for k, v in a.get("files", {}).items())
print(json.dumps(r))
"""


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
    def releases(self) -> list[dict[str, Any]]:
        return list(self.raw.get("releases", []))

    @property
    def current(self) -> str | None:
        cur = self.raw.get("current")
        return str(cur) if cur else None


def probe(
    session: Session,
    role: Role | None,
    files: dict[str, str] | None = None,
    dirs: list[str] | None = None,
    hash_files: bool = True,
) -> Facts:
    req = role.requires if role else None
    args = {
        "remote_dir": str(session.vars["remote_dir"]),
        "modules": list(req.modules) if req else [],
        "commands": list(req.commands) if req else [],
        "gpus": bool(req and req.gpus_needed(session.vars) > 0),
        "files": files or {},
        "dirs": dirs or [],
        "hash": hash_files,
    }
    facts = Facts(session.py(PROBE, args, "probe"))
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
    if role.requires.disk_gb > 0:
        free = facts.raw.get("disk_free")
        want = role.requires.disk_gb * 1e9
        v.checks.append(Check("free disk", f">= {_gb(want)}", _gb(free), free is not None and free >= want,
                              f"free space under {remote_dir} or set `remote_dir` to a bigger volume"))
    return v


def report_verdict(report: HostReport, verdict: Verdict, show_all: bool = True) -> None:
    rows = []
    for c in verdict.checks:
        if not show_all and c.ok:
            continue
        mark = "[green]ok[/]" if c.ok else "[bold red]missing[/]"
        rows.append([console.r(c.name), console.r(c.want), console.r(c.have), mark, "" if c.ok else console.r(c.fix)])
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
