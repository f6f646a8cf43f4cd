"""How `fab status` and `fab jobs` show the rows: the status table (its columns fitted to
the terminal), the jobs table, and the notes under them (bad input lines, the answers'
breakdown, plain and revoked keys).
"""

from __future__ import annotations

from typing import Any

from handoff import console
from handoff.host.untrusted import count
from handoff.ops.jobs.state import ACTIVE_STATES
from handoff.ops.jobs.status.shards import _summed, combined, shards_of
from handoff.ops.jobs.status.views import JobView, _number, answers, eta, money

COLORS = {"running": "green", "finished": "blue", "starting": "green", "stopping": "yellow"}


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
