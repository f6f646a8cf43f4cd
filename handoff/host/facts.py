"""What a host is like, as typed facts gathered by one probe (one round trip).

`gather` runs handoff.host.remote_code.probe with the host's python and turns its JSON answer
into `Facts`: python version, importable modules, commands, GPUs, free disk under
remote_dir, the releases present and where `current` points, which folders exist, and
size/mode/owner/sha256 of chosen files (the placed key, a pushed input). verify compares
them with the role; deploy's and launch's steps read them to skip work already done, so
an unchanged redeploy is connect + probe and nothing else.

With `deep` (verify checking a role) the same round trip also runs what the role file
asks for beyond that: `requires.cuda_torch` imports torch in a child of the probe's
python (only when torch is importable: it costs seconds, so roles that do not ask keep a
single cheap probe), `requires.files` are stat'ed, and the role's `preflight` runs under
the probe's own python once the paths it `needs` exist and the role's modules import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from handoff.config.layout import RemoteLayout, job_keys_folder
from handoff.config.roles import Role
from handoff.config.templates import render_argv, render_value
from handoff.errors import RemoteError, RoleError
from handoff.host import remote_code, untrusted
from handoff.host.session import Session
from payload import units

# The name the probe reports the placed API key under (`Facts.file(KEY_FILE)`).
KEY_FILE = "key"
# ... and the record beside a minted key (handoff.config.layout.key_record).
KEY_RECORD = "key_record"


def job_key_fact(job: str) -> str:
    """The name the probe reports a job's own key under (`Facts.file`)."""
    return f"jobkey:{job}"


def job_record_fact(job: str) -> str:
    """... and the record beside it."""
    return f"jobkey_record:{job}"


# Stands for `{python}` in a preflight argv: the probe runs it with its own interpreter,
# the one verify just checked (it may be the venv `verify --install` made).
SELF_PYTHON = "@@probe-python@@"

__all__ = ["KEY_FILE", "KEY_RECORD", "SELF_PYTHON", "Facts", "FileFacts", "Owner", "PreflightFacts",
           "ReleaseFacts", "TorchFacts", "check_vars", "deep_args", "disk_needed", "disk_short",
           "gather", "job_key_fact", "job_record_fact", "key_folder", "refuse_foreign"]


# Plain (not frozen) dataclasses: nothing mutates facts, and every deploy pays for the
# generated methods a frozen one adds.
@dataclass(eq=False)
class FileFacts:
    path: str
    exists: bool
    size: int | None = None
    mode: int | None = None
    uid: int | None = None
    mtime: float | None = None
    sha256: str | None = None
    error: str | None = None

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> FileFacts:
        return cls(str(raw.get("path", "")), bool(raw.get("exists")), raw.get("size"),
                   raw.get("mode"), raw.get("uid"), raw.get("mtime"), raw.get("sha256"),
                   raw.get("error"))


@dataclass(eq=False)
class Owner:
    """Who owns a folder on the host and who may write it (the probe's lstat)."""

    uid: int
    mode: int
    link: bool  # the path itself is a symlink
    dir: bool
    real: str  # the path with every symlink resolved
    target_uid: int | None = None  # a symlink's target
    target_mode: int | None = None

    @classmethod
    def from_json(cls, raw: Any) -> Owner | None:
        if not isinstance(raw, dict):
            return None
        return cls(int(raw["uid"]), int(raw["mode"]), raw.get("link") is True,
                   raw.get("dir") is True, str(raw.get("real") or ""),
                   untrusted.integer(raw.get("target_uid")), untrusted.integer(raw.get("target_mode")))

    def unsafe(self, me: int, *, follow: bool) -> str | None:
        """Why another user could change this folder (None when only `me` can): a symlink
        (unless `follow`: then its target is judged), another owner, group/world-writable."""
        uid, mode = self.uid, self.mode
        if self.link:
            if not follow:
                return f"is a symlink (to {self.real})"
            uid, mode = self.target_uid if self.target_uid is not None else -1, self.target_mode or 0
        if uid != me:
            return f"is owned by uid {uid}, not the login user (uid {me})"
        if mode & 0o022:
            return f"is writable by {'group and others' if mode & 0o022 == 0o022 else 'group' if mode & 0o020 else 'others'} (mode {mode:04o})"
        return None


@dataclass(eq=False)
class ReleaseFacts:
    name: str
    mtime: float
    size: int | None  # of its payload.pyz; None when missing (a half-made release)


@dataclass(eq=False)
class TorchFacts:
    """torch as the probe's python imports it; `error` when the import failed."""

    version: str | None = None
    cuda: str | None = None
    available: bool = False
    gpus: int = 0
    error: str | None = None


@dataclass(eq=False)
class PreflightFacts:
    """The role's preflight: not run (`missing` paths, absent `modules`) or its result."""

    missing: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    rc: int | None = None
    out: str = ""
    err: str = ""


@dataclass(eq=False)
class Facts:
    python: tuple[int, ...]
    executable: str
    home: str
    uid: int
    venv: bool = False
    remote_dir: str = ""
    modules: dict[str, bool] = field(default_factory=dict)
    commands: dict[str, str | None] = field(default_factory=dict)
    gpus: tuple[str, ...] | None = None  # nvidia-smi -L lines; None: not asked or no nvidia-smi
    gpu_error: str | None = None
    disk_free: int | None = None
    releases: tuple[ReleaseFacts, ...] = ()  # oldest first
    current: str | None = None  # where `current` points (as the symlink says)
    dirs: dict[str, bool] = field(default_factory=dict)  # absolute path -> is a directory
    owners: dict[str, Owner | None] = field(default_factory=dict)  # absolute path -> its owner
    files: dict[str, FileFacts] = field(default_factory=dict)
    torch: TorchFacts | None = None  # asked (deep) and torch importable
    need: dict[str, FileFacts] = field(default_factory=dict)  # requires.files template -> path
    preflight_wanted: bool = False
    preflight: PreflightFacts | None = None
    # module -> its __version__ ("" when it has none), or the import's error as "error: ..."
    versions: dict[str, str] = field(default_factory=dict)

    def file(self, name: str) -> FileFacts:
        return self.files.get(name) or FileFacts("", False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Facts:
        """The probe's answer (see handoff.host.remote_code.probe), typed."""
        torch = raw.get("torch")
        pre = raw.get("preflight")
        gpus = raw.get("gpus")
        return cls(
            python=tuple(int(p) for p in raw["python"]),
            executable=str(raw.get("executable") or ""),
            home=str(raw["home"]),
            uid=int(raw["uid"]),
            venv=bool(raw.get("venv")),
            remote_dir=str(raw.get("remote_dir") or ""),
            modules={str(k): bool(v) for k, v in (raw.get("modules") or {}).items()},
            commands={str(k): (str(v) if v else None) for k, v in (raw.get("commands") or {}).items()},
            gpus=None if gpus is None else tuple(str(g) for g in gpus),
            gpu_error=raw.get("gpu_error"),
            disk_free=raw.get("disk_free"),
            releases=tuple(ReleaseFacts(str(r["name"]), float(r["mtime"]), r.get("size"))
                           for r in raw.get("releases") or []),
            current=str(raw["current"]) if raw.get("current") else None,
            dirs={str(k): bool(v) for k, v in (raw.get("dirs") or {}).items()},
            owners={str(k): Owner.from_json(v) for k, v in (raw.get("owners") or {}).items()},
            files={str(k): FileFacts.from_json(v or {}) for k, v in (raw.get("files") or {}).items()},
            torch=None if not isinstance(torch, dict) else TorchFacts(
                torch.get("torch"), torch.get("cuda"), bool(torch.get("available")),
                int(torch.get("gpus") or 0), torch.get("error")),
            need={str(k): FileFacts.from_json(v or {}) for k, v in (raw.get("need") or {}).items()},
            preflight_wanted=bool(raw.get("preflight_wanted")),
            preflight=None if not isinstance(pre, dict) else PreflightFacts(
                tuple(pre.get("missing") or ()), tuple(pre.get("modules") or ()), pre.get("rc"),
                str(pre.get("out") or ""), str(pre.get("err") or "")),
            versions={str(k): (str(v.get("version") or "")[:80] if "version" in v
                               else f"error: {str(v.get('error') or '?')[:300]}")
                      for k, v in (raw.get("versions") or {}).items() if isinstance(v, dict)},
        )


def disk_needed(role: Role | None, extra_bytes: int = 0) -> float:
    """Bytes that must be free under remote_dir: the role's `requires.disk_gb`, plus what is
    about to be written there (a pushed input)."""
    return (role.requires.disk_gb * 1e9 if role else 0.0) + max(0, extra_bytes)


def disk_short(facts: Facts, role: Role | None, remote_dir: str, extra_bytes: int = 0) -> str | None:
    """Why the host's free disk is too small for the role (and `extra_bytes` about to be
    written), naming the fix; None when it fits or nothing is asked. deploy/verify check it
    as one of the role's checks; push-script, push-key and launch refuse with it."""
    want = disk_needed(role, extra_bytes)
    if want <= 0 or facts.disk_free is None or facts.disk_free >= want:
        return None
    needs = f"role {role.name} needs {units.size(want)}" if role else f"{units.size(want)} needed"
    return (f"only {units.size(facts.disk_free)} free under {remote_dir} ({needs}); free space "
            f"there or set `remote_dir` to a bigger volume")


def check_vars(role: Role, variables: dict[str, Any], shard: str | None = None) -> dict[str, Any]:
    """The vars a role's checks render with: the job's folder as launch will use it, the
    shard this host would get, and `{python}` as the probe's own interpreter."""
    v = dict(variables)
    v.setdefault("job_dir", RemoteLayout.of(v).job(str(v.get("job") or role.name)))
    v["shard"] = shard
    v["python"] = SELF_PYTHON
    return v


def deep_args(role: Role, variables: dict[str, Any], shard: str | None,
              preflight: bool = True) -> dict[str, Any]:
    """The probe's extra work for a role check: torch/CUDA, required files, the preflight
    (when asked: it may tokenize the whole input, so only `fab verify` runs it)."""
    v = check_vars(role, variables, shard)
    # A CPU host (gpus 0) is not asked for CUDA; a module with a version range is imported
    # (in a child) to read its __version__.
    args: dict[str, Any] = {"torch_cuda": role.requires.cuda_torch
                            and role.requires.gpus_needed(v) > 0,
                            "versions": sorted(role.requires.versions_needed(v))}
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
            argv = []  # a var it needs is unset: verify's evaluate() names it; nothing to run
        if argv and all(path is not None for path in needs.values()):
            args["preflight"] = {"argv": argv, "needs": needs, "self": SELF_PYTHON,
                                 "timeout": pf.timeout_s}
    return args


def gather(
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
    """One round trip. `files` names files to describe (name -> path), `dirs` folders to
    check; `deep` (verify checking `role`) adds the role's torch/file checks, `preflight`
    its preflight command; `shard` is the `I/N` this host would get from a launch over the
    same targets. Sets `session.home`, so absolute paths work from here on."""
    req = role.requires if role else None
    args: dict[str, Any] = {
        "remote_dir": session.target.layout.root,
        "modules": req.modules_needed(session.vars) if req else [],
        "commands": req.commands_needed(session.vars) if req else [],
        "gpus": bool(req and req.gpus_needed(session.vars) > 0),
        "files": files or {},
        "dirs": dirs or [],
        "hash": hash_files,
    }
    timeout = 120.0
    if deep and role is not None:
        args.update(deep_args(role, session.vars, shard, preflight))
        timeout += 180.0 + (role.preflight.timeout_s if role.preflight and preflight else 0.0)
    layout = session.target.layout
    guarded = [layout.root, layout.venv, layout.venv + "/bin"]
    keys = session.vars.get("key_path")
    args["owners"] = [*guarded, *([key_folder(session.vars), job_keys_folder(str(keys))] if keys else [])]
    answer = session.run_code(remote_code.PROBE, args, "probe", timeout=timeout)
    try:
        facts = Facts.from_json(answer)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise untrusted.Untrusted(f"{session.label}: probe: the host's answer is malformed "
                                  f"({untrusted.visible(exc, 200)})") from None
    home = facts.home
    if not home.startswith("/") or len(home) > 4096 or untrusted.has_control(home) \
            or ".." in home.split("/"):
        raise untrusted.Untrusted(f"{session.label}: probe: the home the host reports "
                                  f"({untrusted.visible(repr(home), 200)}) is not a plain "
                                  f"absolute path; refused")
    session.home = home  # text from here on: never rendered as a template (templates.Text)
    refuse_foreign(session, facts, guarded)
    return facts


def key_folder(variables: dict[str, Any]) -> str:
    """The folder of the host's key_path."""
    return str(variables["key_path"]).rsplit("/", 1)[0]


def refuse_foreign(session: Session, facts: Facts, paths: list[str]) -> None:
    """remote_dir and the venv handoff would run must be the login user's alone: a folder
    another user owns or may write (a shared box, another tenant) could change what runs
    there and read what is placed. Refused before anything is done, naming the fix."""
    for path in paths:
        owner = facts.owners.get(session.abs(path)) or facts.owners.get(path)
        why = owner.unsafe(facts.uid, follow=True) if owner is not None else None
        if why:
            what = "remote_dir" if path == paths[0] else "the venv folder"
            raise RemoteError(
                f"{session.label}: {what} {owner.real if owner else path} {why}: another user "
                f"could change what handoff runs there or read the key it places. Nothing was "
                f"done. Remove it (or have its owner remove it) and rerun: handoff creates it "
                f"0700; or set the `remote_dir` var to a folder of the login user's own")
