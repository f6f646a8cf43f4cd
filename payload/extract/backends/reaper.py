"""No orphans: the engine's processes die with the run that started them.

vLLM's EngineCore and its workers are spawned processes that do not notice their parent
dying: after a `kill -9` of the payload they keep running (and, on a GPU host, keep the
memory the rerun needs). They inherit the payload's environment, so before the engine
starts the payload sets `ENV=<owner>:<pid>` (owner: a hash of the output dir and the
rank's tag; pid: the payload's own). Every process carrying that variable belongs to this
run, whatever its parent now is:

- a watchdog (this module run with `-m`, in its own session so a signal sent to the
  payload's process group leaves it standing) blocks on a pipe whose only writer is the
  payload; when the payload ends, however it ends, the read returns and the watchdog
  ends every process still marked with that value;
- a rerun first ends the processes marked with its owner by an earlier payload that is
  gone (`end_leftovers`), and says so; a run whose payload is still alive is left alone.

Stdlib only: the watchdog imports nothing heavy and starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ENV = "HANDOFF_EXTRACT_ENGINE"
GRACE_S = 3.0  # SIGTERM first (vLLM shuts down cleanly), then SIGKILL


def owner_of(out_dir: Path, tag: str) -> str:
    """The mark shared by every run of one rank of one output dir."""
    return hashlib.sha256(f"{out_dir.resolve()}\x1f{tag}".encode()).hexdigest()[:16]


def marked(prefix: str) -> Iterator[tuple[int, str]]:
    """(pid, mark) of every process whose environment holds ENV=<prefix...>."""
    me = os.getpid()
    needle = f"{ENV}={prefix}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for var in env.split(b"\0"):
            if var.startswith(needle):
                yield int(entry.name), var.split(b"=", 1)[1].decode(errors="replace")
                break


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")  # a zombie is dead; only its parent can reap it


def end(pids: list[int]) -> list[int]:
    """SIGTERM, wait up to GRACE_S, SIGKILL what is left; returns the pids that were alive."""
    alive = [p for p in pids if _alive(p)]
    for p in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(_alive(p) for p in alive):
        time.sleep(0.1)
    for p in alive:
        if _alive(p):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
    return alive


def end_marked(mark: str) -> list[int]:
    """End every process carrying exactly this mark (this run's engine)."""
    return end([pid for pid, m in marked(mark) if m == mark])


def end_leftovers(owner: str) -> list[int]:
    """End the engine processes of earlier runs of this owner whose payload is gone."""
    stale = []
    for pid, mark in marked(owner + ":"):
        try:
            payload_pid = int(mark.rsplit(":", 1)[1])
        except ValueError:
            payload_pid = -1
        if payload_pid != os.getpid() and not _alive(payload_pid):
            stale.append(pid)
    return end(stale)


def import_root() -> str:
    """The sys.path entry this package was imported from: the repo, or payload.pyz."""
    here = __file__
    if ".pyz" + os.sep in here:  # a zipapp: its path is the import root
        return here.split(".pyz" + os.sep, 1)[0] + ".pyz"
    return str(Path(here).resolve().parents[3])


class Watchdog:
    """A process that ends this run's engine processes when this process ends."""

    def __init__(self, mark: str) -> None:
        self.mark = mark
        root = import_root()
        env = {k: v for k, v in os.environ.items() if k != ENV}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        # stdin is the pipe; the payload never writes, and no one else holds its write
        # end (non-inheritable), so EOF means the payload is gone.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "payload.extract.backends.reaper", mark],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,
            start_new_session=True, close_fds=True)

    def close(self) -> None:
        """The payload is done with the engine: the watchdog sweeps once and exits."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=GRACE_S + 5)


def _watch(mark: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the payload
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a `fab stop` meant for the payload
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass
    ended = end_marked(mark)
    if ended:
        print(f"extract watchdog: ended {len(ended)} engine processes of a finished run "
              f"(pids {', '.join(map(str, ended))})", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_watch(sys.argv[1]))
