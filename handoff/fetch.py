"""`fab fetch`: every job's folder (or the `--job` one) from each host to
`DEST/<host>/<job>/`, skipping what is already complete locally and resuming what is partly
there; then each job's shards merged into `DEST/<job>/output.jsonl` and
`output.errors.jsonl` (handoff.merge: every id exactly once, checked).

One round trip lists the jobs' files (handoff.remote_code.fetch_list) together with the
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
from handoff import merge as merging
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
    return fetch_listed(s, listing, local_dir, have)


def fetch_all(s: Session, host_dir: Path) -> dict[str, Fetched]:
    """Bring every job folder of one host to `host_dir/<job>/` (one listing round trip)."""
    have = {p.name: local_sizes(p) for p in host_dir.iterdir() if p.is_dir()} if host_dir.is_dir() else {}
    listing = s.run_code(remote_code.FETCH_LIST, {"jobs_dir": s.target.layout.jobs, "local": have},
                         "listing the jobs' files")
    if not listing["jobs"]:
        raise RemoteError(f"{s.label}: no job under {listing['jobs_dir']} (launched?)")
    return {job: fetch_listed(s, one, host_dir / job, have.get(job, {}))
            for job, one in listing["jobs"].items()}


def fetch_listed(s: Session, listing: dict[str, Any], local_dir: Path, have: dict[str, int]) -> Fetched:
    """Download what a listing shows is missing or incomplete in `local_dir`."""
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
    """`fab fetch` on one host: `dest/<host>/<job>/` for the `--job` job or every job;
    `report.data["jobs"]` maps each job fetched to its local folder (for the merge)."""
    host_dir = dest / s.target.safe_label
    if job_flag is not None:
        job = job_name(s.target, job_flag)
        results = {job: fetch_job(s, job, host_dir / job)}
    else:
        results = fetch_all(s, host_dir)
    total = Fetched()
    for job, done in results.items():
        report.log(f"  [green]✓[/] {console.r(job)}: {done.fetched} file(s) fetched ({done.resumed} "
                   f"resumed, {done.nbytes / 1e6:.2f} MB), {done.skipped} already complete → "
                   f"{console.r(host_dir / job)}")
        for name in ("fetched", "skipped", "resumed", "nbytes"):
            setattr(total, name, getattr(total, name) + getattr(done, name))
    jobs = ", ".join(results)
    report.summary = f"{total.fetched} fetched, {total.skipped} complete ({jobs}) → {host_dir}"
    report.data["dir"] = str(host_dir / next(iter(results))) if len(results) == 1 else str(host_dir)
    report.data["jobs"] = {job: str(host_dir / job) for job in results}


def merge_jobs(reports: list[HostReport], dest: Path) -> list[merging.Merged]:
    """Each job fetched, its hosts' copies merged into `dest/<job>/` (handoff.merge)."""
    copies: dict[str, list[merging.ShardCopy]] = {}
    for rep in reports:
        if rep.ok:
            for job, folder in (rep.data.get("jobs") or {}).items():
                copies.setdefault(job, []).append(merging.ShardCopy(rep.target.label, Path(folder)))
    return [merging.merge(job, found, dest) for job, found in sorted(copies.items())]
