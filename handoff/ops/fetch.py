"""`fab fetch`: every job's folder (or the `--job` one) from each host to
`DEST/<host>/<job>/`, skipping what is already complete locally and resuming what is partly
there; then each job's shards merged into `DEST/<job>/output.jsonl` and
`output.errors.jsonl` (handoff.ops.merge: every id exactly once, checked).

One round trip lists the jobs' files (handoff.host.remote_code.fetch_list) together with the
sha256 of the host file's first N bytes for each file the workstation holds a prefix of
(N bytes: an append-only file's copy, or what a cut download left); the workstation
hashes its own prefixes meanwhile. Then, per file:
- same size and (append-only file) same prefix hash, or (other file) same mtime: skip;
- an append-only file (`*.jsonl`, `log`) whose local copy is a true prefix: download
  only the rest, appended;
- a cut download whose part is a true prefix: download only the rest into the part;
- anything else: download whole.
A download is written under a partial name and renamed into place when complete
(handoff.host.transfer.download), with a progress display for large files. Nothing is
written on the host.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handoff import console
from handoff.errors import HandoffError, RemoteError
from handoff.host import remote_code
from handoff.host.session import Session
from handoff.host.transfer import completes, download, is_partial, partial
from handoff.ops import merge as merging
from handoff.ops.jobs.state import job_name, unknown_job
from handoff.run.parallel import HostReport

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


@dataclass(frozen=True)
class Have:
    """What the workstation holds of one file: a complete copy, and/or what a cut
    download left (transfer.partial), by size."""

    final: int | None = None
    part: int | None = None

    def prefix(self, rel: str) -> tuple[str, int] | None:
        """Which local bytes the host is asked to prove are a prefix of its file: an
        append-only file's copy (it may have grown), else a cut download's part."""
        if self.final and append_only(rel):
            return "final", self.final
        if self.part:
            return "part", self.part
        return None


def local_copies(folder: Path) -> dict[str, Have]:
    """What the workstation already holds of a job: relative path -> Have."""
    if not folder.is_dir():
        return {}
    final: dict[str, int] = {}
    part: dict[str, int] = {}
    for p in folder.rglob("*"):
        if not p.is_file():
            continue
        if not is_partial(p.name):
            final[p.relative_to(folder).as_posix()] = p.stat().st_size
        elif (of := completes(p)) is not None:
            part[of.relative_to(folder).as_posix()] = p.stat().st_size
    return {rel: Have(final.get(rel), part.get(rel)) for rel in final.keys() | part.keys()}


def asked(have: dict[str, Have]) -> dict[str, int]:
    """The prefixes the host is asked to hash: relative path -> length (see Have.prefix)."""
    return {rel: which[1] for rel, h in have.items() if (which := h.prefix(rel))}


def prefix_path(local: Path, which: str) -> Path:
    return local if which == "final" else partial(local)


def local_hashes(local_dir: Path, have: dict[str, Have]) -> dict[str, str]:
    """sha256 of each local prefix the host is asked about (see Have.prefix)."""
    out = {}
    for rel, h in have.items():
        which = h.prefix(rel)
        if which is not None:
            out[rel] = sha256_file(prefix_path(local_dir / rel, which[0]))
    return out


@dataclass
class Fetched:
    fetched: int = 0
    skipped: int = 0
    resumed: int = 0
    nbytes: int = 0


@dataclass(frozen=True)
class Start:
    """Where a download starts: `offset` bytes are already here (in the final copy itself
    when `in_place`, else in the partial file)."""

    offset: int
    in_place: bool = False


def plan_file(entry: dict[str, Any], local: Path, have: Have, local_hash: str | None) -> Start | None:
    """Where to start downloading one file: None to skip it (complete here)."""
    rel, size, mtime = entry["rel"], int(entry["size"]), float(entry["mtime"])
    which = have.prefix(rel)
    proven = which is not None and local_hash is not None and entry.get("prefix_sha256") == local_hash
    if have.final is not None and have.final == size and (
        size == 0
        or (append_only(rel) and proven)
        or (not append_only(rel) and abs(local.stat().st_mtime - mtime) < 1e-3)
    ):
        return None
    if proven and which is not None:
        kind, prefix = which
        if prefix <= size:
            return Start(prefix, in_place=kind == "final")
    return Start(0)


def fetch_job(s: Session, job: str, local_dir: Path) -> Fetched:
    """Bring one host's job folder to `local_dir`."""
    have = local_copies(local_dir)
    # The workstation hashes its prefixes while the host hashes its own (the listing).
    with ThreadPoolExecutor(max_workers=1) as pool:
        hashing = pool.submit(local_hashes, local_dir, have)
        listing = s.run_code(remote_code.FETCH_LIST, {"job_dir": s.target.layout.job(job),
                                                      "local": asked(have)},
                             "listing the job's files")
        hashes = hashing.result()
    if not listing["exists"]:
        raise unknown_job(s, job)  # lists the jobs the host has (a typo is the usual cause)
    return fetch_listed(s, listing, local_dir, have, hashes)


def fetch_all(s: Session, host_dir: Path) -> dict[str, Fetched]:
    """Bring every job folder of one host to `host_dir/<job>/` (one listing round trip)."""
    have = {p.name: local_copies(p) for p in host_dir.iterdir() if p.is_dir()} if host_dir.is_dir() else {}
    with ThreadPoolExecutor(max_workers=1) as pool:
        hashing = pool.submit(lambda: {job: local_hashes(host_dir / job, h) for job, h in have.items()})
        listing = s.run_code(remote_code.FETCH_LIST, {"jobs_dir": s.target.layout.jobs,
                                                      "local": {job: asked(h) for job, h in have.items()}},
                             "listing the jobs' files")
        hashes = hashing.result()
    if not listing["jobs"]:
        raise RemoteError(f"{s.label}: no job under {listing['jobs_dir']} (launched?)")
    return {job: fetch_listed(s, one, host_dir / job, have.get(job, {}), hashes.get(job, {}))
            for job, one in listing["jobs"].items()}


def fetch_listed(s: Session, listing: dict[str, Any], local_dir: Path, have: dict[str, Have],
                 hashes: dict[str, str]) -> Fetched:
    """Download what a listing shows is missing or incomplete in `local_dir`."""
    done = Fetched()
    for entry in listing["files"]:
        rel, size = entry["rel"], int(entry["size"])
        local = local_dir / rel
        start = plan_file(entry, local, have.get(rel, Have()), hashes.get(rel))
        if start is None:
            done.skipped += 1
            continue
        done.resumed += start.offset > 0
        shown = f"{local_dir.name}/{rel}"
        try:
            download(s.files, f"{listing['job_dir']}/{rel}", local, start.offset, size,
                     float(entry["mtime"]), in_place=start.in_place, label=s.label, name=shown)
        except OSError as exc:
            raise RemoteError(f"{s.label}: fetching {shown} failed after {done.fetched} file(s): "
                              f"{exc}; run fetch again to resume") from None
        except HandoffError as exc:  # the connection dropped or stalled (the session says which)
            raise RemoteError(f"{exc} (fetching {shown}, after {done.fetched} file(s); run fetch "
                              f"again to resume)") from None
        done.fetched += 1
        done.nbytes += size - start.offset
    return done


@dataclass
class FetchedTo:
    """Where a host's jobs were fetched: the folder (one job: its own), each job's folder."""

    dir: str = ""
    jobs: dict[str, str] = field(default_factory=dict)


def fetch(s: Session, report: HostReport, *, job_flag: str | None, dest: Path) -> None:
    """`fab fetch` on one host: `dest/<host>/<job>/` for the `--job` job or every job;
    the report's `FetchedTo` maps each job fetched to its local folder (for the merge)."""
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
    to = report.data_as(FetchedTo)
    to.dir = str(host_dir / next(iter(results))) if len(results) == 1 else str(host_dir)
    to.jobs = {job: str(host_dir / job) for job in results}


def merge_jobs(reports: list[HostReport], dest: Path) -> list[merging.Merged]:
    """Each job fetched, its hosts' copies merged into `dest/<job>/` (handoff.ops.merge)."""
    copies: dict[str, list[merging.ShardCopy]] = {}
    for rep in reports:
        if rep.ok:
            for job, folder in rep.data_as(FetchedTo).jobs.items():
                copies.setdefault(job, []).append(merging.ShardCopy(rep.target.label, Path(folder)))
    return [merging.merge(job, found, dest) for job, found in sorted(copies.items())]
