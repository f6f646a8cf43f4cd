"""`fab status`: every job on every host (or the `--job` one), as a table or one JSON
record per host and job, once or until no job runs (`--wait`).

One round trip per host and refresh (handoff.host.remote_code.jobs `list`, or `state` for one
`--job`); the sessions stay open across the refreshes of `--wait`. A host that cannot be
read is "unreachable", never left out. A job that runs on several hosts (its shards) also
gets an "all" row: the sums, and the ETA of its slowest shard (each shard knows its total
from the start). The exit code is 0 only when every job is running or finished cleanly: a
run that finished with more failures than `--max-failed` (payload exit 1) is shown as
"finished with failures", not green, and counts as a failure; so do stopped (a full disk
among the reasons, shown with it), aborted (an input with no valid record), dead, none and
unreachable. Bad input lines are counted per job, with a sample, under the table.

The key is read from the host too: whether its key file is there, and whether it is a
minted child key (the record beside it names its hash). A child key's usage, limit and
expiry come from the management API, asked from the workstation (`key_lookup`); a plain
key is the user's own API key: uncapped, never expiring, and `table_notes` says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handoff import console
from handoff.errors import HandoffError
from handoff.host import keyrecord
from handoff.host.session import Connector, Session
from handoff.host.targets import Target
from handoff.ops import keyapi
from handoff.ops.jobs.state import ACTIVE_STATES, OK_STATES, JobState, job_name, read, read_all
from handoff.run.parallel import HostReport, run_parallel
from payload import units

COLORS = {"running": "green", "finished": "blue", "starting": "green", "stopping": "yellow"}

# What the management API says about the child key a host's record names (None: revoked).
KeyLookup = Callable[[keyrecord.KeyRecord], "keyapi.ChildKey | None"]


@dataclass
class KeyView:
    """The key on one host, as the host and the management API tell it."""

    placed: bool
    record: keyrecord.KeyRecord | None = None  # a minted child key's record, beside the file
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


# Status-file fields passed through to `--json` as the payload wrote them (docs/records.md).
STATUS_FIELDS = ("done", "failed", "total", "cost", "tokens_per_s", "rate_rps", "updated",
                 "last_error", "exit_code", "stop_reason", "max_failed", "max_cost",
                 "budget_enforced", "bad_lines", "bad_line_samples", "duplicates", "in_flight",
                 "window", "outage_s", "started")
WITH_FAILURES = "finished with failures"

# --- the answers' breakdown (status.json's by_provider, by_finish_reason, cut, ...) ---------
# The status file is written on the host, so its values are read as hostile input: a count
# is a finite whole number >= 0, a name a string cut to MAX_NAME chars with control
# characters replaced, at most MAX_NAMES names (the rest summed). These small readers stand
# where handoff/host/untrusted.py's will (its `count`, `text` and a `fields` reader).
MAX_NAME = 64
MAX_NAMES = 32
BREAKDOWNS = ("by_provider", "by_finish_reason")
COUNTS = ("cut", "timeouts", "think_split")


def count(value: Any) -> int | None:
    """A whole number >= 0 (an int, or a float with no fraction); anything else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        if not math.isfinite(value) or value < 0 or value != int(value):
            return None
    except OverflowError:
        return None
    return int(value)


def name(value: Any) -> str:
    """A provider or finish-reason name as shown: printable, at most MAX_NAME characters."""
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    return text if len(text) <= MAX_NAME else text[:MAX_NAME - 1] + "…"


def counts_by_name(value: Any) -> dict[str, int] | None:
    """`{"DeepInfra": 1402, ...}` checked: None unless a mapping of names to counts (an entry
    with a bad count makes it None: the host's file is wrong, not partly right); more than
    MAX_NAMES names keep the largest, the rest summed as `other (N names)`."""
    if not isinstance(value, dict):
        return None
    out: dict[str, int] = {}
    for key, n in value.items():
        c = count(n)
        if c is None:
            return None
        out[name(key)] = out.get(name(key), 0) + c
    if len(out) > MAX_NAMES:
        ranked = sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))
        kept = dict(ranked[:MAX_NAMES - 1])
        rest = ranked[MAX_NAMES - 1:]
        kept[f"other ({len(rest)} names)"] = sum(n for _, n in rest)
        out = kept
    return out


def answers(st: dict[str, Any]) -> dict[str, Any]:
    """The breakdown fields of a status, each checked (a bad or missing one is None)."""
    found: dict[str, Any] = {k: counts_by_name(st.get(k)) for k in BREAKDOWNS}
    found.update({k: count(st.get(k)) for k in COUNTS})
    return found


def _summed(parts: list[dict[str, int] | None]) -> dict[str, int] | None:
    known = [p for p in parts if p is not None]
    if not known:
        return None
    out: dict[str, int] = {}
    for p in known:
        for k, n in p.items():
            out[k] = out.get(k, 0) + n
    return out


def _ranked(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def breakdown_notes(views: list[JobView]) -> list[str]:
    """Per job (its shards summed): answers by provider and by finish reason, and the cut
    ones: "which provider answered the cut answers?" starts here."""
    by_job: dict[str, list[JobView]] = {}
    for v in views:
        if v.job is not None and v.status:
            by_job.setdefault(v.job, []).append(v)
    lines = []
    for job, shards in by_job.items():
        got = [answers(v.status) for v in shards]
        providers = _summed([g["by_provider"] for g in got])
        finishes = _summed([g["by_finish_reason"] for g in got])
        if not providers and not finishes:
            continue
        parts = []
        if providers:
            parts.append(f"by provider {_ranked(providers)}")
        if finishes:
            parts.append(f"by finish reason {_ranked(finishes)}")
        cut = [g["cut"] for g in got if g["cut"] is not None]
        if cut and sum(cut):
            parts.append(f"{sum(cut)} cut by max_tokens (recorded, not asked again)")
        where = shards[0].host if len(shards) == 1 else f"{len(shards)} hosts"
        lines.append(f"{job} ({where}) answers: " + "; ".join(parts))
    return lines


@dataclass
class JobView:
    """One row of the table: a host's job, or why it could not be read."""

    host: str
    job: str | None  # None: a host with no job at all
    state: str
    job_state: JobState = field(default_factory=lambda: JobState(""))
    error: str | None = None
    key: KeyView | None = None

    @property
    def status(self) -> dict[str, Any]:
        return self.job_state.status or {}

    @property
    def shown_state(self) -> str:
        """The state as the table shows it: a run that ended with too many failures is not
        simply "finished"."""
        return WITH_FAILURES if self.job_state.with_failures else self.state

    def record(self) -> dict[str, Any]:
        """The `--json` record: host, job, state, done, failed, total, cost, alive, and the
        status file's other fields (stop_reason, last_error, bad_lines, ...)."""
        st = self.status
        meta = self.job_state.meta or {}
        rec: dict[str, Any] = {"host": self.host, "job": self.job, "state": self.state,
                               "alive": self.job_state.alive, "pid": self.job_state.pid}
        rec.update({key: st.get(key) for key in STATUS_FIELDS})
        rec.update(answers(st))  # by_provider, by_finish_reason, cut, ... checked
        rec.update(finished_with_failures=self.job_state.with_failures, ok=self.ok,
                   shard=meta.get("shard"), input_sha256=meta.get("input_sha256"),
                   secrets_placed=self.job_state.keys_placed)
        if self.key is not None:
            rec["key"] = self.key.record_json()
        if self.error:
            rec["error"] = self.error
        return rec

    @property
    def ok(self) -> bool:
        return self.state in OK_STATES and not self.job_state.with_failures


def eta(st: dict[str, Any]) -> str:
    total = st.get("total")
    left = None if not total else total - (st.get("done") or 0) - (st.get("failed") or 0)
    return units.eta(left, st.get("rate_rps"))


def money(value: Any) -> str:
    return f"${value:.4f}" if isinstance(value, (int, float)) else "-"


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def note(v: JobView) -> str:
    """The note cell: why a host could not be read, why a job stopped, how it failed."""
    st = v.status
    if v.error:
        return v.error
    if v.job_state.with_failures:
        return (f"{st.get('failed')} ids failed permanently (more than the {st.get('max_failed')} "
                f"allowed): they are in output.errors.jsonl")
    if v.state in ("stopped", "aborted", "dead") and st.get("stop_reason") and st.get("last_error"):
        return f"{st['stop_reason']}: {st['last_error']}"
    return str(st.get("last_error") or "")


def combined(views: list[JobView]) -> list[JobView]:
    """One "all" view per job that has shards on several hosts: done, failed, total, cost and
    tok/s summed; the ETA of the slowest shard (rate_rps chosen so `eta` gives it)."""
    by_job: dict[str, list[JobView]] = {}
    for v in views:
        if v.job is not None and v.status:
            by_job.setdefault(v.job, []).append(v)
    out = []
    for job, shards in by_job.items():
        if len(shards) < 2:
            continue
        sts = [v.status for v in shards]
        summed: dict[str, Any] = {k: sum(_number(st.get(k)) for st in sts)
                                  for k in ("done", "failed", "cost", "tokens_per_s")}
        for k in ("done", "failed"):
            summed[k] = int(summed[k])
        # Every shard reads the whole file: its bad lines are the file's, not a share.
        summed["bad_lines"] = max(int(_number(st.get("bad_lines"))) for st in sts)
        totals = [t for t in (st.get("total") for st in sts) if isinstance(t, int)]
        summed["total"] = sum(totals) if len(totals) == len(sts) else None
        left = summed["total"] - summed["done"] - summed["failed"] if summed["total"] is not None else None
        etas = [_seconds_left(st) for st in sts]
        slowest = None if any(e is None for e in etas) else max(e or 0.0 for e in etas)
        if left is not None and slowest:
            summed["rate_rps"] = left / slowest
        elif left == 0:
            summed["rate_rps"] = 1.0
        states = {v.state for v in shards}
        active = [s for s in ("running", "stopping", "starting") if s in states]
        state = active[0] if active else states.pop() if len(states) == 1 else "mixed"
        summed["state"] = state
        got = [answers(st) for st in sts]
        for k in BREAKDOWNS:
            summed[k] = _summed([g[k] for g in got])
        for k in COUNTS:
            known = [g[k] for g in got if g[k] is not None]
            summed[k] = sum(known) if known else None
        if state == "finished" and any(v.job_state.with_failures for v in shards):
            summed["exit_code"] = 1
        out.append(JobView(f"all ({len(shards)} hosts)", job, state, JobState("", status=summed)))
    return out


def _seconds_left(st: dict[str, Any]) -> float | None:
    total, rate = st.get("total"), st.get("rate_rps")
    if not isinstance(total, int):
        return None
    left = total - int(_number(st.get("done"))) - int(_number(st.get("failed")))
    if left <= 0:
        return 0.0
    return left / rate if isinstance(rate, (int, float)) and rate > 0 else None


def table(views: list[JobView]) -> Any:
    rows = []
    shown = [*views, *combined(views)]
    with_bad = any(_number(v.status.get("bad_lines")) for v in shown)
    with_cut = any(count(v.status.get("cut")) for v in shown)
    for v in shown:
        st = v.status
        progress = f"{st.get('done', '-')}/{st.get('failed', '-')}/{st.get('total', '?')}" if st else "-"
        tps = st.get("tokens_per_s")
        color = "yellow" if v.job_state.with_failures else COLORS.get(v.state, "red")
        bold = v.host.startswith("all (")
        row = [
            f"[bold]{console.r(v.host)}[/]" if bold else console.r(v.host), console.r(v.job or "-"),
            f"[{color}]{console.r(v.shown_state)}[/]", progress,
            f"{tps:.0f}" if isinstance(tps, (int, float)) else "-", money(st.get("cost")),
            eta(st) if v.state in ACTIVE_STATES or v.state == "finished" else "-",
        ]
        if with_bad:
            row.append(str(st.get("bad_lines") or 0) if st else "-")
        if with_cut:
            cut = count(st.get("cut"))
            row.append(str(cut) if cut is not None else "-")
        row += [
            ((f"yes ({v.key.mode})" if v.key.placed else "no") if v.key and not v.error else "?")
            if not bold else "",
            (console.r(v.key.spend()) if v.key and not v.error else "?") if not bold else "",
            console.r(note(v)) if not bold else "",
        ]
        rows.append(row)
    columns = ["host", "job", "state", "done/fail/total", "tok/s", "$ spent", "ETA",
               *(["bad lines"] if with_bad else []), *(["cut"] if with_cut else []),
               "key placed", "key spend", "note"]
    if not any(row[-1] for row in rows):
        columns.pop()
        rows = [row[:-1] for row in rows]
    return console.table("status", columns, rows)


def bad_line_notes(views: list[JobView], shown: int = 3) -> list[str]:
    """Per job with bad input lines: the count and the first few, with reasons (said once
    for the shards of a job, which all read the same file)."""
    said: dict[tuple[str, str], list[str]] = {}
    for v in views:
        count = v.status.get("bad_lines")
        if not count:
            continue
        samples = [s for s in v.status.get("bad_line_samples") or [] if isinstance(s, dict)]
        quoted = "; ".join(f"line {s.get('line')}: {s.get('reason')}" for s in samples[:shown])
        more = ", ..." if quoted and int(_number(count)) > len(samples[:shown]) else ""
        text = (f"{count} bad input line{'s' if count != 1 else ''} skipped"
                + (f" ({quoted}{more})" if quoted else ""))
        said.setdefault((str(v.job), text), []).append(v.host)
    return [f"{job} on {', '.join(hosts)}: {text}" for (job, text), hosts in said.items()]


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
        views: dict[str, list[JobView]] = {}

        def one(target: Target, report: HostReport) -> None:
            job = job_name(target, self.job_flag) if self.job_flag else None
            try:
                s = self.sessions.get(target.label)
                if s is None or not s.connected:
                    s = self.connect(target)
                    s.connect()
                    self.sessions[target.label] = s
                views[target.label] = self._read(s, job)
            except Exception as exc:  # any failure to read a host makes it "unreachable", never absent
                old = self.sessions.pop(target.label, None)
                if old is not None:
                    old.close()
                views[target.label] = [JobView(target.label, job, "unreachable", error=str(exc))]
                raise

        run_parallel(self.targets, one, title="status", grouped=False, summary=False)
        return [v for t in self.targets for v in views.get(t.label, [])]

    def _read(self, s: Session, job: str | None) -> list[JobView]:
        """The `--job` job, or every job on the host (one round trip either way)."""
        label = s.target.label
        if job is not None:
            current = read(s, job)
            return [JobView(label, job, current.state, current, key=key_view(current, self.key_lookup))]
        host = read_all(s)
        key = key_view(host.keys, self.key_lookup)  # one lookup per host, shared by its jobs
        if not host.jobs:
            return [JobView(label, None, "none", host.keys, key=key)]
        return [JobView(label, name, current.state, current, key=key)
                for name, current in host.jobs.items()]

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
