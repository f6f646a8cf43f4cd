"""`fab status`: each host's job, as a table or one JSON record per host, once or until
no job runs (`--wait`).

One round trip per host and refresh (handoff.remote_code.jobs `state`); the sessions stay
open across the refreshes of `--wait`. A host that cannot be read is "unreachable", never
left out: the exit code is 0 only when every job is running or finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from handoff import console
from handoff.jobs.state import ACTIVE_STATES, OK_STATES, JobState, job_name, read
from handoff.parallel import HostReport, run_parallel
from handoff.session import Connector, Session
from handoff.targets import Target
from payload import units

COLORS = {"running": "green", "finished": "blue", "starting": "green", "stopping": "yellow"}


@dataclass
class JobView:
    """One row of the table: a host's job, or why it could not be read."""

    host: str
    job: str
    state: str
    job_state: JobState = field(default_factory=lambda: JobState(""))
    error: str | None = None

    @property
    def status(self) -> dict[str, Any]:
        return self.job_state.status or {}

    def record(self) -> dict[str, Any]:
        """The `--json` record (host, job, state, done, failed, total, cost, alive, ...)."""
        st = self.status
        rec = {
            "host": self.host, "job": self.job, "state": self.state,
            "done": st.get("done"), "failed": st.get("failed"), "total": st.get("total"),
            "cost": st.get("cost"), "alive": self.job_state.alive,
            "pid": self.job_state.pid, "tokens_per_s": st.get("tokens_per_s"),
            "rate_rps": st.get("rate_rps"), "updated": st.get("updated"),
            "last_error": st.get("last_error"), "secrets_placed": self.job_state.keys_placed,
        }
        if self.error:
            rec["error"] = self.error
        return rec

    @property
    def ok(self) -> bool:
        return self.state in OK_STATES


def eta(st: dict[str, Any]) -> str:
    total = st.get("total")
    left = None if not total else total - (st.get("done") or 0) - (st.get("failed") or 0)
    return units.eta(left, st.get("rate_rps"))


def money(value: Any) -> str:
    return f"${value:.4f}" if isinstance(value, (int, float)) else "-"


def table(views: list[JobView]) -> Any:
    rows = []
    for v in views:
        st = v.status
        progress = f"{st.get('done', '-')}/{st.get('failed', '-')}/{st.get('total', '?')}" if st else "-"
        tps = st.get("tokens_per_s")
        color = COLORS.get(v.state, "red")
        rows.append([
            console.r(v.host), console.r(v.job), f"[{color}]{console.r(v.state)}[/]", progress,
            f"{tps:.0f}" if isinstance(tps, (int, float)) else "-", money(st.get("cost")), eta(st),
            ("yes" if v.job_state.keys_placed else "no") if not v.error else "?",
            console.r(v.error or st.get("last_error") or ""),
        ])
    columns = ["host", "job", "state", "done/fail/total", "tok/s", "$ spent", "ETA", "key placed", "note"]
    if not any(row[-1] for row in rows):
        columns.pop()
        rows = [row[:-1] for row in rows]
    return console.table("status", columns, rows)


class Watcher:
    """Reads every target's job; keeps each host's session open between reads."""

    def __init__(self, targets: list[Target], job_flag: str | None, connect: Connector) -> None:
        self.targets = targets
        self.job_flag = job_flag
        self.connect = connect
        self.sessions: dict[str, Session] = {}

    def collect(self) -> list[JobView]:
        views: dict[str, JobView] = {}

        def one(target: Target, report: HostReport) -> None:
            job = job_name(target, self.job_flag)
            try:
                s = self.sessions.get(target.label)
                if s is None or not s.connected:
                    s = self.connect(target)
                    s.connect()
                    self.sessions[target.label] = s
                current = read(s, job)
                views[target.label] = JobView(target.label, job, current.state, current)
            except Exception as exc:  # any failure to read a host makes it "unreachable", never absent
                old = self.sessions.pop(target.label, None)
                if old is not None:
                    old.close()
                views[target.label] = JobView(target.label, job, "unreachable", error=str(exc))
                raise

        run_parallel(self.targets, one, title="status", grouped=False, summary=False)
        return [views[t.label] for t in self.targets if t.label in views]

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()
        self.sessions.clear()


def watch(watcher: Watcher, views: list[JobView], interval: float, live: bool) -> list[JobView]:
    """Refresh until no job runs; with `live`, one table updated in place on the terminal."""
    with console.live(table(views), enabled=live) as show:
        while any(v.state in ACTIVE_STATES for v in views):
            time.sleep(max(0.2, float(interval)))
            views = watcher.collect()
            show(table(views))
    return views
