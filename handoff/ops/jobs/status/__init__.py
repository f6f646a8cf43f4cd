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

The modules, lowest first (this package's names below are its surface, what the commands
use):

- `views`: a host's job as a row (`JobView`, `KeyView`), and reading them (`Watcher`);
- `shards`: where a job's shards are (`shards_of`: from the layout this workstation
  recorded at launch, handoff.config.shards), its "all" row (`combined`), the shards not
  seen (`unaccounted`), where a host's job.json disagrees (`layout_notes`);
- `tables`: the status tables (one per role; what does not fit a terminal goes to lines
  under them) and the jobs table, and the notes under them;
- `wait`: `--wait`, refreshing until no job runs.
"""

from handoff.ops.jobs.status.shards import Shards, combined, layout_notes, shards_of, unaccounted
from handoff.ops.jobs.status.tables import (
    bad_line_notes,
    batch_notes,
    breakdown_notes,
    jobs_table,
    note,
    status_parts,
    table,
    table_notes,
)
from handoff.ops.jobs.status.views import (
    BREAKDOWNS,
    COUNTS,
    STATUS_FIELDS,
    WITH_FAILURES,
    JobView,
    KeyLookup,
    KeyView,
    Watcher,
    answers,
    eta,
    key_view,
    money,
)
from handoff.ops.jobs.status.wait import progress_lines, watch

__all__ = ["BREAKDOWNS", "COUNTS", "STATUS_FIELDS", "WITH_FAILURES", "JobView", "KeyLookup",
           "KeyView", "Shards", "Watcher", "answers", "bad_line_notes", "batch_notes",
           "breakdown_notes", "combined", "eta", "fitted", "jobs_table", "key_view", "layout_notes",
           "money", "note", "progress_lines", "shards_of", "status_parts", "table", "table_notes",
           "unaccounted", "watch"]
