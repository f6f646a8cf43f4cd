"""A job's shards, put together: where they are (`Shards`, from the layout this workstation
recorded when it launched the job, handoff.config.shards, against the hosts that answered)
and the job's "all" row (`combined`). A host's job.json says the same (its shard, the
count, the hosts): a hint, shown where it disagrees (`layout_notes`), never what decides.
A job launched elsewhere (no layout here) is judged from the hints, bounded (at most
MAX_SHARD_HOSTS shards).

A job that runs on several hosts gets an "all" row: the sums, its state from every shard's
(`overall`: `running` only while every shard runs or has finished; else `partial`,
`stopping`, `stopped`, `finished`, with the shards that do not run named), and the ETA of
its slowest running shard (each shard knows its total from the start). A shard not seen
(its host unreachable, or not asked) makes the row `partial`, and `unaccounted` names it:
such a status is never a success.
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
        """`partial` when a shard's host could not be read or was not asked; None: every
        shard is here."""
        return "partial" if self.missing else None


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
    """The shards as this workstation launched them: the hosts that run a shard now (its
    `holders`) are the job's shards; a host a shard moved away from (a take-over) and a host
    not of the launch hold none of them (their rows are their own); a holder that did not
    answer is missing."""
    holders = layout.holders
    mine = [v for v in seen if v.host in holders]
    here = {v.host for v in mine}
    missing = [f"{h} ({'unreachable' if h in unreachable else 'not asked'})"
               for h in holders if h not in here] if layout.sharded else []
    notes = []
    for v in seen:
        hint = (v.job_state.meta or {}).get("shard") or None
        want = layout.spec(v.host) if layout.sharded else None
        moved = [m for m in layout.now.moves if m.source == v.host and v.host not in holders]
        if moved:
            notes.append(f"{v.job} on {v.host}: its shard moved to "
                         f"{', '.join(sorted({m.taker for m in moved}))} (a take-over): its "
                         f"row is its own, the job's is the hosts that run it now")
        elif want is None and v.host not in layout.order:
            notes.append(f"{v.job} on {v.host}: not a host this workstation launched the job on "
                         f"(launched on {', '.join(layout.hosts)}): not counted as a shard")
        elif hint != want and v.host in holders:
            notes.append(f"{v.job} on {v.host}: its job.json says shard {hint or 'none'}, but "
                         f"this workstation launched it as {want or 'unsharded'}: the "
                         f"workstation's layout is used")
    for m in layout.now.moves:
        if layout.now.runner(m.shard) == m.taker:
            notes.append(f"{layout.job}: shard {m.shard}/{layout.shards} moved from {m.source} "
                         f"to {m.taker} (take-over): {m.done + m.failed} of its ids were in "
                         f"hand from {m.source}'s last fetched copy, the rest asked there")
    gone = any(h in unreachable for h in holders if h not in here)
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


RUNNING = ("running", "starting")


def _said(v: JobView) -> str:
    """A shard that does not run, for the `all` row's note: `sbx-2 stopped (402 ...)`."""
    why = str(v.status.get("stop_reason") or "") if v.status else ""
    return f"{v.host} {v.shown_state}" + (f" ({why})" if why and v.state != "finished" else "")


def overall(seen: list[JobView], missing: list[str]) -> tuple[str, list[str]]:
    """A sharded job's state from every shard's (`seen`: the shards' rows; `missing`: the
    shards not seen, "HOST (why)"), and the shards that keep it from running, named:

    - `finished` when every shard finished (`finished with failures` is the row's exit
      code 1, as for a host's row);
    - `running` while every shard runs or has finished;
    - `stopping` when none runs and one is draining, `stopped` when none runs (a shard
      stopped, aborted or dead, the rest finished or stopped);
    - otherwise `partial`: some shards run, others do not or cannot be seen (named)."""
    running = [v for v in seen if v.state in RUNNING]
    finished = [v for v in seen if v.state == "finished"]
    stopping = [v for v in seen if v.state == "stopping"]
    idle = [v for v in seen if v not in running and v not in finished and v not in stopping]
    named = [_said(v) for v in [*stopping, *idle]] + list(missing)
    if not missing and len(finished) == len(seen) and seen:
        return "finished", []
    if running and not named:
        return "running", []
    if not running and not missing and seen:
        return ("stopping" if stopping and not idle else "stopped"), named
    return "partial", named


def combined(views: list[JobView]) -> list[JobView]:
    """One "all" view per job that has shards on several hosts: done, failed, total, cost and
    tok/s summed (with the ids of a moved shard already in hand), its state from every
    shard's (`overall`), its ETA that of the slowest running shard (`eta_s`; none when no
    shard runs). A shard not seen leaves the failures unknown (`?`) and the total the whole
    input's. Never fails on shards that have not written a status yet (right after a
    launch)."""
    out = []
    for job, shards in shards_of(views).items():
        present = [v for v in shards.seen if v.status]
        if shards.count < 2 and len(present) < 2:
            continue
        sts = [v.status for v in present]
        summed: dict[str, Any] = {k: sum(_number(st.get(k)) for st in sts)
                                  for k in ("done", "failed", "cost", "tokens_per_s")}
        layout = shards.layout
        moves = list(layout.now.moves) if layout else []  # ids in hand in the sources' copies
        summed["done"] = int(summed["done"]) + sum(m.done for m in moves)
        summed["failed"] = int(summed["failed"]) + sum(m.failed for m in moves)
        # Every shard reads the whole file: its bad lines are the file's, not a share.
        summed["bad_lines"] = max((int(_number(st.get("bad_lines"))) for st in sts), default=0)
        totals = [t for t in (st.get("total") for st in sts) if isinstance(t, int)]
        summed["total"] = sum(totals) if sts and len(totals) == len(sts) else None
        if layout is not None and layout.sharded and shards.prompts is not None:
            summed["total"] = shards.prompts  # what this workstation read, not the hosts' word
        got = [answers(st) for st in sts]
        for k in BREAKDOWNS:
            summed[k] = _summed([g[k] for g in got])
        for k in COUNTS:
            known = [g[k] for g in got if g[k] is not None]
            summed[k] = sum(known) if known else None
        state, named = overall(shards.seen, shards.missing)
        label = f"all ({len(present)} host{'s' if len(present) != 1 else ''})"
        if shards.missing:
            summed.update(failed="?", total=shards.prompts if shards.prompts is not None else "?")
            label = f"all ({len(shards.seen)} of {shards.count} shards)"
        running = [v.status for v in shards.seen if v.state in RUNNING]
        etas = [_seconds_left(st) if st else None for st in running]
        if etas and all(e is not None for e in etas):
            summed["eta_s"] = max(e or 0.0 for e in etas)
        summed["state"] = state
        if state == "finished" and any(v.job_state.with_failures for v in present):
            summed["exit_code"] = 1
        error = None
        if named:
            error = f"{state}: " + ", ".join(named)
        out.append(JobView(label, job, state, JobState("", status=summed), error=error))
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
