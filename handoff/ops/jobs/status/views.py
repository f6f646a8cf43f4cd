"""What `fab status` knows of one host's job: a row (`JobView`, its key `KeyView`) and how
the rows are read (`Watcher`: one round trip per host and refresh).

A host that cannot be read is an "unreachable" row, never left out; `outage` tells a
connection that failed (a blip `--wait` waits through) from a host that answered something
unusable (final). The key is read from the host too: whether its key file is there, and
whether it is a minted child key (the record beside it names its hash); a child key's
usage, limit and expiry come from the management API, asked from the workstation
(`KeyLookup`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handoff.errors import ConnectError, HandoffError
from handoff.host import keyrecord
from handoff.host.session import Connector, Session
from handoff.host.targets import Target
from handoff.host.untrusted import count, counts_by_name
from handoff.ops import keyapi
from handoff.ops.jobs.state import (
    OK_STATES,
    JobState,
    job_name,
    latency_quantiles,
    read,
    read_all,
    unknown_job,
)
from handoff.run.parallel import HostReport, run_parallel
from payload import units

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
    own: bool = False  # the job's own key (a job with a budget), not the host's

    @property
    def mode(self) -> str:
        if not self.placed:
            return "none"
        return ("job's own" if self.own else "minted") if self.record is not None else "plain"

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
        rec: dict[str, Any] = {"placed": self.placed, "mode": "minted" if self.own else self.mode}
        if self.own:
            rec["own"] = True  # the job's own key (a job with a budget), not the host's
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
    own = job_state.own_key_record if job_state.own_key else None
    view = (KeyView(True, own, own=True) if own is not None
            else KeyView(bool(job_state.keys_placed), job_state.key_record))
    if view.record is None or lookup is None or target is None:
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
                 "window", "outage_s", "started", "retries", "batches")
# An extractor's own (payload/extract/status.py), in `--json` for its jobs.
EXTRACTOR_FIELDS = ("tokens_written", "bytes_written", "estimate_bytes", "retokenized_mismatch",
                    "skipped_mismatch")
ROLES = ("generator", "extractor")  # how a job is shown: its columns, its estimate


def role_of(meta: dict[str, Any] | None, fallback: str | None) -> str:
    """How a job is shown: an extractor's or a generator's, as its job.json says (`kind`, or
    an older one's role named `extractor`), else as its host's role is (`Role.kind`)."""
    meta = meta or {}
    kind = meta.get("kind") or ("extractor" if meta.get("role") == "extractor" else None)
    return "extractor" if (kind or fallback) == "extractor" else "generator"


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
    role: str = "generator"  # how it is shown (role_of)

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
        rec["errors_by_kind"] = st.get("errors_by_kind")  # checked by untrusted.status
        rec["latency_s"] = latency_json(self.job_state.latency)
        rec["role"] = self.role
        if self.role == "extractor":
            rec.update({key: st.get(key) for key in EXTRACTOR_FIELDS})
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
        """Running or finished cleanly; a host with no job at all is fine too (nothing of it
        failed: `status` with no jobs says so and exits 0)."""
        if self.job is None and self.state == "none":
            return not self.job_state.problems
        return (self.state in OK_STATES and not self.job_state.with_failures
                and not self.job_state.problems)


def latency_json(bins: dict[int, int] | None) -> dict[str, float] | None:
    """`{"p50": s, "p95": s}` of a latency histogram (to its bins' 1%), None without answers."""
    found = latency_quantiles(bins)
    return None if found is None else {"p50": round(found[0], 3), "p95": round(found[1], 3)}


def eta(st: dict[str, Any]) -> str:
    """Time to finish: a host's from its rate; an `all` row's is given (`eta_s`: its slowest
    running shard's, shards.combined)."""
    if "eta_s" in st:
        return units.eta(_number(st["eta_s"]), 1.0)
    total = st.get("total")
    if not isinstance(total, int) or not total or not isinstance(st.get("failed", 0), int):
        return "-"  # unknown: a shard not seen leaves the failures `?`
    return units.eta(total - _number(st.get("done")) - _number(st.get("failed")), st.get("rate_rps"))


def money(value: Any) -> str:
    return f"${value:.4f}" if isinstance(value, (int, float)) else "-"


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


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
                                               outage=isinstance(exc, (ConnectError, OSError)),
                                               role=role_of(None, target.role.kind
                                                            if target.role else None))]
                raise

        run_parallel(self.targets, one, title="status", grouped=False, summary=False)
        return [v for t in self.targets for v in views.get(t.label, [])]

    def _read(self, s: Session, job: str | None) -> list[JobView]:
        """The `--job` job, or every job on the host (one round trip either way)."""
        label = s.target.label
        own = s.target.role.kind if s.target.role else None
        if job is not None:
            current = read(s, job, latency=True)
            error = str(unknown_job(s, job)) if current.state == "none" else None
            return [JobView(label, job, current.state, current, error=error,
                            key=key_view(current, self.key_lookup, s.target),
                            role=role_of(current.meta, own))]
        host = read_all(s, latency=True)
        key = key_view(host.keys, self.key_lookup, s.target)  # one lookup per host, for its jobs
        if not host.jobs:
            return [JobView(label, None, "none", host.keys, key=key, role=role_of(None, own))]
        # A job with a key of its own shows that key (one more lookup each), the rest the host's.
        return [JobView(label, name, current.state, current,
                        key=key_view(current, self.key_lookup, s.target)
                        if current.own_key and current.own_record else key,
                        role=role_of(current.meta, own))
                for name, current in host.jobs.items()]

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()
        self.sessions.clear()
