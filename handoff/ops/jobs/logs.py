"""`fab logs`: a job's last log lines per host, or (`--follow`) every host's new lines as
they come, prefixed by host, until Ctrl-C. Without `--job`: every job's log on the host,
each under a `== JOB` line (`tail -F` heads each file itself)."""

from __future__ import annotations

import threading

from handoff import console, threads
from handoff.errors import HandoffError, RemoteError
from handoff.host import untrusted
from handoff.host.session import Connector, Session, sh_path
from handoff.host.targets import Target
from handoff.ops.jobs.state import job_name, read_all, unknown_job
from handoff.run.parallel import HostReport, run_on_hosts


def log_path(target: Target, job: str) -> str:
    return target.layout.job(job) + "/log"


# Each line shown is cut on the host to this many bytes (the workstation then shows
# control characters visibly): a 50 MB line costs 16 KB on the wire and in memory.
CUT = f"cut -b 1-{untrusted.MAX_LINE_CHARS}"


def all_logs_command(target: Target, lines: int) -> str:
    """The last lines of every job's log under jobs/, each after a `== JOB` line; exit 3
    when there is no job at all."""
    return (f"cd {sh_path(target.layout.jobs)} 2>/dev/null || exit 3; found=; for d in */; do "
            f"[ -f \"$d/log\" ] || continue; found=1; printf '== %s\\n' \"${{d%/}}\"; "
            f"tail -n {int(lines)} \"$d/log\" | {CUT}; done; [ -n \"$found\" ] || exit 3")


def tail(targets: list[Target], job_flag: str | None, lines: int, connect: Connector) -> list[HostReport]:
    """The last `lines` lines of each host's job log (every job's, without `--job`),
    grouped per host."""

    def one(s: Session, report: HostReport) -> None:
        if job_flag is None:
            res = s.exec(all_logs_command(s.target, lines))
            if res.rc != 0:
                raise RemoteError(f"{s.label}: no job logs under {s.target.layout.jobs} "
                                  f"(nothing launched yet?)")
        else:
            job = job_name(s.target, job_flag)
            log = log_path(s.target, job)
            res = s.exec(f"[ -f {sh_path(log)} ] || exit 3; tail -n {int(lines)} {sh_path(log)} "
                         f"| {CUT}")
            if res.rc != 0:
                if job not in read_all(s).jobs:
                    raise unknown_job(s, job)
                raise RemoteError(f"{s.label}: no log for job {job!r} at {log} (not launched yet?)")
        for line in res.out.splitlines():
            report.log(console.r(line))

    return run_on_hosts(targets, one, connect=connect, title="logs")


def follow(targets: list[Target], job_flag: str | None, lines: int, connect: Connector) -> int:
    """Stream `tail -F` from every host until Ctrl-C; 1 if any host could not be followed."""
    stop = threading.Event()
    sessions: list[Session] = []
    errors: list[str] = []
    prefix = len(targets) > 1

    def pump(target: Target) -> None:
        try:
            s = connect(target)
            sessions.append(s)
            s.connect()
            if job_flag is None:  # every job's log; tail heads each with `==> NAME <==`
                what = f"{sh_path(target.layout.jobs)}/*/log"
            else:
                what = sh_path(log_path(target, job_name(target, job_flag)))
            for line in s.stream(f"tail -n {int(lines)} -F {what} 2>&1", stop):
                shown = console.r(line)
                console.say(f"[cyan]{console.r(target.label)}[/] | {shown}" if prefix else shown)
        except (HandoffError, OSError) as exc:
            errors.append(str(exc))
            console.error(str(exc))
        except Exception as exc:  # paramiko's own errors: reported, never a traceback
            errors.append(f"{target.label}: {exc}")
            console.error(f"{target.label}: {exc}")

    try:  # every host streams at once, until Ctrl-C or all of them ended
        threads.each(targets, pump, workers=len(targets), name="logs")
    except KeyboardInterrupt:
        stop.set()
        # Ctrl-C is how --follow ends (exit 0): only the watching stops.
        console.note("stopped following; the jobs keep running on the hosts (`fab stop` ends them)")
    finally:
        stop.set()
        for s in sessions:
            s.close()
    return 1 if errors else 0
