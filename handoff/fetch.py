"""`fab fetch`: a job's folder from each host to `DEST/<host>/<job>/`, skipping what is
already complete locally and resuming what is partly there.

One round trip lists the job's files (handoff.remote_code.fetch_list) together with the
sha256 of each remote file's first N bytes, N being the size of the local copy. Then:
- same size and (append-only file) same prefix hash, or (other file) same mtime: skip;
- an append-only file (`*.jsonl`, `log`) whose local copy is a true prefix: download
  only the rest, appended;
- anything else: download whole, through a temp file renamed into place.
Downloads go through the session's files (SFTP); nothing is written on the host.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handoff import console, remote_code
from handoff.errors import RemoteError
from handoff.jobs.state import job_name
from handoff.parallel import HostReport
from handoff.session import Session
from handoff.transfer import download, is_partial

APPEND_ONLY_SUFFIXES = (".jsonl",)
APPEND_ONLY_NAMES = ("log",)


def append_only(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.endswith(APPEND_ONLY_SUFFIXES) or name in APPEND_ONLY_NAMES


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def local_sizes(folder: Path) -> dict[str, int]:
    """What the workstation already holds of a job: relative path -> size."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*")
            if p.is_file() and not is_partial(p.name)}


@dataclass
class Fetched:
    fetched: int = 0
    skipped: int = 0
    resumed: int = 0
    nbytes: int = 0


def plan_file(entry: dict[str, Any], local: Path, have: int | None) -> int | None:
    """Where to start downloading one file: None to skip it, else the byte offset."""
    rel, size, mtime = entry["rel"], int(entry["size"]), float(entry["mtime"])
    if have is not None and have == size and (
        size == 0
        or (append_only(rel) and entry.get("prefix_sha256") == sha256_file(local))
        or (not append_only(rel) and abs(local.stat().st_mtime - mtime) < 1e-3)
    ):
        return None
    if append_only(rel) and have and have < size and entry.get("prefix_sha256") == sha256_file(local):
        return have
    return 0


def fetch_job(s: Session, job: str, local_dir: Path) -> Fetched:
    """Bring one host's job folder to `local_dir`."""
    have = local_sizes(local_dir)
    listing = s.run_code(remote_code.FETCH_LIST, {"job_dir": s.target.layout.job(job), "local": have},
                         "listing the job's files")
    if not listing["exists"]:
        raise RemoteError(f"{s.label}: no job {job!r} at {listing['job_dir']} (launched?)")
    done = Fetched()
    for entry in listing["files"]:
        rel, size = entry["rel"], int(entry["size"])
        local = local_dir / rel
        offset = plan_file(entry, local, have.get(rel))
        if offset is None:
            done.skipped += 1
            continue
        done.resumed += offset > 0
        download(s.files, f"{listing['job_dir']}/{rel}", local, offset, size, float(entry["mtime"]))
        done.fetched += 1
        done.nbytes += size - offset
    return done


def fetch(s: Session, report: HostReport, *, job_flag: str | None, dest: Path) -> None:
    """`fab fetch` on one host: `dest/<host>/<job>/`."""
    job = job_name(s.target, job_flag)
    local_dir = dest / s.target.safe_label / job
    done = fetch_job(s, job, local_dir)
    report.log(f"  [green]✓[/] {done.fetched} file(s) fetched ({done.resumed} resumed, "
               f"{done.nbytes / 1e6:.2f} MB), {done.skipped} already complete → {console.r(local_dir)}")
    report.summary = f"{done.fetched} fetched, {done.skipped} complete → {local_dir}"
    report.data["dir"] = str(local_dir)
