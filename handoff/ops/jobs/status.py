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

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handoff import console
from handoff.errors import ConnectError, HandoffError
from handoff.host import keyrecord
from handoff.host.session import Connector, Session
from handoff.host.targets import Target
from handoff.host.untrusted import count, counts_by_name
from handoff.ops import keyapi
from handoff.ops.jobs.state import (
    ACTIVE_STATES,
    OK_STATES,
    JobState,
    job_name,
    read,
    read_all,
    unknown_job,
)
from handoff.run.parallel import HostReport, run_parallel
from payload import units

COLORS = {"running": "green", "finished": "blue", "starting": "green", "stopping": "yellow"}

# What the management API says about the child key a host's record names (None: revoked),
# asked at the URL the workstation configured for that host (never the record's).
KeyLookup = Callable[[Target, keyrecord.KeyRecord], "keyapi.ChildKey | None"]


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


def key_view(job_state: JobState, lookup: KeyLookup | None, target: Target | None = None) -> KeyView:
    """The host's key: placed or not (read on the host), and for a minted one its usage,
    limit and expiry from `lookup` (skipped without one, e.g. in a unit test)."""
    view = KeyView(bool(job_state.keys_placed), job_state.key_record)
    if view.mode != "minted" or view.record is None or lookup is None or target is None:
        return view
    try:
        view.info = lookup(target, view.record)
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
# Read from the host through handoff.host.untrusted (counts finite whole numbers >= 0,
# names printable and cut, at most untrusted.MAX_NAMES of them); summed here per job.
BREAKDOWNS = ("by_provider", "by_finish_reason")
COUNTS = ("cut", "timeouts", "think_split")


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
    # Unreachable because the connection failed (a network blip `--wait` waits through), not
    # because the host answered something unusable (that is final: the host's error row).
    outage: bool = False

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
        if self.job_state.problems:
            rec["problems"] = list(self.job_state.problems)
        return rec

    @property
    def ok(self) -> bool:
        return (self.state in OK_STATES and not self.job_state.with_failures
                and not self.job_state.problems)


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
    if v.job_state.problems:
        return "the host answered wrong: " + "; ".join(v.job_state.problems)
    if v.job_state.with_failures:
        return (f"{st.get('failed')} ids failed permanently (more than the {st.get('max_failed')} "
                f"allowed): they are in output.errors.jsonl")
    if v.state == "stopped" and st.get("stop_reason") == "signal":
        # The payload's own words were written while it drained ("stopping; waiting up
        # to 60s…"); the drain is over now.
        return "stopped by a signal (fab stop or Ctrl-C); relaunching resumes it"
    if v.state in ("stopped", "aborted", "dead") and st.get("stop_reason") and st.get("last_error"):
        return f"{st['stop_reason']}: {st['last_error']}"
    if v.state == "finished" and not st.get("failed"):
        return ""  # every id answered: a retried error on the way is history, not a note
    return str(st.get("last_error") or "")


@dataclass(frozen=True)
class Shards:
    """Where a job's shards are, from its job.json (`hosts`: how many, `shard_hosts`: which
    hosts, in shard order) against the hosts that answered."""

    count: int  # shards the job was launched with (1: not sharded)
    seen: list[JobView]  # the rows of the hosts holding a shard
    missing: list[str]  # the shards not seen: "HOST (why)", or "shard i/n" when unrecorded
    unreachable: bool  # a missing shard's host was asked and could not be read
    prompts: int | None  # the whole input's distinct prompts, when launch knew it

    @property
    def state(self) -> str | None:
        """`unknown` (a shard's host could not be read), `partial` (a shard's host was not
        asked), or None: every shard is here."""
        if not self.missing:
            return None
        return "unknown" if self.unreachable else "partial"


def _meta_int(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def shards_of(views: list[JobView]) -> dict[str, Shards]:
    """Per job seen on any host: how many shards it has, and which are not among `views`
    (their host unreachable, or not asked: `status --host one`)."""
    by_job: dict[str, list[JobView]] = {}
    for v in views:
        if v.job is not None and (v.status or v.job_state.meta):
            by_job.setdefault(v.job, []).append(v)
    unreachable = {v.host for v in views if v.state == "unreachable"}
    out: dict[str, Shards] = {}
    for job, seen in by_job.items():
        metas = [v.job_state.meta for v in seen if v.job_state.meta]
        # The newest launch's record says how the job is split now (a relaunch may reshard).
        newest = max(metas, key=lambda m: _number(m.get("started")), default={})
        count = _meta_int(newest, "hosts") or len(seen)
        names = [str(h) for h in newest.get("shard_hosts") or []]
        specs = {str(m.get("shard")) for m in metas if m.get("shard")}
        missing: list[str] = []
        gone = False
        if specs and count > 1:  # sharded (--no-shard: every host has the whole input)
            for i in range(count):
                if f"{i}/{count}" in specs:
                    continue
                name = names[i] if len(names) == count else None
                if name is None:
                    missing.append(f"shard {i}/{count}")
                    continue
                why = "unreachable" if name in unreachable else "not asked"
                gone = gone or name in unreachable
                missing.append(f"{name} ({why})")
        out[job] = Shards(count, seen, missing, gone, _meta_int(newest, "prompts"))
    return out


def combined(views: list[JobView]) -> list[JobView]:
    """One "all" view per job that has shards on several hosts: done, failed, total, cost and
    tok/s summed; the ETA of the slowest shard (rate_rps chosen so `eta` gives it). A shard
    not seen makes it `partial` (its host not asked) or `unknown` (unreachable), with the
    failures unknown (`?`) and the total the whole input's."""
    out = []
    for job, shards in shards_of(views).items():
        present = [v for v in shards.seen if v.status]
        if shards.count < 2 and len(present) < 2:
            continue
        sts = [v.status for v in present]
        summed: dict[str, Any] = {k: sum(_number(st.get(k)) for st in sts)
                                  for k in ("done", "failed", "cost", "tokens_per_s")}
        for k in ("done", "failed"):
            summed[k] = int(summed[k])
        # Every shard reads the whole file: its bad lines are the file's, not a share.
        summed["bad_lines"] = max((int(_number(st.get("bad_lines"))) for st in sts), default=0)
        totals = [t for t in (st.get("total") for st in sts) if isinstance(t, int)]
        summed["total"] = sum(totals) if sts and len(totals) == len(sts) else None
        got = [answers(st) for st in sts]
        for k in BREAKDOWNS:
            summed[k] = _summed([g[k] for g in got])
        for k in COUNTS:
            known = [g[k] for g in got if g[k] is not None]
            summed[k] = sum(known) if known else None
        label = f"all ({len(present)} host{'s' if len(present) != 1 else ''})"
        if shards.state is not None:
            summed.update(failed="?", total=shards.prompts if shards.prompts is not None else "?",
                          state=shards.state)
            label = f"all ({len(present)} of {shards.count} shards)"
            out.append(JobView(label, job, shards.state, JobState("", status=summed),
                               error=f"shards not seen: {', '.join(shards.missing)}"))
            continue
        left = summed["total"] - summed["done"] - summed["failed"] if summed["total"] is not None else None
        etas = [_seconds_left(st) for st in sts]
        slowest = None if any(e is None for e in etas) else max(e or 0.0 for e in etas)
        if left is not None and slowest:
            summed["rate_rps"] = left / slowest
        elif left == 0:
            summed["rate_rps"] = 1.0
        states = {v.state for v in present}
        active = [s for s in ("running", "stopping", "starting") if s in states]
        state = active[0] if active else states.pop() if len(states) == 1 else "mixed"
        summed["state"] = state
        if state == "finished" and any(v.job_state.with_failures for v in present):
            summed["exit_code"] = 1
        out.append(JobView(label, job, state, JobState("", status=summed)))
    return out


def unaccounted(views: list[JobView]) -> list[str]:
    """"JOB: shards not seen: ..." for every job with a shard missing from `views`: such a
    status is not a success, whatever the shards that answered say."""
    return [f"{job}: {shards.state}, shards not seen: {', '.join(shards.missing)}"
            for job, shards in shards_of(views).items() if shards.state is not None]


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
            eta(st) if v.state in ACTIVE_STATES else "-",  # a finished job has no ETA
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
            console.r(note(v)) if not bold or v.error else "",
        ]
        rows.append(row)
    columns = ["host", "job", "state", "done/fail/total", "tok/s", "$ spent", "ETA",
               *(["bad lines"] if with_bad else []), *(["cut"] if with_cut else []),
               "key placed", "key spend", "note"]
    if not any(row[-1] for row in rows):
        columns.pop()
        rows = [row[:-1] for row in rows]
    return fitted("status", columns, rows)


# The columns a narrow terminal loses first (kubectl's habit: the wide view is `--json`
# here); what is left must fit without breaking a cell mid-word ("finis/hed").
_DROPPABLE = ("key spend", "key placed", "tok/s", "bad lines", "ETA", "$ spent")


def _min_width(columns: list[str], rows: list[list[Any]]) -> int:
    """The width a table needs so that no cell breaks inside a word: each column as wide as
    its longest word (header included), plus rich's borders and padding (3 per column + 1)."""
    from rich.cells import cell_len
    from rich.text import Text

    def longest(cell: Any) -> int:
        return max((cell_len(w) for w in Text.from_markup(str(cell)).plain.split()), default=0)

    widths = [max([longest(col), *(longest(row[i]) for row in rows)]) for i, col in enumerate(columns)]
    return sum(widths) + 3 * len(columns) + 1


def fitted(title: str, columns: list[str], rows: list[list[Any]]) -> Any:
    """The table, with the least needed columns dropped until every cell fits whole on a
    terminal of its width (off a terminal nothing is cut: no width limit applies)."""
    out = console.console()
    t = console.table(title, columns, rows)
    if not out.is_terminal:
        return t
    dropped = []
    for name in _DROPPABLE:
        if _min_width(columns, rows) <= out.width:
            break
        if name in columns:
            i = columns.index(name)
            columns = columns[:i] + columns[i + 1:]
            rows = [row[:i] + row[i + 1:] for row in rows]
            dropped.append(name)
            t = console.table(title, columns, rows)
    if dropped:
        t.caption = f"narrow terminal: {', '.join(dropped)} not shown (widen it, or --json)"
    return t


def jobs_table(views: list[JobView]) -> Any:
    """`fab jobs`: one row per job: its input, its shards and their hosts (those not seen
    named), and its state over all of them."""
    shards = shards_of(views)
    overall = {v.job: v for v in combined(views)}
    rows = []
    for job, sh in shards.items():
        metas = [v.job_state.meta for v in sh.seen if v.job_state.meta]
        meta = max(metas, key=lambda m: _number(m.get("started")), default={})
        source = meta.get("dataset") or meta.get("input") or "?"
        hosts = ", ".join(v.host for v in sh.seen)
        where = f"{sh.count} → {hosts}" if sh.count > 1 else hosts
        if sh.missing:
            where += f"; not seen: {', '.join(sh.missing)}"
        row = overall.get(job) or sh.seen[0]
        color = "yellow" if row.job_state.with_failures else COLORS.get(row.state, "red")
        rows.append([console.r(job), console.r(str(source)), console.r(where),
                     f"[{color}]{console.r(row.shown_state)}[/]"])
    return console.table("jobs", ["job", "input", "shards → hosts", "state"], rows)


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
                views[target.label] = [JobView(target.label, job, "unreachable", error=str(exc),
                                               outage=isinstance(exc, (ConnectError, OSError)))]
                raise

        run_parallel(self.targets, one, title="status", grouped=False, summary=False)
        return [v for t in self.targets for v in views.get(t.label, [])]

    def _read(self, s: Session, job: str | None) -> list[JobView]:
        """The `--job` job, or every job on the host (one round trip either way)."""
        label = s.target.label
        if job is not None:
            current = read(s, job)
            error = str(unknown_job(s, job)) if current.state == "none" else None
            return [JobView(label, job, current.state, current, error=error,
                            key=key_view(current, self.key_lookup, s.target))]
        host = read_all(s)
        key = key_view(host.keys, self.key_lookup, s.target)  # one lookup per host, for its jobs
        if not host.jobs:
            return [JobView(label, None, "none", host.keys, key=key)]
        return [JobView(label, name, current.state, current, key=key)
                for name, current in host.jobs.items()]

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()
        self.sessions.clear()


def progress_lines(views: list[JobView]) -> list[str]:
    """One line per job (its "all" row when it has shards) and per unreachable host: what
    `status --wait` prints at each refresh off a terminal, where no table is redrawn."""
    rows = {v.job: v for v in combined(views)}
    said: set[str] = set()
    lines: list[str] = []
    for v in views:
        if v.state == "unreachable":
            lines.append(f"{v.host}: unreachable ({v.error})")
            continue
        if v.job is None:
            continue
        shown = rows.get(v.job, v)
        if shown is not v:
            if v.job in said:
                continue  # a job with shards: its one "all" line
            said.add(v.job)
        st = shown.status
        where = shown.host if not shown.host.startswith("all (") else shown.host[5:-1]
        text = (f"{v.job} {shown.shown_state} {st.get('done', '-')}/{st.get('failed', '-')}/"
                f"{st.get('total', '?')} on {where}")
        if isinstance(st.get("cost"), (int, float)):
            text += f", {money(st.get('cost'))}"
        if shown.state in ACTIVE_STATES:
            text += f", ETA {eta(st)}"
        lines.append(text)
    return lines


def watch(watcher: Watcher, views: list[JobView], interval: float, live: bool,
          say: Callable[[str], None] | None = None, outage_s: float = 300.0) -> list[JobView]:
    """Refresh until no job runs; with `live`, one table updated in place on the terminal,
    else (`say`) one line per job per refresh. A host that cannot be read is waited for
    (said once per outage) for up to `outage_s`: a network blip does not end the watch."""
    first_unreachable: dict[str, float] = {}

    def waiting() -> bool:
        now = time.monotonic()
        down = {v.host for v in views if v.state == "unreachable" and v.outage}
        for host in list(first_unreachable):
            if host not in down:
                first_unreachable.pop(host)
                console.note(f"{host}: reachable again")
        for host in sorted(down - set(first_unreachable)):
            first_unreachable[host] = now
            console.note(f"{host}: unreachable; still waiting (for up to {outage_s:.0f} s)")
        outage = any(now - since < outage_s for since in first_unreachable.values())
        if down and not outage:
            console.warn(f"{', '.join(sorted(down))}: unreachable for {outage_s:.0f} s; "
                         f"stopped waiting")
        return any(v.state in ACTIVE_STATES for v in views) or outage

    if say is not None and not live:
        for line in progress_lines(views):
            say(line)
    with console.live(table(views), enabled=live) as show:
        while waiting():
            time.sleep(max(0.2, float(interval)))
            views = watcher.collect()
            show(table(views))
            if say is not None and not live:
                stamp = time.strftime("%H:%M:%S")
                for line in progress_lines(views):
                    say(f"{stamp} {line}")
    return views
