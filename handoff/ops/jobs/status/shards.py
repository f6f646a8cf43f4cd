"""A job's shards, put together: where they are (`Shards`, from the layout this workstation
recorded when it launched the job, handoff.config.shards, against the hosts that answered)
and the job's "all" row (`combined`). A host's job.json says the same (its shard, the
count, the hosts): a hint, shown where it disagrees (`layout_notes`), never what decides.
A job launched elsewhere (no layout here) is judged from the hints, bounded (at most
MAX_SHARD_HOSTS shards).

A job that runs on several hosts gets an "all" row: the sums, and the ETA of its slowest
shard (each shard knows its total from the start). A shard not seen (its host unreachable,
or not asked) makes the row `unknown` or `partial`, and `unaccounted` names it: such a
status is never a success.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from handoff.config.shards import ShardLayout
from handoff.config.shards import load as load_layout
from handoff.ops.jobs.state import JobState
from handoff.ops.jobs.status.views import BREAKDOWNS, COUNTS, JobView, _number, answers


def _summed(parts: list[dict[str, int] | None]) -> dict[str, int] | None:
    known = [p for p in parts if p is not None]
    if not known:
        return None
    out: dict[str, int] = {}
    for p in known:
        for k, n in p.items():
            out[k] = out.get(k, 0) + n
    return out


@dataclass(frozen=True)
class Shards:
    """Where a job's shards are, against the hosts that answered: from the workstation's
    layout (`layout`), else from the hosts' job.json (`hosts`: how many, `shard_hosts`:
    which hosts, in shard order)."""

    count: int  # shards the job was launched with (1: not sharded)
    seen: list[JobView]  # the rows of the hosts holding a shard
    missing: list[str]  # the shards not seen: "HOST (why)", or "shard i/n" when unrecorded
    unreachable: bool  # a missing shard's host was asked and could not be read
    prompts: int | None  # the whole input's distinct prompts, when launch knew it
    layout: ShardLayout | None = None  # as this workstation launched it (None: launched elsewhere)
    notes: tuple[str, ...] = ()  # where a host's job.json disagrees with the layout

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


Layouts = Callable[[str], "ShardLayout | None"]


def shards_of(views: list[JobView], layouts: Layouts = load_layout) -> dict[str, Shards]:
    """Per job seen on any host: how many shards it has, and which are not among `views`
    (their host unreachable, or not asked: `status --host one`)."""
    by_job: dict[str, list[JobView]] = {}
    for v in views:
        if v.job is not None and (v.status or v.job_state.meta):
            by_job.setdefault(v.job, []).append(v)
    unreachable = {v.host for v in views if v.state == "unreachable"}
    out: dict[str, Shards] = {}
    for job, seen in by_job.items():
        layout = layouts(job)
        out[job] = (_from_layout(layout, seen, unreachable) if layout is not None
                    else _from_hints(seen, unreachable))
    return out


def _from_layout(layout: ShardLayout, seen: list[JobView], unreachable: set[str]) -> Shards:
    """The shards as this workstation launched them: a host not of the launch holds none of
    them (its row is its own); a shard whose host did not answer is missing."""
    mine = [v for v in seen if layout.shard(v.host) is not None]
    here = {v.host for v in mine}
    missing = [f"{h} ({'unreachable' if h in unreachable else 'not asked'})"
               for h in layout.hosts if h not in here] if layout.sharded else []
    notes = []
    for v in seen:
        hint = (v.job_state.meta or {}).get("shard") or None
        want = layout.spec(v.host) if layout.sharded else None
        if want is None and layout.shard(v.host) is None:
            notes.append(f"{v.job} on {v.host}: not a host this workstation launched the job on "
                         f"(launched on {', '.join(layout.hosts)}): not counted as a shard")
        elif hint != want:
            notes.append(f"{v.job} on {v.host}: its job.json says shard {hint or 'none'}, but "
                         f"this workstation launched it as {want or 'unsharded'}: the "
                         f"workstation's layout is used")
    gone = any(h in unreachable for h in layout.hosts if h not in here)
    return Shards(layout.shards, mine, missing, gone, layout.prompts, layout, tuple(notes))


def _from_hints(seen: list[JobView], unreachable: set[str]) -> Shards:
    """A job launched elsewhere: the hosts' job.json, read bounded (the readers keep a count
    within MAX_SHARD_HOSTS and a shard only as `i/n` handoff could have launched)."""
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
    return Shards(count, seen, missing, gone, _meta_int(newest, "prompts"))


def layout_notes(views: list[JobView]) -> list[str]:
    """Where a host's job.json disagrees with the layout this workstation launched."""
    return [note for shards in shards_of(views).values() for note in shards.notes]


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
        if shards.layout is not None and shards.layout.sharded and shards.prompts is not None:
            summed["total"] = shards.prompts  # what this workstation read, not the hosts' word
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
