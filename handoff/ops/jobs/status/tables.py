"""How `fab status` and `fab jobs` show the rows: the status table (its columns fitted to
the terminal), the jobs table, and the notes under them (bad input lines, the answers'
breakdown, plain and revoked keys).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from handoff import console
from handoff.host.untrusted import batch_counts, count
from handoff.ops.jobs.state import ACTIVE_STATES, latency_quantiles
from handoff.ops.jobs.status.shards import _summed, combined, shards_of
from handoff.ops.jobs.status.views import ROLES, JobView, _number, answers, eta, money

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


def batch_notes(views: list[JobView]) -> list[str]:
    """Per job in batch mode (`generate --mode batch`, its status's `batches`): its batches by
    the provider's state and their requests; and a job whose process is gone while batches
    of its ledger are live, which only a relaunch or `fab stop` ends."""
    lines = []
    for v in views:
        b = batch_counts(v.status.get("batches")) if v.status else None
        where = f"{v.job} ({v.host})"
        if b and b.get("batches"):
            states = _ranked(b.get("by_state") or {})
            at = b.get("live_requests") or 0
            lines.append(f"{where} batches: {b['batches']} ({states}); requests "
                         f"{b.get('requests', 0)}: {b.get('completed', 0)} answered, "
                         f"{b.get('failed', 0)} errors"
                         + (f", {at} at the provider" if at else ""))
        live = v.job_state.live_batches
        if live and not v.job_state.alive:
            lines.append(f"{where}: its process is gone but {live} batch(es) are live at the "
                         f"provider: relaunch the job to collect them, or `fab stop` to "
                         f"cancel them")
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


# --- the status tables -------------------------------------------------------------------
# One table per role of the jobs shown (a generator's and an extractor's columns differ).
# Its first columns are always there, numbers whole: what a glance needs (state, progress,
# speed, money or bytes, ETA). The others follow while the terminal is wide enough; what does
# not fit goes to lines under the table, per row ("sbx-1 B3: p50/p95 s 41.2/88.0; key spend
# ..."), never cut. Off a terminal nothing is left out of the table (no width applies).


@dataclass(frozen=True)
class _Column:
    name: str
    cell: Callable[[JobView, _Row], str]
    numeric: bool = False  # one word, never wrapped: a number is never split


@dataclass
class _Row:
    """What a row shows beyond its status file: for an `all` row, its shards' figures summed."""

    latency: dict[int, int] | None = None
    errors: dict[str, int] | None = None
    retries: int | None = None
    bytes_written: int | None = None
    mismatches: int | None = None
    cancelled: int | None = None


def _seconds(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _latency_cell(v: JobView, row: _Row) -> str:
    found = latency_quantiles(row.latency)
    return "-" if found is None else f"{_seconds(found[0])}/{_seconds(found[1])}"


def _errors_cell(v: JobView, row: _Row) -> str:
    """The error mix: the three most frequent kinds, the retries, and the requests a stop
    closed before their answer (asked again by a relaunch)."""
    parts = [f"{kind} {n}" for kind, n in sorted((row.errors or {}).items(),
                                                  key=lambda kv: (-kv[1], kv[0]))[:3]]
    if len(row.errors or {}) > 3:
        parts.append(f"+{len(row.errors or {}) - 3} kinds")
    text = ", ".join(parts)
    if row.retries:
        text += f"{'; ' if text else ''}{row.retries} retries"
    if row.cancelled:
        text += f"{'; ' if text else ''}{row.cancelled} cancelled"
    return text or "-"


def _progress(v: JobView, row: _Row) -> str:
    st = v.status
    return f"{st.get('done', '-')}/{st.get('failed', '-')}/{st.get('total', '?')}" if st else "-"


def _tps(v: JobView, row: _Row) -> str:
    tps = v.status.get("tokens_per_s")
    return f"{tps:.0f}" if isinstance(tps, (int, float)) else "-"


def _state(v: JobView, row: _Row) -> str:
    if v.job is None and v.state == "none":
        return "no jobs"
    color = "yellow" if v.job_state.with_failures else COLORS.get(v.state, "red")
    return f"[{color}]{console.r(v.shown_state)}[/]"


def _is_all(v: JobView) -> bool:
    return v.host.startswith("all (")


def _key_placed(v: JobView, row: _Row) -> str:
    if _is_all(v):
        return ""
    return ((f"yes ({v.key.mode})" if v.key.placed else "no") if v.key and not v.error else "?")


def _key_spend(v: JobView, row: _Row) -> str:
    if _is_all(v):
        return ""
    return console.r(v.key.spend()) if v.key and not v.error else "?"


def _note(v: JobView, row: _Row) -> str:
    return console.r(note(v)) if not _is_all(v) or v.error else ""


def _bad(v: JobView, row: _Row) -> str:
    return str(v.status.get("bad_lines") or 0) if v.status else "-"


def _cut(v: JobView, row: _Row) -> str:
    cut = count(v.status.get("cut"))
    return str(cut) if cut is not None else "-"


def _gb(v: JobView, row: _Row) -> str:
    return "-" if row.bytes_written is None else f"{row.bytes_written / 1e9:.2f}"


def _mismatches(v: JobView, row: _Row) -> str:
    return "-" if row.mismatches is None else str(row.mismatches)


_HOST = _Column("host", lambda v, r: f"[bold]{console.r(v.host)}[/]" if _is_all(v) else console.r(v.host))
_JOB = _Column("job", lambda v, r: console.r(v.job or "-"))
_STATE = _Column("state", _state)
_PROGRESS = _Column("done/fail/total", _progress, numeric=True)
_TOKENS = _Column("tok/s", _tps, numeric=True)
_ETA = _Column("ETA", lambda v, r: eta(v.status) if v.state in ACTIVE_STATES or "eta_s" in v.status
               else "-", numeric=True)
_CORE = {
    "generator": [_HOST, _JOB, _STATE, _PROGRESS, _TOKENS,
                  _Column("$ spent", lambda v, r: money(v.status.get("cost")), numeric=True), _ETA],
    "extractor": [_HOST, _JOB, _STATE, _PROGRESS, _TOKENS,
                  _Column("GB written", _gb, numeric=True),
                  _Column("mismatches", _mismatches, numeric=True), _ETA],
}
_LATENCY = _Column("p50/p95 s", _latency_cell, numeric=True)
_ERRORS = _Column("errors", _errors_cell)
_BAD = _Column("bad lines", _bad, numeric=True)
_CUT = _Column("cut", _cut, numeric=True)
_NOTE = _Column("note", _note)
# The columns after the core, most wanted first: the last ones go under the table first.
_EXTRA = {
    "generator": [_LATENCY, _ERRORS, _BAD, _CUT, _Column("key placed", _key_placed),
                  _Column("key spend", _key_spend), _NOTE],
    "extractor": [_BAD, _NOTE],
}


def _rows(views: list[JobView]) -> list[tuple[JobView, _Row]]:
    """Every row (the hosts' jobs, then each sharded job's `all` row) with its figures: an
    `all` row's summed over the job's shards (latency histograms merged)."""
    roles = {v.job: v.role for v in views if v.job is not None}
    out = []
    for v in [*views, *combined(views)]:
        shards = [x for x in views if x.job == v.job and x.status] if _is_all(v) else [v]
        if _is_all(v):
            v.role = roles.get(v.job or "", v.role)
        latency: dict[int, int] = {}
        for x in shards:
            for i, n in (x.job_state.latency or {}).items():
                latency[i] = latency.get(i, 0) + n
        errors = _summed([x.status.get("errors_by_kind") for x in shards])

        def total(key: str, among: list[JobView] = shards) -> int | None:
            known = [c for c in (count(x.status.get(key)) for x in among) if c is not None]
            return sum(known) if known else None

        out.append((v, _Row(latency or None, errors, total("retries"), total("bytes_written"),
                            total("retokenized_mismatch"), total("cancelled"))))
    return out


def status_parts(views: list[JobView]) -> list[Any]:
    """The status tables (one per role shown) and, on a terminal too narrow for every column,
    the lines under each that hold what did not fit."""
    rows = _rows(views)
    roles = [role for role in ROLES if any(v.role == role for v, _ in rows)] or ["generator"]
    parts: list[Any] = []
    for role in roles:
        mine = [(v, r) for v, r in rows if v.role == role]
        title = "status" if len(roles) == 1 else f"status: {role} jobs"
        parts += _role_table(title, _CORE[role], _EXTRA[role], mine)
    return parts


def table(views: list[JobView]) -> Any:
    """The status as one renderable (the live display of `--wait` redraws it)."""
    from rich.console import Group

    parts = status_parts(views)
    return parts[0] if len(parts) == 1 else Group(*parts)


def _role_table(title: str, core: list[_Column], extra: list[_Column],
                rows: list[tuple[JobView, _Row]]) -> list[Any]:
    cells = {c.name: [c.cell(v, r) for v, r in rows] for c in [*core, *extra]}
    # A column nobody fills is left out (bad lines, cut, errors, latency, notes).
    shown = [c for c in extra if any(x not in ("", "-", "0") for x in cells[c.name])]
    if not console.console().is_terminal:
        return [_drawn(title, [*core, *shown], cells, len(rows))]
    width = console.console().width
    parts: list[Any] = []
    moved = shown
    for boxed in (True, False):  # ruled, else (narrower) borderless as kubectl prints
        if _need(core, cells, boxed) > width:
            continue
        kept = list(shown)
        while kept and _need(core + kept, cells, boxed) > width:
            kept.pop()  # the least wanted goes under the table
        moved = [c for c in shown if c not in kept]
        parts.append(_drawn(title, [*core, *kept], cells, len(rows), width, boxed))
        break
    else:  # too narrow even for that: one line per row, words never split
        parts.append(f"[bold]{console.r(title)}[/]")
        for i in range(len(rows)):
            parts.append(" ".join(f"{c.name} {cells[c.name][i]}" if c.numeric else cells[c.name][i]
                                  for c in core))
    for i, (v, _) in enumerate(rows):
        said = [f"{c.name} {cells[c.name][i]}" for c in moved
                if cells[c.name][i] not in ("", "-", "?")]
        if said:
            where = f"{console.r(v.host)} {console.r(v.job or '-')}"
            parts.append(f"  {where}: " + "; ".join(said))
    return parts


def _words(cell: str) -> list[str]:
    from rich.text import Text

    return Text.from_markup(cell).plain.split() or [""]


def _mins(columns: list[_Column], cells: dict[str, list[str]]) -> list[int]:
    """Each column's longest word (its header's too): no narrower, or a word would break."""
    from rich.cells import cell_len

    return [max(cell_len(w) for cell in [c.name, *cells[c.name]] for w in _words(cell))
            for c in columns]


def _overhead(n: int, boxed: bool) -> int:
    """The width a table's rules and padding take: rich's ruled tables 3 per column and 1;
    the borderless one a space between columns."""
    return 3 * n + 1 if boxed else n - 1


def _need(columns: list[_Column], cells: dict[str, list[str]], boxed: bool = True) -> int:
    """The width a table of `columns` needs so that no cell breaks inside a word."""
    return sum(_mins(columns, cells)) + _overhead(len(columns), boxed)


def _drawn(title: str, columns: list[_Column], cells: dict[str, list[str]], n: int,
           width: int | None = None, boxed: bool = True) -> Any:
    """The table; on a terminal (`width`) each column gets an explicit width, its longest
    word at least, the rest shared from the widest down, so rich never breaks a word."""
    rows = [[cells[c.name][i] for c in columns] for i in range(n)]
    t = console.table(title, [c.name for c in columns], rows)
    if width is None:
        return t
    from rich.cells import cell_len
    from rich.text import Text

    if not boxed:
        t.box, t.padding, t.pad_edge, t.show_edge = None, (0, 1, 0, 0), False, False
    mins = _mins(columns, cells)
    maxs = [max(cell_len(line) for cell in [c.name, *cells[c.name]]
                for line in Text.from_markup(cell).plain.splitlines() or [""]) for c in columns]
    for column, w in zip(t.columns, _fit(mins, maxs, width - _overhead(len(columns), boxed)),
                         strict=True):
        column.width = w
    return t


def _fit(mins: list[int], maxs: list[int], budget: int) -> list[int]:
    """Column widths within `budget`: each as wide as its content when all fit, else the
    widest ones narrowed first, none below its longest word (`mins`)."""
    widths = [max(a, b) for a, b in zip(mins, maxs, strict=True)]
    excess = sum(widths) - budget
    while excess > 0:
        room = [i for i, w in enumerate(widths) if w > mins[i]]
        if not room:
            break
        top = max(widths[i] for i in room)
        widest = [i for i in room if widths[i] == top]
        below = max([widths[i] for i in room if widths[i] < top] + [max(mins[i] for i in widest)])
        for i in widest:
            cut = min(top - max(below, mins[i]), -(-excess // len(widest)), excess) or 1
            cut = min(cut, widths[i] - mins[i], excess)
            widths[i] -= cut
            excess -= cut
    return widths


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
