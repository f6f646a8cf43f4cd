"""What a host says, checked before the workstation acts on it or shows it.

The host is not trusted: its login user (a compromised image, another tenant of a shared
box) controls every byte a remote module answers, every status, job and record file, every
listing, log line and stderr. Everything read from a host enters through this module:

- `loads`: the one reader of every JSON a host sends (a remote module's answer, a key
  record, a fetched status.json or job.json), bounded by construction (`Limits`: bytes,
  nesting depth, string length, integer digits, values in all): a JSON bomb, a 5000-digit
  number or a 100,000-deep nesting is that host's error (`Untrusted`), never a traceback
  or unbounded memory; non-finite numbers (`NaN`, `Infinity`, `1e400`) read as None, so
  no infinity or NaN ever reaches arithmetic or output;
- declared shapes: one per kind of file a host sends that handoff reads field by field
  (`StatusFile` for status.json, `JobFile` for job.json; the key record is
  handoff.host.keyrecord's `KeyRecord`, the probe handoff.host.facts' `Facts`, a listing
  entry handoff.ops.fetch's `Entry`): each field with its reader, so a field added is
  checked by construction;
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

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

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

@dataclass(frozen=True)
class Limits:
    """What one JSON document from a host may hold. The defaults are far above any answer
    handoff's own remote code gives (a `list` of a few hundred jobs is tens of KB, nests 5
    deep) and far below what would cost the workstation: the bytes are capped before
    parsing, and the parsed values (each a Python object of ~50-100 bytes) are counted."""

    max_bytes: int = MAX_ANSWER_BYTES
    max_depth: int = 32  # arrays and objects inside each other
    max_string: int = 1 << 20  # characters in one string (a key included)
    max_digits: int = 40  # digits of one number (an int of 40 digits is already > 2**128)
    max_values: int = 1 << 20  # strings, numbers, arrays, objects in all


ANSWER = Limits()
# A file the workstation fetched (status.json, job.json) or a key record: small by nature.
SMALL_FILE = Limits(max_bytes=1 << 20, max_string=64 << 10, max_values=64 << 10)


class _Refused(Exception):
    """Raised inside json's hooks: stops the parse at once (json lets it through)."""


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def loads(raw: str | bytes, what: str = "the host's answer", limits: Limits = ANSWER) -> Any:
    """JSON from a host, read within `limits` (else Untrusted, saying which limit): `NaN`,
    `Infinity` and numbers too large for a float read as None; a lone surrogate (`"\\ud800"`,
    which no UTF-8 output can write) reads as U+FFFD."""
    size = len(raw)  # characters or bytes: either bounds the bytes within 4x
    if size > limits.max_bytes:
        raise TooLarge(what, limits.max_bytes, size)
    text = raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else raw

    def number(digits: str) -> int:
        if len(digits) > limits.max_digits + 1:  # a sign
            raise _Refused(f"a number of {len(digits)} digits (at most {limits.max_digits})")
        return int(digits)

    def real(digits: str) -> float | None:
        if len(digits) > limits.max_digits + 8:  # sign, point, exponent
            raise _Refused(f"a number of {len(digits)} characters")
        return _finite(digits)

    try:
        value = json.loads(text, parse_constant=lambda _name: None, parse_float=real,
                           parse_int=number)
    except _Refused as exc:
        raise Untrusted(f"{what} holds {exc}; refused") from None
    except RecursionError:
        raise Untrusted(f"{what} is nested deeper than {limits.max_depth} levels; refused") from None
    except ValueError as exc:
        raise Untrusted(f"{what} is not JSON ({visible(str(exc), 120)})") from None
    return _bounded(value, what, limits, repair=bool(_SURROGATE_ESCAPE.search(text)))


def _bounded(value: Any, what: str, limits: Limits, repair: bool) -> Any:
    """`value` checked without recursion: depth, string lengths, values in all; with
    `repair` (the text held a surrogate escape), lone surrogates replaced."""
    seen = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > limits.max_values:
            raise Untrusted(f"{what} holds more than {limits.max_values} values; refused")
        if isinstance(item, str):
            if len(item) > limits.max_string:
                raise Untrusted(f"{what} holds a string of {len(item)} characters (at most "
                                f"{limits.max_string}); refused")
        elif isinstance(item, (dict, list)):
            if depth > limits.max_depth:
                raise Untrusted(f"{what} is nested deeper than {limits.max_depth} levels; refused")
            if isinstance(item, dict):
                for key, inner in item.items():
                    stack.append((key, depth + 1))
                    stack.append((inner, depth + 1))
            else:
                stack.extend((inner, depth + 1) for inner in item)
    return _repaired(value) if repair else value


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _whole(text: str) -> str:
    """`text` with every lone surrogate as U+FFFD (a valid pair was joined by json)."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def _repaired(value: Any) -> Any:
    if isinstance(value, str):
        return _whole(value)
    if isinstance(value, list):
        return [_repaired(v) for v in value]
    if isinstance(value, dict):
        return {_whole(k): _repaired(v) for k, v in value.items()}
    return value


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


# -- declared shapes ---------------------------------------------------------------------------
# Each file a host sends that handoff reads field by field is declared once, as a dataclass
# whose every field names its reader (`reads`): a field of the wrong type reads as None
# and is named in the problems, so the row says which field a host got wrong. Fields not
# declared (the extractor's own, newer payloads') are kept in `extra` when they are plain
# scalars. `as_dict` is what the status rows read.
Reader = Callable[[Any], Any]


def reads(read: Reader) -> dict[str, Reader]:
    """A shape's field's metadata: None unless the host sent it, read by `read` (which
    answers None for a value that is not valid)."""
    return {"read": read}


def _non_negative(value: Any) -> float | None:
    return number(value, minimum=0)


def _time(value: Any) -> Any:
    """`started`/`updated`: ISO 8601 text (the generator) or unix seconds (the extractor)."""
    return text(value, 64) if isinstance(value, str) else _non_negative(value)


BATCH_COUNTS = ("batches", "live", "unsent", "requests", "live_requests", "completed", "failed")


def batch_counts(value: Any) -> dict[str, Any] | None:
    """status.json's `batches` (generate --mode batch) or a job's batch ledger as counted on
    the host: whole counts, and `by_state` (provider states -> batches) as names and counts;
    None unless every field present is of its kind."""
    if not isinstance(value, dict):
        return None
    out: dict[str, Any] = {}
    for key in BATCH_COUNTS:
        if key in value:
            n = count(value[key])
            if n is None:
                return None
            out[key] = n
    if "by_state" in value:
        states = counts_by_name(value["by_state"])
        if states is None:
            return None
        out["by_state"] = states
    return out


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


_SHARD = re.compile(r"([0-9]{1,6}(?:,[0-9]{1,6}){0,63})/([0-9]{1,6})")


def shard_spec(value: Any) -> tuple[int, int] | None:
    """`"i/n"` (or `"i,k/n"`: a host that took shard k over) as (i, n) when it is a shard
    handoff could have launched (each 0 <= i < n <= MAX_SHARD_HOSTS), else None: a count
    from a host never sizes anything by itself."""
    m = _SHARD.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        return None
    found, n = [int(i) for i in m.group(1).split(",")], int(m.group(2))
    ok = n <= MAX_SHARD_HOSTS and all(0 <= i < n for i in found) and len(set(found)) == len(found)
    return (found[0], n) if ok else None


def _shard_text(value: Any) -> str | None:
    return value if shard_spec(value) is not None else None


def _host_count(value: Any) -> int | None:
    n = count(value)
    return n if n is not None and 1 <= n <= MAX_SHARD_HOSTS else None


def _host_names(value: Any) -> list[str] | None:
    """job.json's `shard_hosts`: the hosts' labels in shard order, each cut and shown visibly
    (they are only printed, never used to pick a host)."""
    if not isinstance(value, list) or len(value) > MAX_SHARD_HOSTS:
        return None
    names = [text(v, 200) for v in value]
    return None if any(n is None for n in names) else [visible(n) for n in names if n is not None]


@dataclass(frozen=True)
class Shape:
    """A declared file from a host: its declared fields, and `extra` (the undeclared plain
    scalars, kept for `--json`)."""

    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        found = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name != "extra" and getattr(self, f.name) is not None}
        return {**self.extra, **found}


@dataclass(frozen=True)
class StatusFile(Shape):
    """A job's status.json as the payload writes it (docs/records.md)."""

    state: str | None = field(default=None, metadata=reads(lambda v: text(v, 64)))
    stop_reason: str | None = field(default=None, metadata=reads(lambda v: text(v, 200)))
    last_error: str | None = field(default=None, metadata=reads(text))
    done: int | None = field(default=None, metadata=reads(count))
    failed: int | None = field(default=None, metadata=reads(count))
    total: int | None = field(default=None, metadata=reads(count))
    bad_lines: int | None = field(default=None, metadata=reads(count))
    duplicates: int | None = field(default=None, metadata=reads(count))
    max_failed: int | None = field(default=None, metadata=reads(count))
    exit_code: int | None = field(default=None, metadata=reads(integer))
    in_flight: float | None = field(default=None, metadata=reads(_non_negative))
    window: float | None = field(default=None, metadata=reads(_non_negative))
    cost: float | None = field(default=None, metadata=reads(_non_negative))
    max_cost: float | None = field(default=None, metadata=reads(_non_negative))
    tokens_per_s: float | None = field(default=None, metadata=reads(_non_negative))
    rate_rps: float | None = field(default=None, metadata=reads(_non_negative))
    outage_s: float | None = field(default=None, metadata=reads(_non_negative))
    started: Any = field(default=None, metadata=reads(_time))
    updated: Any = field(default=None, metadata=reads(_time))
    budget_enforced: bool | None = field(default=None, metadata=reads(flag))
    bad_line_samples: list[dict[str, Any]] | None = field(default=None, metadata=reads(_samples))
    by_provider: dict[str, int] | None = field(default=None, metadata=reads(counts_by_name))
    by_finish_reason: dict[str, int] | None = field(default=None, metadata=reads(counts_by_name))
    cut: int | None = field(default=None, metadata=reads(count))
    timeouts: int | None = field(default=None, metadata=reads(count))
    # requests a stop closed before their answer, and the reserves the budget kept for them
    cancelled: int | None = field(default=None, metadata=reads(count))
    cancelled_cost: float | None = field(default=None, metadata=reads(_non_negative))
    think_split: int | None = field(default=None, metadata=reads(count))
    # the error mix (generator) and what an extractor reports: fab status shows them
    errors_by_kind: dict[str, int] | None = field(default=None, metadata=reads(counts_by_name))
    retries: int | None = field(default=None, metadata=reads(count))
    tokens_written: int | None = field(default=None, metadata=reads(count))
    bytes_written: int | None = field(default=None, metadata=reads(count))
    estimate_bytes: int | None = field(default=None, metadata=reads(count))
    retokenized_mismatch: int | None = field(default=None, metadata=reads(count))
    skipped_mismatch: int | None = field(default=None, metadata=reads(count))
    batches: dict[str, Any] | None = field(default=None, metadata=reads(batch_counts))


@dataclass(frozen=True)
class JobFile(Shape):
    """A job's job.json as launch wrote it on the host. Its shard layout (`shard`, `hosts`,
    `shard_hosts`) is a hint: the layout is the workstation's record
    (handoff.config.shards); a count the host gives is bounded by MAX_SHARD_HOSTS."""

    job: str | None = field(default=None, metadata=reads(lambda v: text(v, MAX_NAME_CHARS)))
    role: str | None = field(default=None, metadata=reads(lambda v: text(v, MAX_NAME_CHARS)))
    kind: str | None = field(default=None, metadata=reads(lambda v: text(v, MAX_NAME_CHARS)))
    host: str | None = field(default=None, metadata=reads(lambda v: text(v, 200)))
    shard: str | None = field(default=None, metadata=reads(_shard_text))
    hosts: int | None = field(default=None, metadata=reads(_host_count))
    shard_hosts: list[str] | None = field(default=None, metadata=reads(_host_names))
    prompts: int | None = field(default=None, metadata=reads(count))
    input: str | None = field(default=None, metadata=reads(text))
    input_sha256: str | None = field(default=None, metadata=reads(lambda v: text(v, 64)))
    max_cost: float | None = field(default=None, metadata=reads(_non_negative))
    started: float | None = field(default=None, metadata=reads(_non_negative))


@dataclass(frozen=True)
class CancelAnswer(Shape):
    """The last line of a role's `cancel` command (`payload batches --cancel --json`)."""

    cancelled: int | None = field(default=None, metadata=reads(count))
    live: int | None = field(default=None, metadata=reads(count))


S = TypeVar("S", bound=Shape)


def read_shape(kind: type[S], raw: Any, what: str) -> tuple[S | None, list[str]]:
    """(`raw` as a `kind`, each declared field read by its reader; the problems): a declared
    field of the wrong type is left out and named; others kept when plain scalars."""
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        return None, [f"{what} is not a JSON object ({type(raw).__name__})"]
    readers = {f.name: f.metadata["read"] for f in dataclasses.fields(kind) if "read" in f.metadata}
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    problems = []
    for name, value in raw.items():
        if not isinstance(name, str) or value is None:
            continue
        read = readers.get(name)
        if read is None:
            kept = scalar(value)
            if kept is not None:
                extra[name] = kept
            continue
        checked = read(value)
        if checked is None:
            problems.append(f"{what}: {name} {visible(repr(value), 40)} is not valid")
        else:
            values[name] = checked
    return kind(extra=extra, **values), problems


def status(raw: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """A job's status.json as a host returned it, field by field (`StatusFile`)."""
    shape, problems = read_shape(StatusFile, raw, "status.json")
    return (shape.as_dict() if shape is not None else None), problems


def meta(raw: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """A job's job.json as a host returned it, field by field (`JobFile`)."""
    shape, problems = read_shape(JobFile, raw, "job.json")
    return (shape.as_dict() if shape is not None else None), problems


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
