"""Small OS helpers for the sandbox: throwaway unix users, ports, processes.

Everything here runs as root on the workstation and only ever touches loopback,
users whose names carry the sandbox prefix, and processes the sandbox started.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

USER_PREFIX = "hsbx"
# hsbx<owner pid>n<counter>: the owner pid lets a later run recognise leftovers of a
# crashed one (owner gone) without touching users of a sandbox that is still alive.
_USER_RE = re.compile(rf"^{USER_PREFIX}(\d+)n(\d+)$")
# Written into every sshd_config the sandbox creates, for the same reason.
OWNER_MARK = "# handoff-sandbox owner="
_SSHD_CONFIG_RE = re.compile(r"sshd(?::)? .*?-f (\S+)")


class SandboxError(RuntimeError):
    """Setting up or tearing down the sandbox failed; the message says what to do."""


def require_root() -> None:
    if os.geteuid() != 0:
        raise SandboxError(
            "the sandbox must run as root: it creates throwaway unix users (useradd) and "
            "starts sshd; run it as root (e.g. `sudo .venv/bin/python -m handoff.testing.sandbox up`)"
        )


def run(argv: Sequence[str], *, input_text: str | None = None, check: bool = True,
        env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a short local command, capturing output; failures name the command and its stderr."""
    proc = subprocess.run(list(argv), input=input_text, capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise SandboxError(f"`{' '.join(argv)}` failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc


# -- users ---------------------------------------------------------------------------------------

def _shadow_tool(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """useradd/userdel, retried while another process holds /etc/passwd's lock (exit 10):
    other sandboxes (parallel test sessions) create and delete users at the same time."""
    delay = 0.05
    for _attempt in range(40):
        proc = run(argv, check=False)
        if proc.returncode != 10 and "lock" not in proc.stderr.lower():
            break
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    if check and proc.returncode != 0:
        raise SandboxError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def create_user(name: str, home: Path) -> pwd.struct_passwd:
    """An unprivileged login user whose password is '*' (no password, but not "locked":
    sshd with UsePAM no refuses locked accounts, i.e. the '!' that useradd sets)."""
    _shadow_tool(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash",
                  "--password", "*", "--comment", "handoff sandbox", name])
    return pwd.getpwnam(name)


def delete_user(name: str) -> None:
    """Kill everything the user runs (launched jobs are theirs), then remove user and home."""
    kill_user_processes(name)
    with contextlib.suppress(KeyError):
        home = Path(pwd.getpwnam(name).pw_dir)
        _shadow_tool(["userdel", "--force", "--remove", name], check=False)
        with contextlib.suppress(FileNotFoundError):
            if home.is_dir():
                run(["rm", "-rf", "--one-file-system", str(home)], check=False)


def kill_user_processes(name: str) -> None:
    # pkill exits 1 when nothing matched; twice, because a dying shell may have just forked.
    for _ in range(2):
        run(["pkill", "-KILL", "-u", name], check=False)
        time.sleep(0.02)


def sandbox_user_name(counter: int) -> str:
    return f"{USER_PREFIX}{os.getpid()}n{counter}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_users() -> list[str]:
    """Sandbox users left by runs whose owner process is gone (crash, kill -9)."""
    names = []
    for entry in pwd.getpwall():
        match = _USER_RE.match(entry.pw_name)
        if match and not pid_alive(int(match.group(1))):
            names.append(entry.pw_name)
    return names


def stale_sshd_pids() -> list[int]:
    """sshd listeners started by a sandbox whose owner process is gone."""
    pids = []
    for pid, argv in iter_processes():
        # sshd rewrites its title to one string ("sshd: /usr/sbin/sshd -f CONFIG -D -e [listener]…")
        match = _SSHD_CONFIG_RE.search(" ".join(argv))
        if not match or not argv[0].startswith(("sshd", "/usr/sbin/sshd")):
            continue
        try:
            first = Path(match.group(1)).read_text().splitlines()[0]
        except (OSError, IndexError):
            continue
        if first.startswith(OWNER_MARK):
            owner = int(first[len(OWNER_MARK):].strip() or 0)
            if owner and not pid_alive(owner):
                pids.append(pid)
    return pids


def clean_stale() -> list[str]:
    """Remove leftovers of crashed sandboxes; returns what was removed, for the log."""
    removed = []
    for pid in stale_sshd_pids():
        terminate_tree(pid)
        removed.append(f"sshd pid {pid}")
    for name in stale_users():
        delete_user(name)
        removed.append(f"user {name}")
    return removed


# -- processes -----------------------------------------------------------------------------------

def iter_processes() -> Iterable[tuple[int, list[str]]]:
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue
        yield int(entry.name), [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def children_of(pid: int) -> list[int]:
    """Every descendant of `pid` (via /proc/<pid>/task/*/children), deepest last."""
    found: list[int] = []
    queue = [pid]
    while queue:
        parent = queue.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(x) for x in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            for kid in kids:
                if kid not in found:
                    found.append(kid)
                    queue.append(kid)
    return found


def terminate_tree(pid: int, *, grace_s: float = 2.0) -> None:
    """SIGTERM `pid` and its descendants (sshd forks one process per connection and
    those call setsid, so a process-group kill would miss them), SIGKILL after grace."""
    victims = [pid, *children_of(pid)]
    for victim in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_running(v) for v in victims):
        time.sleep(0.02)
    for victim in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie child of ours is dead for every purpose here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


# -- network -------------------------------------------------------------------------------------

def free_port(address: str) -> int:
    """A port that was free on `address` a moment ago (the caller retries on a lost race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def wait_for_banner(address: str, port: int, *, timeout_s: float,
                    alive: Callable[[], bool] | None = None) -> bool:
    """True once something on address:port greets with an SSH banner."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            return False
        try:
            with socket.create_connection((address, port), timeout=1.0) as sock:
                sock.settimeout(2.0)
                if sock.recv(64).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.02)
    return False


def make_traversable(path: Path) -> None:
    """Let the sandbox users reach their homes and authorized_keys below `path`.

    sshd reads authorized_keys with the user's privileges, and the user's shell starts in
    its home, so every folder above them needs o+x. Folders under the temp dir (mkdtemp and
    pytest make them 0700) get o+x added; anything else that blocks is an error, so the
    sandbox never loosens, say, /root.
    """
    import tempfile

    tmp = Path(tempfile.gettempdir()).resolve()
    path = path.resolve()
    for folder in [path, *path.parents]:
        mode = folder.stat().st_mode
        if mode & 0o001:
            continue
        if folder == path or tmp in folder.parents:
            folder.chmod((mode & 0o7777) | 0o711)
            continue
        raise SandboxError(
            f"the sandbox root {path} is below {folder} (mode {mode & 0o777:04o}), which the "
            f"throwaway users cannot traverse; choose a root under {tmp}"
        )
