"""The input survey: one pass over the prompts file before anything is sent.

It answers, before the first request, what a run used to learn only at its end (or
never): how many valid records the file holds, how many this shard owns and still has
to do (so `total` and the ETA are right from the start on sharded runs too), which lines
are bad and why, and which ids repeat. An input with no valid record fails here (exit 2)
instead of "finishing" having done nothing.

Bad lines are reported without flooding the log: the first `LOG_BAD_LINES` are printed
with their line number and reason, then one summary line; the status file carries the
count (`bad_lines`) and a sample of `SAMPLE_BAD_LINES` (`bad_line_samples`).

Cost: one `json.loads` per line plus a sha256 for records without an id, ~10-20 µs per
typical line (about 1-3 s for 200k lines), and 8 bytes per owned id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from payload.errors import UsageError
from payload.generate.journal import IdSet, Index, id_hash
from payload.records import BadRecord, Shard, excluded, iter_input, iter_lines, parse_prompt
from payload.report import Reporter

LOG_BAD_LINES = 10
SAMPLE_BAD_LINES = 20


@dataclass
class BadLines:
    """Counts bad lines; logs the first few and keeps a capped sample for the status file."""

    source: Path
    reporter: Reporter
    count: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, line_no: int, reason: str) -> None:
        self.count += 1
        if self.count <= LOG_BAD_LINES:
            self.reporter.say(f"{self.source}: line {line_no}: bad record skipped: {reason}")
        if len(self.samples) < SAMPLE_BAD_LINES:
            self.samples.append({"line": line_no, "reason": reason[:200]})

    def summary(self) -> str | None:
        if self.count <= LOG_BAD_LINES:
            return None
        return (f"{self.source}: {self.count} bad lines in all (the first {LOG_BAD_LINES} "
                f"shown; status file: bad_lines, bad_line_samples)")


@dataclass
class Survey:
    lines: int = 0  # non-blank lines
    valid: int = 0  # valid records in the whole file (every shard)
    duplicates: int = 0  # valid records whose id this shard already saw
    owned: int = 0  # distinct ids this shard owns (its `total`)
    recorded: int = 0  # of those, already in the output or errors file (resume)


def survey(path: Path, shard: Shard, index: Index, bad: BadLines, reporter: Reporter
           ) -> Survey:
    """Read the whole input once (streamed): count, validate, dedupe. Reports bad lines
    (through `bad`) and duplicate ids; nothing is kept but 8 bytes per owned id."""
    out = Survey()
    seen = IdSet()
    dup_reports = 0
    for line_no, text in iter_input(path):
        out.lines += 1
        if isinstance(text, BadRecord):
            bad.add(line_no, str(text))
            continue
        try:
            prompt = parse_prompt(text, line_no)
        except BadRecord as exc:
            bad.add(line_no, str(exc))
            continue
        out.valid += 1
        if not shard.owns(prompt.key):
            continue
        h = id_hash(prompt.key)
        if h in seen:
            out.duplicates += 1
            if dup_reports < LOG_BAD_LINES:
                dup_reports += 1
                reporter.say(f"{path}: line {line_no}: duplicate id {prompt.key!r} skipped")
            continue
        seen.add(h)
        out.owned += 1
        if h in index.done or h in index.failed:
            out.recorded += 1
    if out.duplicates > dup_reports:
        reporter.say(f"{path}: {out.duplicates} duplicate ids in all (the first "
                     f"{dup_reports} shown)")
    return out


def exclusions(path: Path) -> IdSet:
    """`--exclude-ids FILE`: the ids already answered elsewhere (a shard taken over from a
    host whose copy holds them), one JSON string per line, held at 8 bytes each: this run
    owns none of them (records.Shard.skip), so none is asked again."""
    found = IdSet()
    try:
        for h in excluded(iter_lines(path)):
            found.add(h)
    except OSError as exc:
        raise UsageError(f"--exclude-ids {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--exclude-ids {path}: {exc}") from None
    return found
