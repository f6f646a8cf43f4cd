"""What a run reports while it works: its counters, the job status file, failed samples.

Each rank rewrites its own `stats.<tag>.json`; with `--status-file` it also rewrites the
job status (the `generate` shape `fab status` reads) summed over every rank of this
launch. Both carry `format` and `final_state`, so a status reader can show what kind of
features the job writes.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class StopFlag:
    """Set by SIGTERM; checked between batches (a signal handler must not do the I/O).

    While the model loads (`loading`) there is nothing to drain, and a load can take
    minutes (a vLLM engine start, a 600 GB checkpoint) while torchrun kills its worker
    30 s after forwarding the SIGTERM: then the signal raises Stopped at once, the load is
    abandoned (its engine processes ended by the backend's close) and the run exits 3."""

    def __init__(self) -> None:
        self.set = False
        self.loading = False

    @contextlib.contextmanager
    def installed(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signal handlers live in the main thread only
            return

        def handler(_sig: int, _frame: Any) -> None:
            self.set = True
            if self.loading:
                from payload.errors import Stopped

                self.loading = False  # once: the cleanup that follows is not interrupted
                raise Stopped("stopped by SIGTERM while the model loaded; nothing was "
                              "written by this run: rerun the same command to resume")
            print("extract: SIGTERM: finishing the current batch, then stopping (resumable)",
                  file=sys.stderr, flush=True)

        old = signal.signal(signal.SIGTERM, handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, old)


@dataclass
class Stats:
    state: str = "starting"
    run_id: str = ""
    shard: str = "0/1"
    rank: int = 0
    world: int = 1
    format: str = "native"
    final_state: str = "postnorm"
    lines: int = 0
    bad_lines: int = 0
    duplicates: int = 0
    owned: int = 0
    already_done: int = 0
    written: int = 0
    failed_boundary: int = 0
    failed_nonfinite: int = 0
    truncated: int = 0
    skipped_overlong: int = 0
    dropped_unsupervised: int = 0
    tokens_written: int = 0
    supervised_written: int = 0
    bytes_written: int = 0
    estimate_bytes: int = 0
    temp_files_removed: int = 0
    reasoning_mode: str = ""
    # the completion form used (rendering.CompletionForm.describe()) and --turns
    rendering: dict[str, Any] = field(default_factory=dict)
    turns: str = "last"
    # supervised tokens from the record's sampled ids / re-tokenized from its text
    supervised_from_token_ids: int = 0
    supervised_retokenized: int = 0
    # re-tokenized turns whose count differs from usage.completion_tokens (listed in
    # mismatches.<tag>.jsonl); skipped_mismatch: samples left out by --on-mismatch skip
    retokenized_mismatch: int = 0
    skipped_mismatch: int = 0
    device: str = ""
    started: float = 0.0
    updated: float = 0.0
    tokenize_s: float = 0.0
    load_s: float = 0.0
    extract_s: float = 0.0
    extract_cpu_s: float = 0.0  # process CPU time of the extract phase (all threads)
    # the model's teardown after the last write (vllm: the engine's shutdown, seconds of
    # process joins whatever the run's size), apart from extract_s as load_s is
    close_s: float = 0.0
    samples_per_s: float = 0.0
    tokens_per_s: float = 0.0
    last_error: str = ""

    @property
    def failed(self) -> int:
        return self.failed_boundary + self.failed_nonfinite

    def summary(self, tag: str) -> dict[str, Any]:
        """The run's last line (JSON on stderr)."""
        return {"extract": tag, "format": self.format, "written": self.written,
                "already_done": self.already_done, "failed": self.failed,
                "skipped_overlong": self.skipped_overlong, "truncated": self.truncated,
                "dropped_unsupervised": self.dropped_unsupervised,
                "retokenized_mismatch": self.retokenized_mismatch,
                "skipped_mismatch": self.skipped_mismatch,
                "bad_lines": self.bad_lines, "tokens_per_s": round(self.tokens_per_s),
                "bytes_written": self.bytes_written}


_STATE_ORDER = ("aborted", "stopped", "running", "finished")
_AS_JOB_STATE = {"refused": "aborted", "starting": "running",
                 "finished_with_failures": "finished"}


def job_status(out_dir: Path, run_id: str, world: int) -> dict[str, Any]:
    """The job's status file (the `generate` shape), summed over this launch's ranks.

    Each rank rewrites it from every rank's stats file of the same run id (atomic rename,
    so any reader sees one whole snapshot); no rank waits for another.
    """
    ranks = []
    for p in out_dir.glob("stats.*.json"):
        try:
            s = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # being replaced right now; the next snapshot has it
        if s.get("run_id") == run_id:
            ranks.append(s)
    states = {_AS_JOB_STATE.get(s["state"], s["state"]) for s in ranks}
    if len(ranks) < world:
        states.add("running")  # a rank that has not written yet is still starting
    state = next((st for st in _STATE_ORDER if st in states), "running")

    def total(key: str) -> Any:
        return sum(s.get(key, 0) for s in ranks)

    first = ranks[0] if ranks else {}
    return {
        "state": state, "done": total("written") + total("already_done"),
        "failed": total("failed_boundary") + total("failed_nonfinite"),
        "total": total("owned") - total("skipped_overlong") - total("dropped_unsupervised")
        - total("skipped_mismatch"),
        "in_flight": 0, "skipped_overlong": total("skipped_overlong"),
        "dropped_unsupervised": total("dropped_unsupervised"), "truncated": total("truncated"),
        "retokenized_mismatch": total("retokenized_mismatch"),
        "skipped_mismatch": total("skipped_mismatch"),
        "bad_lines": max((s.get("bad_lines", 0) for s in ranks), default=0),
        "tokens_written": total("tokens_written"), "bytes_written": total("bytes_written"),
        "supervised_written": total("supervised_written"),
        "estimate_bytes": total("estimate_bytes"), "tokens_per_s": total("tokens_per_s"),
        "rate_rps": total("samples_per_s"), "cost": 0.0, "ranks": len(ranks), "world": world,
        "format": first.get("format", "native"),
        "final_state": first.get("final_state", "postnorm"),
        "started": min((s["started"] for s in ranks), default=time.time()),
        "updated": max((s["updated"] for s in ranks), default=time.time()),
        "last_error": next((s["last_error"] for s in ranks if s.get("last_error")), None),
    }


class ErrorLog:
    """This run's failed samples: printed, and one JSON line each in errors.<tag>.jsonl."""

    def __init__(self, path: Path, record: bool = True) -> None:
        self.path = path
        self.record = record
        self._lock = threading.Lock()
        self.last = ""
        if record:
            path.unlink(missing_ok=True)  # this run's failures only (a rerun retries them)

    def add(self, rid: Any, line_no: int | None, kind: str, message: str) -> None:
        print(f"extract: {kind}: {message}", file=sys.stderr, flush=True)
        self.last = f"{kind}: id {rid}"
        if not self.record:
            return
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"id": rid, "line": line_no, "error": kind,
                                 "message": message}, ensure_ascii=False) + "\n")


class MismatchLog:
    """Every re-tokenized turn whose supervised count differs from the server's
    `usage.completion_tokens`: one JSON line each in mismatches.<tag>.jsonl (this run's);
    the first few are printed, the rest only listed (10% of a million samples would
    drown the log)."""

    PRINTED = 5

    def __init__(self, path: Path, record: bool = True) -> None:
        self.path = path
        self.record = record
        self.count = 0
        if record:
            path.unlink(missing_ok=True)

    def add(self, rid: Any, line_no: int, turn: int, supervised: int, completion: int,
            action: str) -> None:
        self.count += 1
        if self.count <= self.PRINTED:
            more = " (all are listed in " + self.path.name + ")" if self.count == self.PRINTED else ""
            print(f"extract: retokenized_mismatch: id {rid} (line {line_no}) turn {turn}: "
                  f"{supervised} supervised tokens, the server counted {completion}; "
                  f"{action}{more}", file=sys.stderr, flush=True)
        if not self.record:
            return
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"id": rid, "line": line_no, "turn": turn,
                                 "supervised": supervised, "completion_tokens": completion,
                                 "action": action}, ensure_ascii=False) + "\n")
