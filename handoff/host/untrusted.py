"""What a host says, checked before the workstation acts on it or shows it.

The host is not trusted: its login user (a compromised image, another tenant of a shared
box) controls every byte a remote module answers, every status, job and record file, every
listing, log line and stderr. Everything read from a host enters through this module:

- `loads`: a remote JSON answer, with non-finite numbers (`NaN`, `Infinity`, `1e400`)
  read as None, so no infinity or NaN ever reaches arithmetic or output;
- `Capped`: a byte budget for what a host sends (a remote module's answer, its stderr, a
  log line), so a 300 MB answer costs a few MB and an error that says so, not 1 GB of RSS;
- typed readers (`number`, `count`, `text`, `flag`, `strings`): the value when it has the
  right type (finite, non-negative where it matters, strings cut to a length), else None;
  `status`/`meta` read a job's status.json / job.json field by field, and say which fields
  were wrong;
- names (`name_problem`, `job_name`, `rel_path`, `inside`): what a host names is a plain
  folder name or a relative path below a folder: no absolute path, no `..`, no NUL or
  control character, never a path that leaves its folder on the workstation;
- `visible` (handoff.console's, which every print goes through): control characters shown
  as `\\x1b`-style escapes, so a terminal never receives an escape sequence from a host
  (OSC 52 clipboard writes, screen clears, titles, hyperlinks); JSON output keeps the
  strings and lets JSON escape them.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from handoff.console import has_control, visible
from handoff.errors import RemoteError

# How much of each kind of thing a host may send. The real answers are far below: the
# largest remote module answer (a `list` of a few hundred jobs) is tens of KB.
MAX_ANSWER_BYTES = 8 << 20  # a remote module's JSON answer
MAX_STDERR_BYTES = 64 << 10  # what a failing remote command wrote to stderr (its tail shown)
MAX_LINE_CHARS = 16 << 10  # one log line as shown; the rest is cut, with its length said
MAX_TEXT_CHARS = 4096  # one string field (last_error, stop_reason, a record's name)
MAX_NAME_CHARS = 255  # a job or file name (a POSIX NAME_MAX)
MAX_SAMPLES = 20  # bad_line_samples kept per job
MAX_NAMES = 32  # providers / finish reasons kept per job (the rest summed)
MAX_SHOWN_NAME = 64  # one provider or finish-reason name as shown
MAX_SHARD_HOSTS = 4096  # hosts one job is sharded over, as job.json lists them

class Untrusted(RemoteError, ValueError):
    """A host's answer failed a check; the message says what was wrong (shown visibly).
    A RemoteError: it fails that host (its row, its report), never the command."""


class TooLarge(Untrusted):
    """A host sent more than its budget."""

    def __init__(self, what: str, limit: int, seen: int | None = None) -> None:
        more = f" ({mb(seen)} and counting)" if seen is not None else ""
        super().__init__(f"{what} is too large: more than {mb(limit)}{more}; refused (a "
                         f"host's answer is capped at {mb(limit)})")
        self.limit = limit


def mb(n: int | float | None) -> str:
    """Bytes for people: `8.0 MB`, `1.1 TB`."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(value) < 1000 or unit == "PB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} PB"  # pragma: no cover (the loop returns)


# -- reading --------------------------------------------------------------------------------------

def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def loads(raw: str | bytes) -> Any:
    """JSON from a host: `NaN`, `Infinity` and numbers too large for a float read as None."""
    return json.loads(raw, parse_constant=lambda _name: None, parse_float=_finite)


def number(value: Any, *, minimum: float | None = None) -> float | None:
    """A finite int or float (never a bool, never a numeric string), at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        result = float(value)
    except OverflowError:  # an int too large for a float
        return None
    if not math.isfinite(result) or (minimum is not None and result < minimum):
        return None
    return result


def count(value: Any) -> int | None:
    """A whole number >= 0 (an int, or a float with no fraction)."""
    n = number(value, minimum=0)
    return int(n) if n is not None and n == int(n) else None


def integer(value: Any) -> int | None:
    """Any whole number (an exit code may be negative: a signal)."""
    n = number(value)
    return int(n) if n is not None and n == int(n) else None


def text(value: Any, limit: int = MAX_TEXT_CHARS) -> str | None:
    """A string, cut to `limit` characters (the rest counted); anything else None."""
    if not isinstance(value, str):
        return None
    return value if len(value) <= limit else value[:limit] + f"… ({len(value) - limit} more characters)"


def flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


_FILE_ID = re.compile(r"[0-9]{1,20}:[0-9]{1,20}")


def file_id(value: Any) -> str | None:
    """A host file's identity as fetch_list reports it (`device:inode`: two short numbers),
    else None (no id). Compared for equality only, never used as a path."""
    return value if isinstance(value, str) and _FILE_ID.fullmatch(value) else None


def strings(value: Any, limit: int = MAX_SAMPLES) -> list[str]:
    return [s for s in (text(v) for v in value[:limit]) if s is not None] if isinstance(value, list) else []


# What each status.json field is (docs/records.md); a field of the wrong type reads as None
# and is named in the problems, so the row says which field a host got wrong. Fields not
# listed here (the extractor's own, newer payloads') are kept when they are plain scalars.
Reader = Callable[[Any], Any]


def _non_negative(value: Any) -> float | None:
    return number(value, minimum=0)


def _time(value: Any) -> Any:
    """`started`/`updated`: ISO 8601 text (the generator) or unix seconds (the extractor)."""
    return text(value, 64) if isinstance(value, str) else _non_negative(value)


_STATUS: dict[str, Reader] = {
    "state": lambda v: text(v, 64), "stop_reason": lambda v: text(v, 200), "last_error": text,
    "done": count, "failed": count, "total": count, "bad_lines": count, "duplicates": count,
    "max_failed": count, "exit_code": integer, "in_flight": _non_negative,
    "window": _non_negative, "cost": _non_negative, "max_cost": _non_negative,
    "tokens_per_s": _non_negative, "rate_rps": _non_negative, "outage_s": _non_negative,
    "started": _time, "updated": _time, "budget_enforced": flag,
    "bad_line_samples": lambda v: _samples(v),
    "by_provider": lambda v: counts_by_name(v), "by_finish_reason": lambda v: counts_by_name(v),
    "cut": count, "timeouts": count, "think_split": count,
    # the error mix (generator) and what an extractor reports (fab status shows them)
    "errors_by_kind": lambda v: counts_by_name(v), "retries": count,
    "tokens_written": count, "bytes_written": count, "estimate_bytes": count,
    "retokenized_mismatch": count, "skipped_mismatch": count,
}


def _samples(value: Any) -> list[dict[str, Any]] | None:
    if not isinstance(value, list):
        return None
    out = []
    for s in value[:MAX_SAMPLES]:
        if isinstance(s, dict):
            out.append({"line": count(s.get("line")), "reason": text(s.get("reason"), 500)})
    return out


def scalar(value: Any) -> Any:
    """A plain value kept as it is: None, a bool, a finite number, a string (cut); else None."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return number(value)
    return text(value)


def fields(raw: Any, readers: dict[str, Reader], what: str) -> tuple[dict[str, Any] | None, list[str]]:
    """(the fields of `raw`, each known one read by its reader, the others kept when they are
    plain scalars; problems): a known field of the wrong type is left out and named."""
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        return None, [f"{what} is not a JSON object ({type(raw).__name__})"]
    out: dict[str, Any] = {}
    problems = []
    for name, value in raw.items():
        if not isinstance(name, str) or value is None:
            continue
        read = readers.get(name)
        if read is None:
            kept = scalar(value)
            if kept is not None:
                out[name] = kept
            continue
        checked = read(value)
        if checked is None:
            problems.append(f"{what}: {name} {visible(repr(value), 40)} is not valid")
        else:
            out[name] = checked
    return out, problems


def shown_name(value: Any) -> str:
    """A provider or finish-reason name as shown: printable, at most MAX_SHOWN_NAME characters."""
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    return text if len(text) <= MAX_SHOWN_NAME else text[:MAX_SHOWN_NAME - 1] + "…"


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
        out[shown_name(key)] = out.get(shown_name(key), 0) + c
    if len(out) > MAX_NAMES:
        ranked = sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))
        kept = dict(ranked[:MAX_NAMES - 1])
        rest = ranked[MAX_NAMES - 1:]
        kept[f"other ({len(rest)} names)"] = sum(n for _, n in rest)
        out = kept
    return out


def status(raw: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """A job's status.json as a host returned it, field by field."""
    return fields(raw, _STATUS, "status.json")


def _host_names(value: Any) -> list[str] | None:
    """job.json's `shard_hosts`: the hosts' labels in shard order, each cut and shown visibly
    (they are only printed, never used to pick a host)."""
    if not isinstance(value, list) or len(value) > MAX_SHARD_HOSTS:
        return None
    names = [text(v, 200) for v in value]
    return None if any(n is None for n in names) else [visible(n) for n in names if n is not None]


_META: dict[str, Reader] = {
    "shard": lambda v: text(v, 64), "input": text, "input_sha256": lambda v: text(v, 64),
    "hosts": count, "max_cost": _non_negative, "shard_hosts": _host_names, "prompts": count,
}


def meta(raw: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """A job's job.json as a host returned it (plain fields; the ones handoff reads typed)."""
    return fields(raw, _META, "job.json")


# -- names --------------------------------------------------------------------------------------

def name_problem(name: Any, *, path: bool = False) -> str | None:
    """Why `name` is not a plain name (`path`: a relative path of plain names); None if it is."""
    if not isinstance(name, str) or not name:
        return "not a name"
    if len(name) > (4096 if path else MAX_NAME_CHARS):
        return "too long"
    if "\x00" in name or has_control(name):
        return "holds a NUL or control character"
    if name.startswith("/"):
        return "an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "climbs out with '..'"
    if not path and len(parts) > 1:
        return "holds a '/'"
    if any(p in ("", ".") for p in parts):
        return "holds an empty or '.' component"
    if not path and name.startswith("."):
        return "starts with '.'"
    return None


def job_name(name: Any) -> str:
    """A job name from a host: the `--job` rule (one plain folder name), else Untrusted."""
    problem = name_problem(name)
    if problem:
        raise Untrusted(f"job name {visible(repr(name), 80)} {problem}")
    return str(name)


def rel_path(rel: Any) -> str:
    """A file's path relative to its job folder, from a host, else Untrusted."""
    problem = name_problem(rel, path=True)
    if problem:
        raise Untrusted(f"file {visible(repr(rel), 1024)} {problem}")
    return str(rel)


def inside(root: Path, rel: str) -> Path:
    """`root/rel` on the workstation, proven to stay under `root`: `rel` is checked, and no
    component below `root` that exists may be a symlink (a link planted earlier would
    carry the write elsewhere). Untrusted otherwise."""
    rel = rel_path(rel)
    target = root.joinpath(*PurePosixPath(rel).parts)
    here = root
    for part in PurePosixPath(rel).parts:
        here = here / part
        if here.is_symlink():
            raise Untrusted(f"{visible(str(here))} is a symlink on the workstation; not followed")
    base = os.path.realpath(root)
    real = os.path.realpath(target)
    if real != base and not real.startswith(base.rstrip("/") + "/"):
        raise Untrusted(f"file {visible(repr(rel), 120)} would be written outside {visible(str(root))}")
    return target


def refused(names: Iterable[str]) -> str:
    """`a, b and 2 more` for a message naming refused entries (each already visible)."""
    shown = list(names)
    head = ", ".join(shown[:10])
    return head + (f" and {len(shown) - 10} more" if len(shown) > 10 else "")


# -- sizes -----------------------------------------------------------------------------------------

class Capped:
    """Bytes from a host, up to `limit`: `add` raises TooLarge past it (the caller then
    stops reading and closes the channel)."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.data = bytearray()
        self.seen = 0

    def add(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        if self.seen > self.limit:
            raise TooLarge(self.what, self.limit, self.seen)
        self.data += chunk


class Tail:
    """The last `limit` bytes of a stream (a failing command's stderr: its end says why)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.seen = 0

    def add(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        self.data += chunk
        if len(self.data) > 2 * self.limit:
            del self.data[:-self.limit]

    def bytes(self) -> bytes:
        return bytes(self.data[-self.limit:])


class Lines:
    """Splits a host's stream into lines, none longer than `limit` bytes: the rest of a
    longer line is dropped as it arrives (never buffered) and its length said."""

    def __init__(self, limit: int = MAX_LINE_CHARS) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.dropped = 0  # bytes of the current line dropped so far

    def feed(self, chunk: bytes) -> list[str]:
        out = []
        while chunk:
            nl = chunk.find(b"\n")
            piece, chunk = (chunk, b"") if nl < 0 else (chunk[:nl], chunk[nl + 1:])
            room = self.limit - len(self.buf)
            if room > 0:
                self.buf += piece[:room]
            self.dropped += max(0, len(piece) - max(room, 0))
            if nl >= 0:
                out.append(self._line())
        return out

    def _line(self) -> str:
        line = bytes(self.buf).decode("utf-8", "replace")
        if self.dropped:
            line += f"… ({self.dropped} more bytes of this line not shown)"
        self.buf.clear()
        self.dropped = 0
        return line

    def rest(self) -> list[str]:
        return [self._line()] if self.buf or self.dropped else []
