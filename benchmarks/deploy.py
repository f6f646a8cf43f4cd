"""Deploy benchmark: `fab deploy` against Ansible and pyinfra on 8, 16, 32 loopback containers,
and `fab status` over those hosts with several jobs each.

All three do the same work on every host of a handoff Sandbox (real sshd, unprivileged
users, see handoff.testing.sandbox):
  1. copy the payload (the very `payload.pyz` that `fab push-script` uploads),
  2. place the API key with mode 0600,
  3. check that aiohttp is importable with the container's python (find_spec, as fab's
     verify probe does).
`fab deploy` also verifies the role's requirements and records a ledger; the peers do
only the three steps above, as a plain playbook/deploy file would.

"fresh": each container's remote state (and fab's local state dir) wiped first.
"no-op": the same command again right after a fresh run, nothing to change.
"status": `fab status` with --status-jobs finished jobs in each container's jobs folder
(one round trip per host reads them all, once the multi-job status is in).
Each peer runs from its own venv under .bench/ (git-ignored; created on first use):
ansible-core, and pyinfra with paramiko<5. Host key checking is off for the peers
(fab checks them against the sandbox's known_hosts). Medians over --reps runs.

    sudo .venv/bin/python benchmarks/deploy.py --hosts 8,16,32          # print the tables
    sudo .venv/bin/python benchmarks/deploy.py --hosts 8,16,32 --write  # …and record them
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import report as report_md  # noqa: E402
from handoff.testing.sandbox import Container, Sandbox  # noqa: E402

BENCH = REPO / ".bench"
FAB = Path(sys.executable).parent / "fab"  # the venv running this benchmark
PEERS = {
    "ansible": ["ansible-core>=2.16,<2.18"],
    "pyinfra": ["pyinfra>=3,<4", "paramiko<5"],
}
TARGETS = {"ansible": 5.0, "pyinfra": 2.0, "fresh_s": 3.0, "noop_s": 2.0, "status_s": 2.0}
LOAD: list[float] = []  # 1-min load average at start and end: context for the figures
# The module check, as fab's verify probe does it (find_spec: importable, without paying
# aiohttp's 0.3 s import), so all three tools do the same work.
CHECK = "import importlib.util, sys; sys.exit(importlib.util.find_spec('aiohttp') is None)"


# -- peers' venvs --------------------------------------------------------------------------------

def peer_venv(name: str) -> Path:
    """`.bench/<name>` with the peer installed (reused while the requirements are unchanged)."""
    venv = BENCH / name
    stamp = venv / ".bench-requirements"
    wanted = " ".join(PEERS[name])
    if stamp.is_file() and stamp.read_text() == wanted:
        return venv
    print(f"installing {name} into {venv} …", file=sys.stderr)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", *PEERS[name]], check=True)
    stamp.write_text(wanted)
    return venv


# -- the work, as each tool expresses it -----------------------------------------------------------

PLAYBOOK = """\
- hosts: all
  gather_facts: false
  vars: {check: CHECK_JSON}
  tasks:
    - name: releases folder
      file: {path: "{{ home }}/.handoff/releases", state: directory, mode: "0755"}
    - name: payload
      copy: {src: "{{ payload }}", dest: "{{ home }}/.handoff/releases/payload.pyz", mode: "0644"}
    - name: secrets folder
      file: {path: "{{ home }}/.handoff/secrets", state: directory, mode: "0700"}
    - name: key, 0600
      copy: {src: "{{ keyfile }}", dest: "{{ home }}/.handoff/secrets/openrouter.key", mode: "0600"}
    - name: aiohttp importable
      command: "{{ py }} -c {{ check | quote }}"
      changed_when: false
"""

PYINFRA_DEPLOY = """\
from pyinfra import host
from pyinfra.operations import files, server

home = host.data.home
files.directory(name="releases folder", path=f"{home}/.handoff/releases", mode="755")
files.put(name="payload", src=host.data.payload, dest=f"{home}/.handoff/releases/payload.pyz",
          mode="644")
files.directory(name="secrets folder", path=f"{home}/.handoff/secrets", mode="700")
files.put(name="key, 0600", src=host.data.keyfile,
          dest=f"{home}/.handoff/secrets/openrouter.key", mode="600")
server.shell(name="aiohttp importable", commands=[f'{host.data.py} -c "{host.data.check}"'])
"""


@dataclass
class Tool:
    name: str
    command: list[str]
    env: dict[str, str]
    cwd: Path
    payload_path: Callable[[Container], Path]
    after: Callable[[], None] = lambda: None     # e.g. stop Ansible's ssh mux processes
    fresh: list[float] = field(default_factory=list)
    noop: list[float] = field(default_factory=list)


def base_env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb", "NO_COLOR": "1"}


def fab_tool(sbx: Sandbox) -> Tool:
    env = {**base_env(sbx.home), **sbx.env(), "PYTHONDONTWRITEBYTECODE": "1"}
    return Tool("fab deploy", [str(FAB), "deploy"], env, REPO,
                lambda c: c.home / ".handoff" / "current" / "payload.pyz")


def ansible_tool(sbx: Sandbox, work: Path, payload: Path, keyfile: Path) -> Tool:
    venv = peer_venv("ansible")
    lines = ["[containers]"]
    for c in sbx.containers:
        lines.append(f"{c.name} ansible_host={c.address} ansible_port={c.port} "
                     f"ansible_user={c.user} home={c.home} py={c.python}")
    lines += ["", "[containers:vars]", f"ansible_ssh_private_key_file={sbx.identity}",
              "ansible_python_interpreter=/usr/bin/python3", f"payload={payload}",
              f"keyfile={keyfile}"]
    (work / "hosts.ini").write_text("\n".join(lines) + "\n")
    (work / "deploy.yml").write_text(PLAYBOOK.replace("CHECK_JSON", json.dumps(CHECK)))
    control = work / "cp"
    control.mkdir()
    env = {
        **base_env(work / "home"),
        "ANSIBLE_HOME": str(work / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(work / "ansible-local"),
        "ANSIBLE_REMOTE_TEMP": "~/.ansible-bench/tmp",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control),
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_FORKS": str(len(sbx.containers)),   # default 5 would serialise 8 hosts
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(work / "ansible.cfg"),  # empty: no stray config is read
    }
    (work / "ansible.cfg").write_text("")
    (work / "home").mkdir()

    def stop_mux() -> None:
        # ControlPersist leaves one `ssh: … [mux]` process per host; stop them by PID so the
        # next fresh run pays its connections like the first one did.
        for pid, args in _processes():
            if str(control) in args and "[mux]" in args:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    return Tool("ansible-playbook", [str(venv / "bin" / "ansible-playbook"), "-i", "hosts.ini",
                                     "deploy.yml"], env, work,
                lambda c: c.home / ".handoff" / "releases" / "payload.pyz", after=stop_mux)


def pyinfra_tool(sbx: Sandbox, work: Path, payload: Path, keyfile: Path) -> Tool:
    venv = peer_venv("pyinfra")
    hosts = []
    for c in sbx.containers:
        hosts.append((c.address, {
            "ssh_port": c.port, "ssh_user": c.user, "ssh_key": str(sbx.identity),
            "ssh_strict_host_key_checking": "off", "home": str(c.home), "py": c.python,
            "payload": str(payload), "keyfile": str(keyfile), "check": CHECK}))
    (work / "inventory.py").write_text(f"hosts = {hosts!r}\n")
    (work / "deploy.py").write_text(PYINFRA_DEPLOY)
    (work / "home").mkdir()
    env = {**base_env(work / "home")}
    return Tool("pyinfra", [str(venv / "bin" / "pyinfra"), "-y", "--parallel",
                            str(len(sbx.containers)), "inventory.py", "deploy.py"], env, work,
                lambda c: c.home / ".handoff" / "releases" / "payload.pyz")


def _processes() -> list[tuple[int, str]]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                raw = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            found.append((int(entry.name), raw.replace(b"\0", b" ").decode(errors="replace")))
    return found


# -- running and checking --------------------------------------------------------------------------

def wipe(sbx: Sandbox) -> None:
    """Fresh: no remote state on any container (as root, locally), no local fab state."""
    for c in sbx.containers:
        for name in (".handoff", ".ansible", ".ansible-bench", ".cache"):
            shutil.rmtree(c.home / name, ignore_errors=True)
    for child in sbx.state_dir.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


def timed(tool: Tool) -> float:
    start = time.perf_counter()
    proc = subprocess.run(tool.command, cwd=tool.cwd, env=tool.env, capture_output=True,
                          text=True, check=False, timeout=600)
    elapsed = time.perf_counter() - start
    tool.after()
    if proc.returncode != 0:
        sys.exit(f"{tool.name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                 f"{proc.stderr[-3000:]}")
    return elapsed


def check(sbx: Sandbox, tool: Tool, payload: bytes) -> None:
    """Every tool really did the work: same payload bytes, the key 0600 and intact."""
    for c in sbx.containers:
        placed = tool.payload_path(c)
        data = placed.read_bytes()
        if tool.name.startswith("fab"):
            # fab builds the release from the working tree at each run: check it is a whole,
            # content-addressed release (its folder is named by its sha256).
            release = placed.resolve().parent.name
            if not hashlib.sha256(data).hexdigest().startswith(release):
                sys.exit(f"{tool.name}: {placed} is not the release {release}")
        elif data != payload:
            sys.exit(f"{tool.name}: {placed} does not hold the payload")
        key = c.home / ".handoff" / "secrets" / "openrouter.key"
        mode = key.stat().st_mode & 0o777
        if mode != 0o600 or key.read_text().strip() != sbx.api_key:
            sys.exit(f"{tool.name}: {key} is mode {mode:04o} or does not hold the key")


def byte_compile() -> None:
    """handoff's own modules byte-compiled once, before any run, as pip compiles a package it
    installs (the peers' venvs were compiled so) and as the first run of a checkout leaves
    them. fab then runs with PYTHONDONTWRITEBYTECODE=1, writing nothing; without this step it
    compiled its ~90 modules from source on every run (0.1-0.15 s of CPU each time under
    load), a cost no user pays after the first run."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "handoff"),
                    str(REPO / "payload"), str(REPO / "fabfile.py")],
                   check=True, stdout=subprocess.DEVNULL)


def startup(sbx: Sandbox, reps: int) -> list[float]:
    """`fab -l`: fab's own floor (python + fabric/invoke/paramiko imports), part of every run."""
    env = {**base_env(sbx.home), **sbx.env()}
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        subprocess.run([str(FAB), "-l"], cwd=REPO, env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return times


def measure(sbx: Sandbox, tools: list[Tool], reps: int, payload: bytes) -> None:
    for rep in range(reps):
        for tool in tools:  # interleaved, so machine noise spreads over all tools alike
            wipe(sbx)
            tool.fresh.append(timed(tool))
            check(sbx, tool, payload)
            tool.noop.append(timed(tool))
            check(sbx, tool, payload)
        print(f"rep {rep + 1}/{reps}: " + ", ".join(
            f"{t.name} {t.fresh[-1]:.2f}/{t.noop[-1]:.2f}s" for t in tools), file=sys.stderr)


@dataclass
class SizeRun:
    """Everything measured at one host count."""

    hosts: int
    tools: list[Tool]
    startup: list[float] = field(default_factory=list)  # `fab -l`
    status: list[float] = field(default_factory=list)  # `fab status`
    status_jobs: int = 0  # jobs per host
    status_records: int = 0  # records `fab status --json` printed


def place_jobs(sbx: Sandbox, jobs: int) -> None:
    """`jobs` finished jobs in every container's jobs folder, as the payload leaves them; the
    first is the role's default job (generator), so `fab status` without --job reads it."""
    for c in sbx.containers:
        for j in range(jobs):
            name = "generator" if j == 0 else f"dataset-{j + 1}"
            folder = c.home / ".handoff" / "jobs" / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "job.json").write_text(json.dumps({"job": name, "input": f"{name}.jsonl"}))
            (folder / "status.json").write_text(json.dumps({
                "state": "finished", "done": 1000, "failed": 0, "in_flight": 0, "total": 1000,
                "prompt_tokens": 200_000, "completion_tokens": 300_000, "cost": 0.42,
                "rate_rps": 0.0, "tokens_per_s": 0.0, "started": 1.7e9, "updated": 1.7e9 + 600,
                "last_error": None}))
        subprocess.run(["chown", "-R", c.user, str(c.home / ".handoff")], check=True)


def measure_status(sbx: Sandbox, run: SizeRun, reps: int) -> None:
    """`fab status` over every host, `reps` times; then once with --json to count records."""
    env = {**base_env(sbx.home), **sbx.env(), "PYTHONDONTWRITEBYTECODE": "1"}
    for _ in range(reps):
        start = time.perf_counter()
        proc = subprocess.run([str(FAB), "status"], cwd=REPO, env=env, capture_output=True,
                              text=True, check=False)
        run.status.append(time.perf_counter() - start)
        if proc.returncode != 0:
            sys.exit(f"fab status failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    proc = subprocess.run([str(FAB), "status", "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)
    run.status_records = sum(1 for line in proc.stdout.splitlines() if line.startswith("{"))


def paired_ratio(tool: Tool, base: Tool) -> float:
    """Median of per-rep ratios: each rep runs the tools back to back, so a ratio within a rep
    cancels most of the machine's load swings (other processes on a shared box)."""
    return statistics.median(t / b for t, b in zip(tool.fresh, base.fresh, strict=True))


def report(runs: list[SizeRun], reps: int, command: str) -> str:
    """The whole section: what was measured, the command, one table per host count."""
    parts = [
        "Each tool, on every container: copy the payload (`payload.pyz`, the same bytes), place "
        "the key 0600, check that aiohttp is importable with the container's python (find_spec, "
        "as fab's verify probe does). fab also checks the role's python version, records the "
        "ledger, checks host keys, and reads the key from the OS keyring (the sandbox's Secret "
        "Service) on a thread alongside the connections; its modules are byte-compiled once "
        "before the runs (as pip compiles an installed package; the peers' venvs are so too) "
        "and it runs with PYTHONDONTWRITEBYTECODE=1, writing nothing. The peers "
        "read a local 0600 key file and run with host key checking off. Ansible: ansible-core, "
        "forks = hosts, defaults otherwise (ControlPersist mux processes stopped between runs); "
        "pyinfra 3 with paramiko<5, `--parallel` = hosts. fresh = remote state (and fab's local "
        "state) wiped before the run; no-op = the same command again. status = `fab status` "
        "with finished jobs in each container's jobs folder.",
        "",
        f"Machine: {os.cpu_count()} CPUs, shared with other work and with the containers "
        "themselves (every sshd session and remote python runs on the same CPUs); load average "
        f"(1 min) at start / end: {' / '.join(f'{x:.1f}' for x in LOAD)} (the end figure "
        "includes the benchmark's own load).",
        "",
        f"Loopback sshd containers (handoff.testing.sandbox), medians of {reps} runs, wall time "
        "including each tool's own startup; ratios are medians of the per-rep ratios (tools "
        "run back to back in each rep). Command:",
        "", "```", command, "```",
    ]
    for run in runs:
        parts += ["", f"### {run.hosts} hosts", "", size_report(run)]
    return "\n".join(parts)


def size_report(run: SizeRun) -> str:
    tools = run.tools
    fab = tools[0]  # fab when measured; otherwise ratios are relative to the first peer
    rows = ["| tool | fresh (median) | no-op (median) | fresh runs | fab fresh is faster by |",
            "|---|---:|---:|---|---:|"]
    for tool in tools:
        ratio = paired_ratio(tool, fab)
        rows.append(f"| {tool.name} | {statistics.median(tool.fresh):.2f} s | "
                    f"{statistics.median(tool.noop):.2f} s | "
                    f"{', '.join(f'{x:.2f}' for x in tool.fresh)} | "
                    f"{'-' if tool is fab else f'{ratio:.1f}×'} |")
    if run.startup:
        rows.append(f"| (fab's own startup: `fab -l`) | {statistics.median(run.startup):.2f} s "
                    f"| | {', '.join(f'{x:.2f}' for x in run.startup)} | |")
    if run.status:
        rows.append(f"| fab status ({run.status_jobs} jobs per host) | "
                    f"{statistics.median(run.status):.2f} s | | "
                    f"{', '.join(f'{x:.2f}' for x in run.status)} | |")
    verdicts = []
    for tool in tools[1:] if fab.name == "fab deploy" else []:
        key = "ansible" if "ansible" in tool.name else "pyinfra"
        ratio = paired_ratio(tool, fab)
        ok = "met" if ratio >= TARGETS[key] else "MISSED"
        verdicts.append(f"- fresh deploy vs {tool.name}: {ratio:.1f}× faster "
                        f"(target ≥{TARGETS[key]:.0f}×: {ok})")
    if fab.name == "fab deploy":
        for what, times, key in (("fresh deploy", fab.fresh, "fresh_s"),
                                 ("no-op redeploy", fab.noop, "noop_s")):
            value = statistics.median(times)
            ok = "met" if value <= TARGETS[key] else "MISSED"
            verdicts.append(f"- {what} to {run.hosts} hosts: {value:.2f} s "
                            f"(target ≤{TARGETS[key]:.0f} s: {ok})")
    if run.status:
        value = statistics.median(run.status)
        ok = "met" if value <= TARGETS["status_s"] else "MISSED"
        wanted = run.hosts * run.status_jobs
        read = (f"all {wanted} jobs read" if run.status_records == wanted else
                f"{run.status_records} of the {wanted} jobs read: this `fab status` reads one "
                "job per host without --job")
        verdicts.append(f"- `fab status` over {run.hosts} hosts with {run.status_jobs} jobs "
                        f"each: {value:.2f} s (target ≤{TARGETS['status_s']:.0f} s: {ok}; {read})")
    return "\n".join([*rows, "", *verdicts])


def write_section(body: str, path: Path = REPO / "BENCHMARKS.md") -> None:
    """Replace (or append) the `## Deploy` section of BENCHMARKS.md, leaving others alone."""
    report_md.write_section("Deploy", body, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="8", help="host counts, comma-separated (8,16,32)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--status-jobs", type=int, default=6,
                        help="jobs per host for the `fab status` run (0: skip it)")
    parser.add_argument("--write", action="store_true", help="record in BENCHMARKS.md ## Deploy")
    parser.add_argument("--only", default="fab,ansible,pyinfra",
                        help="comma-separated subset of fab,ansible,pyinfra")
    parser.add_argument("--no-byte-compile", action="store_true",
                        help="leave fab's modules uncompiled, as this benchmark ran before "
                             "(for an A/B against an older tree)")
    args = parser.parse_args(argv)
    wanted = set(args.only.split(","))
    sizes = [int(n) for n in str(args.hosts).split(",")]
    command = "sudo .venv/bin/python benchmarks/deploy.py " + " ".join(argv or sys.argv[1:])

    from handoff.ops.releases import build

    payload = build().data
    if "fab" in wanted and not args.no_byte_compile:
        byte_compile()
    LOAD.append(os.getloadavg()[0])
    runs = []
    for hosts in sizes:
        with tempfile.TemporaryDirectory(prefix="handoff-bench-") as tmp:
            runs.append(run_size(Path(tmp), hosts, wanted, args, payload))
    LOAD.append(os.getloadavg()[0])
    text = report(runs, args.reps, command.strip())
    report_md.publish("Deploy", text, args.write)
    return 0


def run_size(work: Path, hosts: int, wanted: set[str], args: argparse.Namespace,
             payload: bytes) -> SizeRun:
    print(f"{hosts} hosts:", file=sys.stderr)
    payload_file = work / "payload.pyz"
    payload_file.write_bytes(payload)
    with Sandbox(work / "sandbox", hosts=hosts) as sbx:
        keyfile = work / "openrouter.key"
        fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, sbx.api_key.encode())
        os.close(fd)
        tools = [fab_tool(sbx)] if "fab" in wanted else []
        if "ansible" in wanted:
            (work / "ansible").mkdir()
            tools.append(ansible_tool(sbx, work / "ansible", payload_file, keyfile))
        if "pyinfra" in wanted:
            (work / "pyinfra").mkdir()
            tools.append(pyinfra_tool(sbx, work / "pyinfra", payload_file, keyfile))
        run = SizeRun(hosts, tools)
        measure(sbx, tools, args.reps, payload)
        if "fab" in wanted:
            run.startup = startup(sbx, args.reps)
            if args.status_jobs:
                place_jobs(sbx, args.status_jobs)
                run.status_jobs = args.status_jobs
                measure_status(sbx, run, args.reps)
    return run


if __name__ == "__main__":
    sys.exit(main())

