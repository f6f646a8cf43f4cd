"""The job's batch ledger (`batches.json`): every batch a run asked for, recorded before the
provider can act on it, so a killed run, a relaunch or `payload batches --cancel` finds the
same batches again and never submits the same requests twice.

One entry per batch, in the order they were made, each moving through:

    prepared   its ids written (`<dir>/bNNNNN.ids`), nothing sent yet
    uploaded   the provider holds its requests file (`file_id`)
    submitted  the provider holds the batch (`batch_id`); `status` is the provider's last word
    done       its output and error files are recorded (or it ended with nothing to record)

Each step is written (atomically, fsynced) BEFORE the call that makes the next one
observable is trusted, and a resumed run closes the gap a kill may have left: a `prepared`
entry looks for its file by name before uploading again (`filename`), an `uploaded` one
for its batch by input file id or metadata tag before submitting again. So the provider
may hold an orphan upload (it costs nothing), never a second batch of the same requests.

The ledger also holds a lock (`<dir>/lock`, flock) for as long as a run uses it: a second
run, or a cancel while a run is alive, is refused instead of racing it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from payload import atomic
from payload.errors import UsageError
from payload.records import sibling_path

STEPS = ("prepared", "uploaded", "submitted", "done")
VERSION = 1


def default_path(output: Path) -> Path:
    """`out.jsonl` → `out.batches.json` (a job launched by handoff: `<job>/batches.json`)."""
    return sibling_path(output, ".batches.json")


@dataclass
class Entry:
    """One batch of the job."""

    n: int  # its number in the job, from 0
    requests: int
    bytes: int
    step: str = "prepared"
    file_id: str | None = None
    batch_id: str | None = None
    status: str | None = None  # the provider's last status (validating ... cancelled)
    total: int = 0  # the provider's request_counts
    completed: int = 0
    failed: int = 0
    submitted_at: float | None = None  # epoch seconds
    ended_at: float | None = None
    cancel: bool = False  # a cancel was asked for
    recorded: int = 0  # answers and failures recorded from it
    released: int = 0  # its requests left unanswered (expired, cancelled, failed): asked again
    note: str | None = None  # why it failed, when it did

    @property
    def live(self) -> bool:
        """Not done: its requests are (or may be) at the provider and must not be asked again."""
        return self.step != "done"

    @classmethod
    def from_json(cls, raw: Any) -> Entry | None:
        if not isinstance(raw, dict):
            return None
        try:
            e = cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})
        except TypeError:
            return None
        if e.step not in STEPS or not isinstance(e.n, int) or not isinstance(e.requests, int):
            return None
        return e


@dataclass
class Ledger:
    path: Path
    tag: str  # this job's mark on its uploads' names and its batches' metadata
    base_url: str
    model: str
    entries: list[Entry] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    _lock_fd: int | None = None

    @property
    def folder(self) -> Path:
        """`batches.json` → `batches/`: the ids of each batch, temp request and result files."""
        name = self.path.name
        return self.path.with_name(name[:-5] if name.endswith(".json") else name + ".d")

    def ids_path(self, e: Entry) -> Path:
        return self.folder / f"b{e.n:05d}.ids"

    def requests_path(self, e: Entry) -> Path:
        # `.tmp` in the name: `fab fetch` never copies it; removed once the upload is known.
        return self.folder / f".b{e.n:05d}.requests.tmp"

    def result_path(self, e: Entry, which: str) -> Path:
        return self.folder / f".b{e.n:05d}.{which}.tmp"

    def filename(self, e: Entry) -> str:
        """The upload's name at the provider: finds it again after a lost answer."""
        return f"handoff-{self.tag}-{e.n:05d}.jsonl"

    def metadata(self, e: Entry) -> dict[str, str]:
        return {"handoff": f"{self.tag}-{e.n:05d}"}

    @property
    def live(self) -> list[Entry]:
        return [e for e in self.entries if e.live]

    def new(self, requests: int, size: int) -> Entry:
        e = Entry(n=len(self.entries), requests=requests, bytes=size)
        self.entries.append(e)
        return e

    # -- the file ----------------------------------------------------------------------------
    def save(self) -> None:
        data = {"version": VERSION, "tag": self.tag, "base_url": self.base_url,
                "model": self.model, "created": self.created,
                "batches": [asdict(e) for e in self.entries]}
        atomic.write_json(self.path, data, durable=True, indent=None)

    @classmethod
    def load(cls, path: Path) -> Ledger | None:
        """The ledger at `path`, None when there is none; UsageError when it is unreadable
        (the batches it names may be live: guessing would risk paying twice)."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UsageError(f"cannot read the batch ledger {path}: {exc.strerror}") from None
        try:
            raw = json.loads(text)
            entries = [Entry.from_json(e) for e in raw["batches"]]
            ledger = cls(path, str(raw["tag"]), str(raw.get("base_url") or ""),
                         str(raw.get("model") or ""), [e for e in entries if e is not None],
                         float(raw.get("created") or time.time()))
            if len(ledger.entries) != len(entries):
                raise ValueError("a bad entry")
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"the batch ledger {path} is not readable ({exc}); it names the "
                             "batches this job submitted: restore it, or move it away once "
                             "no batch of this job is live at the provider") from None
        return ledger

    @classmethod
    def open(cls, path: Path, base_url: str, model: str) -> Ledger:
        """The ledger at `path`, or a new one (not written until its first batch)."""
        found = cls.load(path)
        if found is None:
            return cls(path, secrets.token_hex(6), base_url, model)
        if found.base_url and found.base_url.rstrip("/") != base_url.rstrip("/"):
            raise UsageError(f"the batches in {path} were submitted to {found.base_url}, not "
                             f"{base_url}: rerun with --base-url {found.base_url} to collect "
                             "them (or cancel them there first)")
        return found

    # -- the lock ----------------------------------------------------------------------------
    def lock(self) -> None:
        """Hold the ledger for this process (released at exit): a second run on the same job
        is refused, not raced."""
        import fcntl

        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise UsageError(f"another process holds the batches of this job ({self.path}): "
                             "stop it first (fab stop), or wait for it to end") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None

    # -- ids ---------------------------------------------------------------------------------
    def write_ids(self, e: Entry, rows: list[tuple[str, int]]) -> None:
        """The batch's ids and where each prompt starts in the input (byte offset)."""
        text = "".join(json.dumps([key, offset], ensure_ascii=False) + "\n"
                       for key, offset in rows)
        atomic.write_text(self.ids_path(e), text, durable=True)

    def read_ids(self, e: Entry) -> list[tuple[str, int]]:
        out = []
        try:
            lines = self.ids_path(e).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise UsageError(f"the ids of batch {e.n} ({self.ids_path(e)}) are missing: the "
                             "ledger cannot say which prompts it holds") from None
        for line in lines:
            key, offset = json.loads(line)
            out.append((str(key), int(offset)))
        return out

    def iter_ids(self, e: Entry) -> Iterator[str]:
        for key, _ in self.read_ids(e):
            yield key

    def summary(self) -> dict[str, Any]:
        """For the status file: batches by provider status (or step), how many are at the
        provider (`live`: submitted, not collected) or not sent yet (`unsent`), and counts."""
        by_state: dict[str, int] = {}
        for e in self.entries:
            state = e.status or e.step
            if e.step == "done" and e.status is None:
                state = "abandoned"
            by_state[state] = by_state.get(state, 0) + 1
        at = [e for e in self.entries if e.step == "submitted"]
        return {"batches": len(self.entries), "live": len(at),
                "unsent": len(self.live) - len(at), "by_state": by_state,
                "requests": sum(e.requests for e in self.entries),
                "live_requests": sum(e.requests for e in at),
                "completed": sum(e.completed for e in self.entries),
                "failed": sum(e.failed for e in self.entries)}


__all__ = ["STEPS", "Entry", "Ledger", "default_path"]
