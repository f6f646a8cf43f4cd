"""`fab status`: each host's job, as a table or one JSON record per host, once or until
no job runs (`--wait`).

One round trip per host and refresh (handoff.remote_code.jobs `state`); the sessions stay
open across the refreshes of `--wait`. A host that cannot be read is "unreachable", never
left out: the exit code is 0 only when every job is running or finished.

The key is read from the host too: whether its key file is there, and whether it is a
minted child key (the record beside it names its hash). A child key's usage, limit and
expiry come from the management API, asked from the workstation (`key_lookup`); a plain
key is the user's own API key: uncapped, never expiring, and `table_notes` says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handoff import console, keyapi
from handoff.errors import HandoffError
from handoff.jobs.state import ACTIVE_STATES, OK_STATES, JobState, job_name, read
from handoff.parallel import HostReport, run_parallel
from handoff.session import Connector, Session
from handoff.targets import Target
from payload import units

COLORS = {"running": "green", "finished": "blue", "starting": "green", "stopping": "yellow"}

# What the management API says about the child key a host's record names (None: revoked).
KeyLookup = Callable[[keyapi.KeyRecord], "keyapi.ChildKey | None"]


@dataclass
class KeyView:
    """The key on one host, as the host and the management API tell it."""

    placed: bool
    record: keyapi.KeyRecord | None = None  # a minted child key's record, beside the file
    info: keyapi.ChildKey | None = None  # what the API says about it (None: revoked/unknown)
    error: str | None = None  # why the API could not be asked

    @property
    def mode(self) -> str:
        if not self.placed:
            return "none"
        return "minted" if self.record is not None else "plain"

    def spend(self) -> str:
        """The table's "key spend" cell."""
        if self.mode == "plain":
            return "uncapped, never expires"
        if self.mode == "none" or self.record is None:
            return "-"
        if self.error:
            return f"{self.record.hash[:12]}: usage unknown ({self.error})"
        if self.info is None:
            return f"{self.record.hash[:12]}: REVOKED (the file holds a dead key)"
        return self.info.describe()

    def record_json(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"placed": self.placed, "mode": self.mode}
        if self.record is not None:
            rec["hash"] = self.record.hash
            info = self.info
            rec.update(revoked=info is None and not self.error,
                       usage=info.usage if info else None, limit=info.limit if info else None,
                       limit_remaining=info.limit_remaining if info else None,
                       expires_at=keyapi.utc_iso(info.expires_at) if info and info.expires_at
                       else self.record.expires_at,
                       disabled=info.disabled if info else None)
        if self.error:
            rec["error"] = self.error
        return rec


def key_view(job_state: JobState, lookup: KeyLookup | None) -> KeyView:
    """The host's key: placed or not (read on the host), and for a minted one its usage,
    limit and expiry from `lookup` (skipped without one, e.g. in a unit test)."""
    view = KeyView(bool(job_state.keys_placed), job_state.key_record)
    if view.mode != "minted" or view.record is None or lookup is None:
        return view
    try:
        view.info = lookup(view.record)
    except HandoffError as exc:
        view.error = str(exc)
    return view


@dataclass
class JobView:
    """One row of the table: a host's job, or why it could not be read."""

    host: str
    job: str
    state: str
    job_state: JobState = field(default_factory=lambda: JobState(""))
    error: str | None = None
    key: KeyView | None = None

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
        if self.key is not None:
            rec["key"] = self.key.record_json()
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
            (f"yes ({v.key.mode})" if v.key.placed else "no") if v.key and not v.error else "?",
            console.r(v.key.spend()) if v.key and not v.error else "?",
            console.r(v.error or st.get("last_error") or ""),
        ])
    columns = ["host", "job", "state", "done/fail/total", "tok/s", "$ spent", "ETA", "key placed",
               "key spend", "note"]
    if not any(row[-1] for row in rows):
        columns.pop()
        rows = [row[:-1] for row in rows]
    return console.table("status", columns, rows)


def table_notes(views: list[JobView]) -> list[str]:
    """Warnings that belong under the table: hosts holding the plain API key, and child
    keys whose usage could not be read."""
    plain = sorted({v.host for v in views if v.key and v.key.mode == "plain"})
    notes = []
    if plain:
        notes.append(
            f"{', '.join(plain)}: the placed key is your own API key (plain mode): uncapped, it "
            f"never expires, and removing the file does not revoke it. Store a management key "
            f"(`fab set-key --username management-key`) and redeploy to place a spend-capped, "
            f"expiring child key per host instead.")
    revoked = sorted({v.host for v in views if v.key and v.key.mode == "minted"
                      and v.key.info is None and not v.key.error})
    if revoked:
        notes.append(f"{', '.join(revoked)}: the child key on the host is revoked or gone; "
                     f"`fab push-key` mints a new one.")
    return notes


class Watcher:
    """Reads every target's job; keeps each host's session open between reads."""

    def __init__(self, targets: list[Target], job_flag: str | None, connect: Connector,
                 key_lookup: KeyLookup | None = None) -> None:
        self.targets = targets
        self.job_flag = job_flag
        self.connect = connect
        self.key_lookup = key_lookup
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
                views[target.label] = JobView(target.label, job, current.state, current,
                                              key=key_view(current, self.key_lookup))
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
