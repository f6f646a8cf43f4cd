"""The second half of the checklist: smoke-test, launch, status, logs, stop, fetch, cleanup.

A job lives in `<remote_dir>/jobs/<job>/` (output.jsonl, output.errors.jsonl,
status.json, log, pid, job.json). It is started detached with
`setsid nohup CMD >>log 2>&1 </dev/null &` on an exec channel without a pty, so it
survives the SSH session and never waits on stdin. The key reaches it only as
`--api-key-file PATH`: never in argv as a value, never in `env=`.

Each task does one round trip per host for what it reads (a small python snippet
that returns JSON), and the ledger tells which secrets are still placed.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from handoff import console, releases, state
from handoff.errors import HandoffError, NotDeployed, RemoteError, UsageError
from handoff.parallel import HostReport, run_parallel
from handoff.remote import Session, sh_path
from handoff.roles import Role, render_command
from handoff.ssh import endpoint, is_alias
from handoff.targets import Target
from handoff.tasks import exit_code, guarded, targets_for
from handoff.verify import Facts, probe

OK_STATES = {"running", "starting", "finished"}

# --- remote snippets ---------------------------------------------------------------------

JOB_STATE = r"""
import json, os, sys
a = json.loads(sys.argv[1])
home = os.path.expanduser("~")
def ab(p):
    return home if p == "~" else (os.path.join(home, p[2:]) if p.startswith("~/") else p)
jd = ab(a["job_dir"])
def load(name):
    try:
        with open(os.path.join(jd, name)) as f:
            return json.load(f)
    except Exception:
        return None
r = {"job_dir": jd, "status": load("status.json"), "meta": load("job.json")}
pid = None
try:
    with open(os.path.join(jd, "pid")) as f:
        pid = int(f.read().strip())
except Exception:
    pass
alive = False
if pid:
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    except PermissionError:
        alive = True
    if alive:
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    alive = False
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if jd.encode() not in f.read():
                    alive = False  # the pid was reused by an unrelated process
        except OSError:
            pass
r["pid"] = pid
r["alive"] = alive
r["keys"] = dict((p, os.path.exists(ab(p))) for p in a.get("keys", []))
print(json.dumps(r))
"""

FETCH_LIST = r"""
import hashlib, json, os, sys
a = json.loads(sys.argv[1])
home = os.path.expanduser("~")
jd = a["job_dir"]
jd = os.path.join(home, jd[2:]) if jd.startswith("~/") else jd
local = a["local"]
files = []
for root, dirs, names in os.walk(jd):
    dirs.sort()
    for n in sorted(names):
        p = os.path.join(root, n)
        rel = os.path.relpath(p, jd)
        if rel == "pid" or ".tmp" in n or not os.path.isfile(p):
            continue
        st = os.stat(p)
        d = {"rel": rel, "size": st.st_size, "mtime": st.st_mtime}
        have = local.get(rel)
        if have is not None and 0 < have <= st.st_size:
            h = hashlib.sha256()
            left = have
            with open(p, "rb") as f:
                while left > 0:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    h.update(chunk)
                    left -= len(chunk)
            d["prefix_sha256"] = h.hexdigest()
        files.append(d)
print(json.dumps({"job_dir": jd, "exists": os.path.isdir(jd), "files": files}))
"""


# --- shared helpers ------------------------------------------------------------------------


def job_name(target: Target, flag: str | None) -> str:
    name = flag or target.vars.get("job") or (target.role.name if target.role else None)
    if not name:
        raise UsageError(f"{target.label}: no job name; pass --job NAME or --role ROLE")
    if "/" in str(name) or str(name).startswith("."):
        raise UsageError(f"job name {name!r} must be a plain folder name")
    return str(name)


def job_dir(session: Session, job: str) -> str:
    return f"{session.remote_dir}/jobs/{job}"


def job_dir_unresolved(target: Target, job: str) -> str:
    return f"{str(target.vars['remote_dir']).rstrip('/')}/jobs/{job}"


def placed_keys(target: Target) -> list[str]:
    ep = target.endpoint
    return [e.path for e in state.placed()
            if (e.hostname, e.port, e.user) == (ep.hostname, ep.port, ep.user)]


def read_job(session: Session, job: str) -> dict[str, Any]:
    keys = placed_keys(session.target)
    return dict(session.py(JOB_STATE, {"job_dir": job_dir_unresolved(session.target, job), "keys": keys},
                           "reading the job state"))


def job_state(raw: dict[str, Any]) -> str:
    status = raw.get("status") or {}
    file_state = status.get("state")
    if raw.get("alive"):
        # Alive after writing stopped/aborted: draining in-flight requests after SIGTERM/402.
        return "stopping" if file_state in ("stopped", "aborted") else "running"
    if file_state == "running":
        return "dead"  # the status says running but no process: killed or crashed
    if file_state:
        return str(file_state)
    return "dead" if raw.get("pid") else "none"


def effective_python(session: Session, facts: Facts) -> str:
    venv = f"{session.remote_dir}/venv/bin/python"
    exe = str(facts.raw.get("executable") or "")
    return shlex.quote(exe) if exe == venv else str(session.vars["python"])


def template_vars(session: Session, facts: Facts, job: str, extra: dict[str, Any]) -> dict[str, Any]:
    v = dict(session.vars)
    v.update(
        python=effective_python(session, facts),
        remote_dir=session.remote_dir,
        key_path=session.abs(str(session.vars["key_path"])),
        job_dir=job_dir(session, job),
    )
    v.update({k: val for k, val in extra.items() if val is not None})
    return v


def require_deployed(session: Session, facts: Facts, role: Role | None) -> None:
    if not facts.current:
        raise NotDeployed(f"{session.label}: no release on the host; run `fab deploy --host {session.label}` first")
    if role is not None and role.secret:
        key = facts.file("key")
        if not key.get("exists"):
            raise NotDeployed(f"{session.label}: no API key at {session.vars['key_path']}; run `fab push-key --host {session.label}` (or deploy) first")


def _money(value: Any) -> str:
    return f"${value:.4f}" if isinstance(value, (int, float)) else "-"


# --- smoke-test --------------------------------------------------------------------------


def parse_smoke(text: str) -> dict[str, str]:
    """`payload smoke` prints `label: value` lines; keep the ones the table shows."""
    fields = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in ("model", "served by", "latency", "tokens", "cost", "key", "smoke"):
            fields[name.strip()] = value.strip()
    return fields


def _credit(key_line: str) -> str:
    """`usage $x, limit $y, left $z` -> `$z left (usage $x)`: the credit is what matters."""
    parts = dict(p.strip().split(" ", 1) for p in key_line.split(",") if " " in p.strip())
    if "left" in parts:
        return f"{parts['left']} left (used {parts.get('usage', '?')})"
    return key_line


@guarded
def smoke_test(host: str | None, role: str | None, model: str | None = None) -> int:
    targets = targets_for(host, role, {"model": model})

    def one(target: Target, report: HostReport) -> None:
        if target.role is None or not target.role.smoke:
            raise UsageError(f"{target.label}: role {target.role.name if target.role else None!r} has no smoke command")
        with Session(target) as s:
            facts = probe(s, None, files={"key": str(s.vars["key_path"])}, hash_files=False)
            require_deployed(s, facts, target.role)
            cmd = render_command(target.role.smoke, template_vars(s, facts, "smoke", {}), "smoke")
            res = s.exec(cmd, timeout=300)
        fields = parse_smoke(res.out)
        report.data.update(fields, rc=res.rc)
        for line in (res.out + res.err).strip().splitlines():
            report.log(f"  {console.r(line)}")
        if res.rc != 0:
            tail = (res.err.strip().splitlines() or res.out.strip().splitlines() or ["no output"])[-1]
            raise RemoteError(f"{target.label}: smoke test failed (exit {res.rc}): {tail}")
        report.summary = f"{fields.get('served by', '?')}, {fields.get('latency', '?')}"

    reports = run_parallel(targets, one, title="smoke-test", summary=False)
    rows = []
    for rep in reports:
        d = rep.data
        rows.append([console.r(rep.target.label), "[green]ok[/]" if rep.ok else "[red]FAILED[/]",
                     console.r(d.get("served by", "-")), console.r(d.get("latency", "-")),
                     console.r(d.get("tokens", "-")), console.r(d.get("cost", "-")),
                     console.r(_credit(d.get("key", "-"))) if rep.ok else console.r(rep.error or "")])
    console.say(console.table("smoke-test", ["host", "result", "provider (model)", "latency",
                                             "tokens", "cost", "key credit / error"], rows))
    return exit_code(reports)


# --- launch ------------------------------------------------------------------------------


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def launch_command(session: Session, command: str, jd: str, meta: dict[str, Any]) -> str:
    """mkdir, job.json, then the detached start; waits ~1.5 s to catch an instant crash."""
    q = shlex.quote
    return (
        f"set -e; mkdir -p {q(jd)}; cd {q(jd)}; "
        f"printf '%s\\n' {q(json.dumps(meta))} > job.json; "
        f"setsid nohup {command} >>log 2>&1 </dev/null & pid=$!; echo $pid > pid; "
        f"for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.1; kill -0 $pid 2>/dev/null || break; done; "
        f"if kill -0 $pid 2>/dev/null; then echo started $pid; else echo exited $pid; tail -n 15 log; exit 9; fi"
    )


@guarded
def launch(
    host: str | None,
    role: str | None,
    *,
    local_input: str | None,
    remote_input: str | None,
    flags: dict[str, Any],
    shard: bool = True,
) -> int:
    if local_input and remote_input:
        raise UsageError("give --input (a local file) or --remote-input (a file on the hosts), not both")
    job_flag = flags.pop("job", None)
    for key in ("concurrency", "max_tokens"):
        if flags.get(key) is not None:
            flags[key] = int(flags[key])
    if flags.get("max_cost") is not None:
        flags["max_cost"] = float(flags["max_cost"])
    targets = targets_for(host, role, flags)
    local: Path | None = None
    local_sha = ""
    if local_input:
        local = Path(local_input).expanduser()
        if not local.is_file():
            raise UsageError(f"--input {local_input}: no such file")
        local_sha = _sha256_file(local)
    n = len(targets)
    index = {t.label: i for i, t in enumerate(targets)}

    def one(target: Target, report: HostReport) -> None:
        role_ = target.role
        if role_ is None or not role_.launch:
            raise UsageError(f"{target.label}: role {role_.name if role_ else None!r} has no launch command")
        job = job_name(target, job_flag)
        remote_data = None
        if local is not None:
            remote_data = f"{str(target.vars['remote_dir']).rstrip('/')}/data/{local.name}"
        with Session(target) as s:
            files = {"key": str(s.vars["key_path"])}
            if remote_data:
                files["input"] = remote_data
            facts = probe(s, None, files=files)
            require_deployed(s, facts, role_)
            raw = read_job(s, job)
            if raw.get("alive"):
                raise HandoffError(
                    f"{target.label}: job {job!r} is already running (pid {raw.get('pid')}); "
                    f"watch it with `fab status`, or `fab stop --host {target.label}` first"
                )
            if local is not None and remote_data is not None:
                info = facts.file("input")
                if info.get("sha256") == local_sha:
                    report.log(f"  [dim]=[/] input {console.r(local.name)} unchanged on the host")
                else:
                    dest = s.abs(remote_data)
                    releases.mkdirs(s.sftp, dest.rsplit("/", 1)[0])
                    releases.upload_atomic(s.sftp, local.read_bytes(), dest)
                    report.log(f"  [green]✓[/] pushed {console.r(local.name)} → {console.r(dest)}")
                input_path = s.abs(remote_data)
            elif remote_input:
                input_path = s.abs(remote_input)
            elif target.vars.get("input"):
                input_path = s.abs(str(target.vars["input"]))
            else:
                raise UsageError("no input: pass --input LOCAL.jsonl or --remote-input PATH (or set the `input` var)")
            shard_spec = f"{index[target.label]}/{n}" if shard and n > 1 else None
            tvars = template_vars(s, facts, job, {"input": input_path, "shard": shard_spec})
            command = render_command(role_.launch, tvars, f"role {role_.name} launch")
            jd = job_dir(s, job)
            meta = {"job": job, "role": role_.name, "shard": shard_spec, "input": input_path,
                    "started": time.time(), "host": target.label}
            res = s.exec(launch_command(s, command, jd, meta), timeout=60)
            if res.rc != 0:
                after = read_job(s, job)
                if res.rc == 9 and job_state(after) == "finished":
                    shard_note = f", shard {shard_spec}" if shard_spec else ""
                    report.log(f"  [green]✓[/] {console.r(job)} ran and finished already{shard_note}")
                    report.summary = f"job {job} finished{shard_note}"
                    return
                detail = " / ".join(res.out.strip().splitlines()[-6:]) or res.err.strip()
                raise RemoteError(f"{target.label}: job {job!r} exited right after start: {detail}")
            pid = res.out.split()[-1] if res.out.split() else "?"
            report.log(f"  [green]✓[/] started {console.r(job)} (pid {pid}) in {console.r(jd)}"
                       + (f", shard {shard_spec}" if shard_spec else ""))
            report.summary = f"job {job} running, pid {pid}" + (f", shard {shard_spec}" if shard_spec else "")

    return exit_code(run_parallel(targets, one, title="launch"))


# --- status ------------------------------------------------------------------------------


@dataclass
class JobView:
    host: str
    job: str
    state: str
    raw: dict[str, Any]
    error: str | None = None

    def record(self) -> dict[str, Any]:
        st = self.raw.get("status") or {}
        rec = {
            "host": self.host, "job": self.job, "state": self.state,
            "done": st.get("done"), "failed": st.get("failed"), "total": st.get("total"),
            "cost": st.get("cost"), "alive": bool(self.raw.get("alive")),
            "pid": self.raw.get("pid"), "tokens_per_s": st.get("tokens_per_s"),
            "rate_rps": st.get("rate_rps"), "updated": st.get("updated"),
            "last_error": st.get("last_error"),
            "secrets_placed": [p for p, present in (self.raw.get("keys") or {}).items() if present],
        }
        if self.error:
            rec["error"] = self.error
        return rec


def _eta(st: dict[str, Any]) -> str:
    total, rate = st.get("total"), st.get("rate_rps")
    if not total or not rate:
        return "-"
    left = total - (st.get("done") or 0) - (st.get("failed") or 0)
    if left <= 0:
        return "0s"
    seconds = left / rate
    return f"{seconds / 3600:.1f}h" if seconds > 5400 else (f"{seconds / 60:.0f}m" if seconds > 90 else f"{seconds:.0f}s")


def status_table(views: list[JobView]) -> Any:
    colors = {"running": "green", "finished": "blue", "starting": "green", "stopping": "yellow"}
    rows = []
    for v in views:
        st = v.raw.get("status") or {}
        secrets_placed = [p for p, present in (v.raw.get("keys") or {}).items() if present]
        progress = f"{st.get('done', '-')}/{st.get('failed', '-')}/{st.get('total', '?')}" if st else "-"
        tps = st.get("tokens_per_s")
        color = colors.get(v.state, "red")
        rows.append([
            console.r(v.host), console.r(v.job), f"[{color}]{console.r(v.state)}[/]", progress,
            f"{tps:.0f}" if isinstance(tps, (int, float)) else "-", _money(st.get("cost")), _eta(st),
            ("yes" if secrets_placed else "no") if not v.error else "?",
            console.r(v.error or st.get("last_error") or ""),
        ])
    columns = ["host", "job", "state", "done/fail/total", "tok/s", "$ spent", "ETA", "key placed", "note"]
    if not any(row[-1] for row in rows):
        columns.pop()
        rows = [row[:-1] for row in rows]
    return console.table("status", columns, rows)


def _collect(sessions: dict[str, Session], targets: list[Target], job_flag: str | None) -> list[JobView]:
    views: dict[str, JobView] = {}

    def one(target: Target, report: HostReport) -> None:
        job = job_name(target, job_flag)
        try:
            s = sessions.get(target.label)
            if s is None or s.conn is None:
                s = Session(target)
                s.connect()
                sessions[target.label] = s
            raw = read_job(s, job)
            views[target.label] = JobView(target.label, job, job_state(raw), raw)
        except Exception as exc:  # any failure to read a host makes it "unreachable", never absent
            old = sessions.pop(target.label, None)
            if old is not None:
                old.close()
            views[target.label] = JobView(target.label, job, "unreachable", {}, str(exc))
            raise

    run_parallel(targets, one, title="status", grouped=False, summary=False)
    return [views[t.label] for t in targets if t.label in views]


@guarded
def status(host: str | None, role: str | None, *, job: str | None = None, as_json: bool = False,
           wait: bool = False, interval: float = 2.0) -> int:
    targets = targets_for(host, role)
    sessions: dict[str, Session] = {}
    shown_live = False
    try:
        views = _collect(sessions, targets, job)
        if wait:
            live = None
            if console.console().is_terminal and not as_json:
                from rich.live import Live

                live = Live(status_table(views), console=console.console(), refresh_per_second=4)
                live.start()
                shown_live = True  # Live leaves its last frame on screen: no second table
            try:
                while any(v.state in ("running", "starting", "stopping") for v in views):
                    time.sleep(max(0.2, float(interval)))
                    views = _collect(sessions, targets, job)
                    if live is not None:
                        live.update(status_table(views))
            finally:
                if live is not None:
                    live.stop()
                    live = None
    finally:
        for s in sessions.values():
            s.close()
    if as_json:
        for v in views:
            print(json.dumps(v.record(), sort_keys=True))
    elif not shown_live:
        console.say(status_table(views))
    bad = [v.host for v in views if v.state not in OK_STATES]
    if bad and not as_json:
        console.say(f"not running or finished: {', '.join(bad)}")
    return 1 if bad else 0


# --- logs --------------------------------------------------------------------------------


@guarded
def logs(host: str | None, role: str | None, *, job: str | None = None, follow: bool = False,
         lines: int = 40) -> int:
    targets = targets_for(host, role)
    n = int(lines)
    if not follow:
        def one(target: Target, report: HostReport) -> None:
            jobn = job_name(target, job)
            log = job_dir_unresolved(target, jobn) + "/log"
            with Session(target) as s:
                res = s.exec(f"tail -n {n} {sh_path(log)}")
            if res.rc != 0:
                raise RemoteError(f"{target.label}: no log for job {jobn!r} at {log} (not launched yet?)")
            for line in res.out.splitlines():
                report.log(console.r(line))

        return exit_code(run_parallel(targets, one, title="logs"))
    return _follow(targets, job, n)


def _follow(targets: list[Target], job: str | None, n: int) -> int:
    """Stream `tail -F` from every host, lines prefixed by host, until Ctrl-C."""
    stop = threading.Event()
    sessions: list[Session] = []
    errors: list[str] = []
    prefix = len(targets) > 1

    def pump(target: Target) -> None:
        try:
            s = Session(target)
            sessions.append(s)
            s.connect()
            log = job_dir_unresolved(target, job_name(target, job)) + "/log"
            chan = s.transport.open_session()
            chan.exec_command(f"tail -n {n} -F {sh_path(log)} 2>&1")
            buf = b""
            while not stop.is_set() and not chan.exit_status_ready():
                select.select([chan], [], [], 0.2)
                while chan.recv_ready():
                    buf += chan.recv(65536)
                *done, buf = buf.split(b"\n")
                for raw in done:
                    line = console.r(raw.decode("utf-8", "replace"))
                    console.say(f"[cyan]{console.r(target.label)}[/] | {line}" if prefix else line)
            chan.close()
        except (HandoffError, paramiko.SSHException, OSError) as exc:
            errors.append(str(exc))
            console.error(str(exc))

    threads = [threading.Thread(target=pump, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)
    except KeyboardInterrupt:
        stop.set()
    finally:
        stop.set()
        for s in sessions:
            s.close()
    return 1 if errors else 0


# --- stop --------------------------------------------------------------------------------


@guarded
def stop(host: str | None, role: str | None, *, job: str | None = None, timeout: float = 60.0) -> int:
    targets = targets_for(host, role)
    wait_s = max(0.0, float(timeout))

    def one(target: Target, report: HostReport) -> None:
        jobn = job_name(target, job)
        with Session(target) as s:
            raw = read_job(s, jobn)
            if not raw.get("alive"):
                state_ = job_state(raw)
                report.log(f"  [dim]=[/] job {console.r(jobn)} is not running (state {state_})")
                report.summary = f"not running ({state_})"
                return
            pid = int(raw["pid"])
            loops = int(wait_s / 0.25)
            res = s.exec(
                f"kill -TERM {pid} || exit 0; i=0; while [ $i -lt {loops} ]; do "
                f"kill -0 {pid} 2>/dev/null || exit 0; sleep 0.25; i=$((i+1)); done; "
                f"kill -0 {pid} 2>/dev/null && exit 124; exit 0", timeout=wait_s + 30)
            after = read_job(s, jobn)
        st = after.get("status") or {}
        if res.rc == 124 and wait_s > 0:
            raise RemoteError(
                f"{target.label}: job {jobn!r} (pid {pid}) still draining after {wait_s:.0f} s; "
                f"check `fab status`, or wait and rerun `fab stop`"
            )
        report.log(f"  [green]✓[/] sent SIGTERM to pid {pid}; state now {job_state(after)}, "
                   f"done {st.get('done', '?')}, failed {st.get('failed', '?')} (resumable: relaunch continues)")
        report.summary = f"stopped ({job_state(after)})"

    return exit_code(run_parallel(targets, one, title="stop"))


# --- fetch -------------------------------------------------------------------------------

APPEND_ONLY_SUFFIXES = (".jsonl",)
APPEND_ONLY_NAMES = ("log",)


def _append_only(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(APPEND_ONLY_SUFFIXES) or name in APPEND_ONLY_NAMES


def _local_prefix_sha(path: Path) -> str:
    return _sha256_file(path)


def _download(sftp: paramiko.SFTPClient, remote: str, local: Path, offset: int, size: int, mtime: float) -> None:
    local.parent.mkdir(parents=True, exist_ok=True)
    if offset:
        target = local
        mode = "ab"
    else:
        target = local.with_name(f".{local.name}.part")
        mode = "wb"
    with sftp.open(remote, "rb") as rf, target.open(mode) as lf:
        rf.seek(offset)
        rf.prefetch(size - offset)
        left = size - offset
        while left > 0:
            chunk = rf.read(min(left, 1 << 20))
            if not chunk:
                break
            lf.write(chunk)
            left -= len(chunk)
    if not offset:
        os.replace(target, local)
    os.utime(local, (mtime, mtime))


@guarded
def fetch(host: str | None, role: str | None, *, job: str | None = None, dest: str = "results") -> int:
    targets = targets_for(host, role)
    dest_root = Path(dest).expanduser()

    def one(target: Target, report: HostReport) -> None:
        jobn = job_name(target, job)
        local_dir = dest_root / target.safe_label / jobn
        local_sizes: dict[str, int] = {}
        if local_dir.is_dir():
            for p in local_dir.rglob("*"):
                if p.is_file() and not p.name.endswith(".part"):
                    local_sizes[p.relative_to(local_dir).as_posix()] = p.stat().st_size
        with Session(target) as s:
            listing = s.py(FETCH_LIST, {"job_dir": job_dir_unresolved(target, jobn), "local": local_sizes},
                           "listing the job's files")
            if not listing["exists"]:
                raise RemoteError(f"{target.label}: no job {jobn!r} at {listing['job_dir']} (launched?)")
            fetched = skipped = resumed = 0
            nbytes = 0
            for f in listing["files"]:
                rel, size, mtime = f["rel"], int(f["size"]), float(f["mtime"])
                local = local_dir / rel
                have = local_sizes.get(rel)
                remote = f"{listing['job_dir']}/{rel}"
                if have is not None and have == size and (
                    size == 0
                    or (_append_only(rel) and f.get("prefix_sha256") == _local_prefix_sha(local))
                    or (not _append_only(rel) and abs(local.stat().st_mtime - mtime) < 1e-3)
                ):
                    skipped += 1
                    continue
                offset = 0
                if (_append_only(rel) and have and have < size
                        and f.get("prefix_sha256") == _local_prefix_sha(local)):
                    offset = have
                    resumed += 1
                _download(s.sftp, remote, local, offset, size, mtime)
                fetched += 1
                nbytes += size - offset
        report.log(f"  [green]✓[/] {fetched} file(s) fetched ({resumed} resumed, {nbytes / 1e6:.2f} MB), "
                   f"{skipped} already complete → {console.r(local_dir)}")
        report.summary = f"{fetched} fetched, {skipped} complete → {local_dir}"
        report.data["dir"] = str(local_dir)

    reports = run_parallel(targets, one, title="fetch")
    return exit_code(reports)


# --- cleanup-secrets ---------------------------------------------------------------------


def _ledger_target(entry: state.LedgerEntry) -> Target:
    """Reach a host from its ledger entry, even if it left the inventory."""
    ep = None
    if is_alias(entry.host):
        ep = endpoint(entry.host)
        if (ep.hostname, ep.port, ep.user) != (entry.hostname, entry.port, entry.user):
            ep = None
    if ep is None:
        ep = endpoint(entry.hostname, entry.port, entry.user, entry.identity[0] if entry.identity else None)
    return Target(entry.host, entry.host, ep, None, None, {})


@guarded
def cleanup_secrets(host: str | None = None) -> int:
    entries = state.placed()
    if host:
        wanted = {h.strip() for h in host.split(",") if h.strip()}
        entries = [e for e in entries if e.host in wanted or e.hostname in wanted]
        # Named hosts are checked even if the ledger lost track of them (e.g. a wiped
        # state dir): their key_path is removed too, or reported already absent.
        unlisted = [h for h in wanted if not any(h in (e.host, e.hostname) for e in entries)]
        for t in targets_for(",".join(unlisted), None) if unlisted else []:
            ep = t.endpoint
            rel = str(t.vars["key_path"])
            path = rel[2:] if rel.startswith("~/") else rel  # SFTP resolves relative paths from home
            if not any((e.hostname, e.port, e.user) == (ep.hostname, ep.port, ep.user) for e in entries):
                entries.append(state.LedgerEntry(
                    host=t.label, hostname=ep.hostname, port=ep.port, user=ep.user,
                    identity=list(ep.identity), path=path, fingerprint="", time=time.time()))
    if not entries:
        console.say("the ledger lists no placed keys: nothing to clean (already absent)")
        return 0
    by_host: dict[tuple[str, int, str], list[state.LedgerEntry]] = {}
    for e in entries:
        by_host.setdefault((e.hostname, e.port, e.user), []).append(e)
    targets = [_ledger_target(group[0]) for group in by_host.values()]
    groups = {t.label: by_host[(t.endpoint.hostname, t.endpoint.port, t.endpoint.user)] for t in targets}

    def one(target: Target, report: HostReport) -> None:
        from handoff import secrets

        outcomes = []
        with Session(target) as s:
            for e in groups[target.label]:
                outcome = secrets.remove(s, e.path, e.fingerprint)
                report.log(f"  [green]✓[/] {console.r(outcome)}")
                outcomes.append("already absent" if "already absent" in outcome else "removed")
        report.summary = ", ".join(sorted(set(outcomes)))

    reports = run_parallel(targets, one, title="cleanup-secrets")
    failed = [r.target.label for r in reports if not r.ok]
    if failed:
        console.error(f"could not clean: {', '.join(failed)} (the ledger keeps them; rerun when reachable)")
    return 1 if failed else 0
