"""Where a many-host command spends its time: the workstation's CPU, the hosts' CPU, the wall.

On a loopback sandbox of --hosts containers (handoff.testing.sandbox), two measurements:
  commands  `fab deploy` (fresh, then no-op) and `fab status` (6 finished jobs per host):
            wall time, fab's CPU
            (user+sys of the process and its threads) and the sshd side's CPU; with
            --pyinfra, pyinfra doing benchmarks/deploy.py's work, counted the same way;
  phases    the same work cut into its pieces, all hosts at once on a thread pool as fab
            does it: SSH connect (key exchange + host key check + login), a command
            (`true`), a python start (`python -c pass`, what every remote_code round trip
            pays), deploy's probe (facts.gather), an SFTP start + stat, close.
The sshd side's CPU is read from a cpuacct cgroup holding every container's sshd (and so
every session, shell, python and sftp-server they fork); without cgroup v1 cpuacct (or
not root) that column says "n/a". On a 2-core machine the sum of both sides' CPU divided
by 2 is the floor under the wall time.

    sudo .venv/bin/python benchmarks/breakdown.py --hosts 32 --pyinfra [--write]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import report as report_md  # noqa: E402
from handoff.testing.sandbox import Sandbox  # noqa: E402

FAB = Path(sys.executable).parent / "fab"  # the venv running this benchmark
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
SETTLE_S = 0.2  # for the last sessions' processes to end (and be counted) after a command
STATUS_JOBS = 6  # finished jobs per host for `fab status` (as benchmarks/deploy.py places them)


class ServerCPU:
    """CPU seconds used by the sandbox's sshd processes and everything they fork."""

    def __init__(self) -> None:
        self.group: Path | None = None
        if (CPUACCT / "cpuacct.usage").exists() and os.geteuid() == 0:
            self.group = CPUACCT / f"handoff-bench-{os.getpid()}"
            self.group.mkdir()

    def adopt(self, pids: list[int]) -> None:
        if self.group is not None:
            for pid in pids:
                (self.group / "cgroup.procs").write_text(str(pid))

    def now(self) -> float | None:
        return None if self.group is None else int((self.group / "cpuacct.usage").read_text()) / 1e9

    def remove(self) -> None:
        if self.group is None:
            return
        for _ in range(50):  # the sandbox's processes are gone once it closed
            try:
                self.group.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


Row = tuple[str, list[float], list[float], list[float | None]]  # name, walls, client, server


def measure(server: ServerCPU, run: Callable[[], None], client: Callable[[], float]) -> tuple[float, float, float | None]:
    s0, c0, t0 = server.now(), client(), time.perf_counter()
    run()
    wall = time.perf_counter() - t0
    time.sleep(SETTLE_S)
    s1 = server.now()
    return wall, client() - c0, None if s0 is None or s1 is None else s1 - s0


def wipe(sbx: Sandbox) -> None:
    for c in sbx.containers:
        shutil.rmtree(c.home / ".handoff", ignore_errors=True)
    for child in sbx.state_dir.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


def commands(sbx: Sandbox, server: ServerCPU, reps: int, work: Path, peer: bool) -> list[Row]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "TERM": "dumb",
           "NO_COLOR": "1", **sbx.env()}

    def fab(*args: str) -> Callable[[], None]:
        def run() -> None:
            subprocess.run([str(FAB), *args], cwd=REPO, env=env, capture_output=True, check=False)
        return run

    def fresh() -> None:
        wipe(sbx)

    def nothing() -> None:
        pass

    from benchmarks import deploy as bench_deploy

    def jobs() -> None:
        bench_deploy.place_jobs(sbx, STATUS_JOBS)

    runs: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
        ("fab deploy (fresh)", fresh, fab("deploy")), ("fab deploy (no-op)", nothing, fab("deploy")),
        (f"fab status ({STATUS_JOBS} jobs per host)", jobs, fab("status")),
        ("fab -l (startup alone)", nothing, fab("-l"))]
    if peer:  # pyinfra doing deploy.py's work, for the same accounting
        from handoff.ops.releases import build

        payload, keyfile = work / "payload.pyz", work / "openrouter.key"
        payload.write_bytes(build().data)
        keyfile.write_text(sbx.api_key)
        keyfile.chmod(0o600)
        (work / "pyinfra").mkdir()
        tool = bench_deploy.pyinfra_tool(sbx, work / "pyinfra", payload, keyfile)

        def pyinfra() -> None:
            subprocess.run(tool.command, cwd=tool.cwd, env=tool.env, capture_output=True, check=True)

        runs += [("pyinfra deploy (fresh)", fresh, pyinfra),
                 ("pyinfra deploy (no-op)", nothing, pyinfra)]
    rows: dict[str, Row] = {}
    for _ in range(reps):
        for name, prepare, run in runs:
            prepare()
            wall, client, srv = measure(server, run, cpu_children)
            row = rows.setdefault(name, (name, [], [], []))
            row[1].append(wall)
            row[2].append(client)
            row[3].append(srv)
    return list(rows.values())


def phases(sbx: Sandbox, server: ServerCPU, reps: int) -> list[Row]:
    from handoff.cli import commands as handoff_commands
    from handoff.host.facts import KEY_FILE, gather
    from handoff.host.ssh_session import SSHSession

    os.environ.update(sbx.env())
    targets = handoff_commands.targets_for(",".join(c.name for c in sbx.containers), None)

    def probe(s: SSHSession) -> object:
        return gather(s, s.target.role, files={KEY_FILE: str(s.vars["key_path"])})

    rows: dict[str, Row] = {}
    steps: list[tuple[str, Callable[[Any], object]]] = [
        ("SSH connect: key exchange, host key check, login", lambda s: s.connect()),
        ("a command (`true`)", lambda s: s.exec("true")),
        ("a python start (`python -c pass`)", lambda s: s.exec(s.python_command(["-c", "pass"]))),
        ("deploy's probe (facts.gather, one round trip)", probe),
        ("SFTP start + stat", lambda s: s.files.stat(".")),
        ("close", lambda s: s.close()),
    ]
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        for _ in range(reps):
            sessions = [SSHSession(t) for t in targets]
            for name, step in steps:
                def everywhere(step: Callable[[Any], object] = step,
                               sessions: list[SSHSession] = sessions) -> None:
                    list(pool.map(step, sessions))

                wall, client, srv = measure(server, everywhere, cpu_self)
                row = rows.setdefault(name, (name, [], [], []))
                row[1].append(wall)
                row[2].append(client)
                row[3].append(srv)
    return list(rows.values())


def table(rows: list[Row], hosts: int) -> list[str]:
    def med(values: list[Any]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    def fmt(value: float | None, per_host: bool = False) -> str:
        if value is None:
            return "n/a"
        return f"{value:.3f} s" + (f" ({1000 * value / hosts:.1f} ms/host)" if per_host else "")

    out = ["| what | wall | workstation CPU | hosts' CPU (sshd side) | CPU floor on 2 cores |",
           "|---|---:|---:|---:|---:|"]
    for name, walls, client, srv in rows:
        c, s = med(client), med(srv)
        floor = None if c is None or s is None else (c + s) / 2
        per_host = "startup" not in name  # fab's own startup does not grow with the hosts
        out.append(f"| {name} | {fmt(med(walls))} | {fmt(c, per_host)} | {fmt(s, per_host)} "
                   f"| {fmt(floor)} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pyinfra", action="store_true",
                        help="also pyinfra doing deploy.py's work (its venv under .bench/)")
    parser.add_argument("--write", action="store_true",
                        help="record in BENCHMARKS.md ## Where the time goes")
    args = parser.parse_args(argv)
    command = "sudo .venv/bin/python benchmarks/breakdown.py " + " ".join(argv or sys.argv[1:])
    loads = [report_md.load()]
    server = ServerCPU()
    try:
        with tempfile.TemporaryDirectory(prefix="handoff-bench-") as tmp, \
                Sandbox(Path(tmp) / "sandbox", hosts=args.hosts, api=False) as sbx:
            server.adopt([pid for c in sbx.containers if (pid := sbx.sshd_pid(c.name))])
            by_command = commands(sbx, server, args.reps, Path(tmp), args.pyinfra)
            by_phase = phases(sbx, server, args.reps)
    finally:
        server.remove()
    loads.append(report_md.load())
    text = "\n".join([
        f"{args.hosts} loopback sandbox containers, medians of {args.reps} runs. Workstation "
        "CPU: user+sys of `fab` (commands) or of this process (phases, all hosts at once on "
        f"{args.hosts} threads as fab runs them). Hosts' CPU: a cpuacct cgroup around every "
        "container's sshd and all it forks. Load average (1, 5, 15 min) at start: "
        f"{loads[0]}; at end: {loads[1]}. Command:",
        "", "```", command, "```", "", *table(by_command, args.hosts), "",
        "The same work in pieces:", "", *table(by_phase, args.hosts)])
    report_md.publish("Where the time goes", text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
