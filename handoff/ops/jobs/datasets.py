"""Datasets: the local input files of one launch, one job each, checked before any host.

`fab launch --input A.jsonl --input B.jsonl` (repeatable; a quoted glob such as
`'data/B*.jsonl'` is expanded here, sorted) launches one job per file, named after the
file's stem (`data/B3.jsonl` -> job `B3`; `--job NAME` only with one input). Each job is
bound to its input by the input's sha256 (recorded in the job's `job.json` on the host), so
a relaunch with other data under the same name is refused instead of "finishing" at once.

Every file is read once, here on the workstation, with the payload's own rules
(`payload.records`, the parser `generate` runs): valid records, bad lines (not UTF-8, not
JSON, no usable prompt, a bad id) with a capped sample of line numbers and reasons, and
repeated ids. A file with no valid record stops the launch (exit 2) before any host is
touched. The same pass measures what the estimate needs: the prompts' characters and,
where the records carry one, the old answer being regenerated (a trailing assistant turn).

Cost: one sha256 and one `json.loads` per line (~10-20 µs for a typical line; a 500 MB
corpus takes a few seconds).
"""

from __future__ import annotations

import glob
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handoff.errors import UsageError
from payload.generate.inputs import SAMPLE_BAD_LINES
from payload.generate.journal import IdSet, id_hash
from payload.records import BadRecord, decode_line, load_object, prompt_of, shard_of, to_messages

GLOB_CHARS = frozenset("*?[")
SHOWN_BAD_LINES = 3  # bad lines quoted in the launch output (the status file keeps 20)


@dataclass
class InputCheck:
    """One pass over an input file, by the payload's rules."""

    lines: int = 0  # non-blank lines
    valid: int = 0  # records that are prompts
    duplicates: int = 0  # valid records whose id came earlier in the file
    bad: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)  # {"line", "reason"}, capped
    prompt_chars: int = 0  # text of the prompts (distinct ids)
    answers: int = 0  # records carrying an old answer (a trailing assistant turn)
    answer_chars: int = 0
    # Distinct prompts each shard owns (payload.records.shard_of), when the launch shards
    # over several hosts: the workstation's own count of what each shard must hold
    # (handoff.config.shards), never a host's word.
    per_shard: list[int] = field(default_factory=list)
    # Generated answers the records carry (`response`, `reasoning`: the generator's output,
    # an extractor's input), for the extractor's estimate.
    responses: int = 0
    response_chars: int = 0

    @property
    def prompts(self) -> int:
        """Distinct prompts: what the job will ask."""
        return self.valid - self.duplicates

    def add_bad(self, line_no: int, reason: str) -> None:
        self.bad += 1
        if len(self.samples) < SAMPLE_BAD_LINES:
            self.samples.append({"line": line_no, "reason": reason[:200]})

    def bad_summary(self, shown: int = SHOWN_BAD_LINES) -> str:
        """`2 bad lines (line 3: not valid UTF-8 (...); line 9: not JSON (...))`."""
        if not self.bad:
            return "no bad line"
        quoted = "; ".join(f"line {s['line']}: {s['reason']}" for s in self.samples[:shown])
        more = ", ..." if self.bad > shown else ""
        return f"{self.bad} bad line{'s' if self.bad != 1 else ''} ({quoted}{more})"


def _text_len(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # parts: [{"type": "text", "text": ...}, ...]
        return sum(len(str(p.get("text", ""))) if isinstance(p, dict) else len(str(p))
                   for p in content)
    return len(str(content)) if content is not None else 0


def check_file(path: Path, shards: int = 1) -> tuple[InputCheck, str]:
    """Read `path` once: its InputCheck (with each of `shards` shards' prompts counted when
    there are several) and its sha256."""
    out = InputCheck(per_shard=[0] * shards if shards > 1 else [])
    digest = hashlib.sha256()
    seen = IdSet()
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            digest.update(raw)
            if not raw.strip():
                continue
            out.lines += 1
            text = decode_line(raw)
            try:
                if isinstance(text, BadRecord):
                    raise text
                record = load_object(text)
                prompt = prompt_of(record, line_no)
            except BadRecord as exc:
                out.add_bad(line_no, str(exc))
                continue
            out.valid += 1
            h = id_hash(prompt.key)
            if h in seen:
                out.duplicates += 1
                continue
            seen.add(h)
            if shards > 1:
                out.per_shard[shard_of(prompt.key, shards)] += 1
            out.prompt_chars += sum(_text_len(m.get("content")) for m in prompt.messages)
            turns = to_messages(record)
            if len(turns) > len(prompt.messages) and turns[-1].get("role") == "assistant":
                out.answers += 1
                out.answer_chars += _text_len(turns[-1].get("content"))
            if isinstance(record.get("response"), str):
                out.responses += 1
                out.response_chars += len(record["response"]) + _text_len(record.get("reasoning"))
    return out, digest.hexdigest()


@dataclass(frozen=True)
class Dataset:
    """One local input file of a launch: its job, identity (sha256) and check."""

    path: Path
    job: str
    sha256: str
    size: int
    check: InputCheck

    @property
    def name(self) -> str:
        return self.path.name


def expand(flags: list[str]) -> list[Path]:
    """`--input` values as files, in order: each a path, or a (quoted) glob expanded here,
    its matches sorted; a file named twice counts once. A path or glob matching no file is
    a usage error naming it."""
    found: list[Path] = []
    for flag in flags:
        given = Path(flag).expanduser()
        if given.is_file():
            matches = [given]
        elif GLOB_CHARS & set(flag):
            matches = [Path(m) for m in sorted(glob.glob(str(given))) if Path(m).is_file()]
            if not matches:
                raise UsageError(f"--input {flag!r} matches no file")
        elif given.is_dir():
            raise UsageError(f"--input {flag}: a folder, not a file; name the files, or quote "
                             f"a glob: --input '{str(given).rstrip('/')}/*.jsonl'")
        else:
            raise UsageError(f"--input {flag}: no such file")
        for path in matches:
            if path.resolve() not in {p.resolve() for p in found}:
                found.append(path)
    return found


def load(paths: list[Path], jobs: list[str], shards: int = 1) -> list[Dataset]:
    """Check each file (the payload's rules; its prompts per shard counted when the launch
    shards over several hosts) and pair it with its job name. A file with no
    valid record fails the whole launch before any host is touched; two files under one
    job name too (two `B3.jsonl` from different folders)."""
    by_job: dict[str, Path] = {}
    for path, job in zip(paths, jobs, strict=True):
        if job in by_job:
            raise UsageError(
                f"--input {by_job[job]} and {path} would both be job {job!r} (one job per "
                f"dataset, named after the file's stem); rename one of the files, or launch "
                f"them one at a time with --job NAME")
        by_job[job] = path
    out = []
    for path, job in zip(paths, jobs, strict=True):
        check, sha = check_file(path, shards)
        if check.valid == 0:
            what = "is empty" if check.lines == 0 else f"has no valid record: {check.bad_summary()}"
            raise UsageError(
                f"--input {path} {what}. Nothing was launched. Each line must be a JSON object "
                f"with 'messages', 'conversations' or 'prompt' (docs/records.md)")
        out.append(Dataset(path, job, sha, path.stat().st_size, check))
    return out
