"""`fab status --wait`: refresh until no job runs, through a transient host outage.

On a terminal one table is updated in place; off one (piped, logged) one line per job per
refresh, so the watch shows progress instead of nothing until the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from handoff import console
from handoff.ops.jobs.state import ACTIVE_STATES
from handoff.ops.jobs.status.shards import combined
from handoff.ops.jobs.status.tables import table
from handoff.ops.jobs.status.views import JobView, Watcher, eta, money


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
        if shown.state in ACTIVE_STATES or "eta_s" in st:
            text += f", ETA {eta(st)}"
        if shown.error and shown is not v:  # an `all` row: the shards that do not run
            text += f" ({shown.error})"
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
