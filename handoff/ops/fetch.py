"""`fab fetch`: every job's folder (or the `--job` one) from each host to
`DEST/<host>/<job>/`, skipping what is already complete locally and resuming what is partly
there; then each job's shards merged into `DEST/<job>/output.jsonl` and
`output.errors.jsonl` (handoff.ops.merge: every id exactly once, checked); a job with no
answers file on any host (the extractor: its features) is not merged.

One round trip lists the jobs' files (handoff.host.remote_code.fetch_list) together with,
for each file the workstation holds a prefix of (N bytes: an append-only file's copy, or
what a cut download left), the sha256 of the *probe* of the host file's first N bytes:
the whole N bytes up to 2 MiB, else their first and last MiB, so the check costs 2 MiB
on each side whatever N (the workstation hashes its own probes meanwhile). Then, per file:
- same size and (append-only file) same probe, or (other file) same mtime: skip;
- an append-only file (`*.jsonl`, `log`) whose local copy's probe matches: download only
  the rest, appended;
- a cut download whose part's probe matches: download only the rest into the part;
- anything else: download whole (a prefix whose probe did not match is named: `Fetched.
  restarted`).
A resumed download proves its whole prefix while the rest moves (`Proof`: both sides hash
their N bytes beside the transfer, the host on a second channel) and is renamed into place
only if the two match; if not, the file is downloaded again whole and named. The one
prefix that needs no such proof is one this workstation downloaded itself from the same
host file (the listing's `file_id`: device and inode there) and left untouched since
(size, mtime and inode as the download left them: merge_index.untouched, for the files the
merge reads): there the probe, which sees a host file cut and rewritten or replaced, is
the check, and a resume costs the rest's transfer alone. A download is
written under a partial name and renamed into place when complete
(handoff.host.transfer.download), with a progress display for large files. Nothing is
written on the host.

The host is not trusted here either: what it claims (sizes, hashes) decides only how many
bytes are asked of it. A size bigger than the file ends the download early (an error,
the part kept), one smaller than the local prefix starts the file over, and a false hash
can only make the result differ from the host's own file, which the host could do by
serving other bytes anyway.

The listing is the host's word (handoff.untrusted): a job name that is not a plain folder
name, a file path that is absolute or climbs out with `..` (or holds a control
character), a path that would land outside `DEST/<host>/<job>/` or through a symlink on
the workstation, and every entry the host reports as no regular file (a symlink, a
device) are refused and named, as is a file bigger than the free space under DEST (with
the numbers); the rest is fetched, and the command exits non-zero.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handoff import console, threads
from handoff.config.layout import sftp_path
from handoff.errors import HandoffError, RemoteError
from handoff.host import remote_code, untrusted
from handoff.host.remote_code import fetch_list
from handoff.host.session import Session
from handoff.host.transfer import PrefixMismatch, download, partial
from handoff.ops import merge as merging
from handoff.ops import merge_index
from handoff.ops.jobs.state import job_name, unknown_job
from handoff.ops.local_copies import (
    Have,
    append_only,
    asked,
    local_copies,
    local_hashes,
)
from handoff.run.parallel import HostReport


@dataclass
class Fetched:
    fetched: int = 0
    skipped: int = 0
    resumed: int = 0
    nbytes: int = 0
    refused: list[str] = field(default_factory=list)  # entries not fetched, and why (visible)
    restarted: list[str] = field(default_factory=list)  # prefixes that did not match: fetched whole


@dataclass(frozen=True)
class Entry:
    """One file of a listing, checked: where it is on the host and where it goes here."""

    rel: str
    size: int
    mtime: float
    local: Path
    prefix_sha256: str | None = None
    file_id: str | None = None  # the host file's device and inode (its word: equality only)
    lines_end: int | None = None  # where its last whole line ends (a file copied by whole lines)


def checked_entries(listing: Any, local_dir: Path, job: str) -> tuple[list[Entry], list[str]]:
    """The files of a host's listing that may be fetched into `local_dir`, and the refused
    ones named with why (the listing is the host's word: handoff.untrusted)."""
    entries: list[Entry] = []
    refused: list[str] = []
    shown_job = untrusted.visible(job)
    files = listing.get("files") if isinstance(listing, dict) else None
    for entry in files if isinstance(files, list) else []:
        raw_rel = entry.get("rel") if isinstance(entry, dict) else None
        try:
            rel = untrusted.rel_path(raw_rel)
            local = untrusted.inside(local_dir, rel)
        except untrusted.Untrusted as exc:
            refused.append(f"{shown_job}: {exc}")
            continue
        size = untrusted.count(entry.get("size"))
        if size is None:
            refused.append(f"{shown_job}/{untrusted.visible(rel)}: no valid size in the listing")
            continue
        digest, file_id = entry.get("prefix_sha256"), entry.get("file_id")
        lines_end = untrusted.count(entry.get("lines_end"))
        entries.append(Entry(rel, size, untrusted.number(entry.get("mtime"), minimum=0) or 0.0,
                             local, digest if isinstance(digest, str) else None,
                             untrusted.file_id(file_id),
                             lines_end if rel in merge_index.INDEXED and lines_end is not None
                             and lines_end <= size else None))
    skipped = listing.get("skipped") if isinstance(listing, dict) else None
    for other in skipped if isinstance(skipped, list) else []:
        if isinstance(other, dict):
            refused.append(f"{shown_job}/{untrusted.visible(other.get('rel'), 200)}: a "
                           f"{untrusted.visible(other.get('kind'), 40)} on the host, not a "
                           f"regular file: not followed, not fetched")
    return entries, refused


def job_folder(listing: Any, configured: str) -> str:
    """Where the job's files are read on the host: the folder the workstation configured
    (as the host expanded it, when its listing says so), never another the listing names."""
    claimed = listing.get("job_dir") if isinstance(listing, dict) else None
    relative = sftp_path(configured)
    if isinstance(claimed, str) and not untrusted.has_control(claimed) and ".." not in claimed.split("/") \
            and (claimed == configured or claimed.endswith("/" + relative.lstrip("/"))):
        return claimed
    return relative


def free_bytes(path: Path) -> int:
    """Free bytes for an unprivileged writer on the filesystem that holds `path` (or its
    nearest existing parent)."""
    for folder in (path, *path.parents):
        if folder.exists():
            return shutil.disk_usage(folder).free
    return 0  # pragma: no cover (the root exists)


@dataclass(frozen=True)
class Start:
    """Where a download starts: `offset` bytes are already here (in the final copy itself
    when `in_place`, else in the partial file). `restart`: why a local prefix the host was
    asked about is not resumed from (None: there was none, or it is)."""

    offset: int
    in_place: bool = False
    restart: str | None = None


def plan_file(entry: Entry, local: Path, have: Have, local_hash: str | None) -> Start | None:
    """Where to start downloading one file: None to skip it (complete here)."""
    rel, size, mtime = entry.rel, entry.size, entry.mtime
    which = have.prefix(rel)
    proven = which is not None and local_hash is not None and entry.prefix_sha256 == local_hash
    if have.final is not None and have.final == entry.lines_end and proven:
        return None  # every whole line is here: the last one is still being written there
    if have.final is not None and have.final == size and (
        size == 0
        or (append_only(rel) and proven)
        or (not append_only(rel) and abs(local.stat().st_mtime - mtime) < 1e-3)
    ):
        return None
    if which is None:
        return Start(0)
    kind, prefix = which
    if prefix > size:
        why = f"the host's file ({size} bytes) is shorter than the {prefix} bytes here"
    elif not proven:
        why = f"the host's first {prefix} bytes differ from the {prefix} here (probe sha256)"
    else:
        return Start(prefix, in_place=kind == "final")
    return Start(0, restart=why)


class Proof:
    """The whole prefix of each resumed file, hashed on both sides while the rest moves:
    the host's sha256 of its first N bytes (fetch_list's `hash` mode, on a channel of its
    own beside the SFTP one) against the workstation's of its N bytes. A download is
    renamed into place only once they match (`holds`)."""

    def __init__(self, s: Session, resumed: dict[str, tuple[str, Path, int]]) -> None:
        """`resumed`: relative path -> (its path on the host, its local prefix file, N)."""
        self.label = s.label
        asked = {remote: n for remote, _, n in resumed.values()}
        self.paths = {rel: remote for rel, (remote, _, _) in resumed.items()}
        self.host = threads.soon(lambda: s.run_code(remote_code.FETCH_LIST, {"hash": asked},
                                                    "hashing the resumed files' prefixes"),
                                 "hash-host")
        self.local = threads.soon(lambda: {rel: fetch_list.prefix_sha256(str(path), n)
                                           for rel, (_, path, n) in resumed.items()}, "hash-local")

    def holds(self, rel: str) -> bool:
        """Do the host's first N bytes of `rel` hash as the local ones? A malformed answer
        is no proof."""
        answer = self.host.result()
        digests = answer.get("sha256") if isinstance(answer, dict) else None
        theirs = digests.get(self.paths[rel]) if isinstance(digests, dict) else None
        try:
            ours = self.local.result().get(rel)
        except OSError:
            return False
        return isinstance(theirs, str) and ours is not None and theirs == ours


def fetch_job(s: Session, job: str, local_dir: Path) -> Fetched:
    """Bring one host's job folder to `local_dir`."""
    have = local_copies(local_dir)
    # The workstation hashes its prefixes while the host hashes its own (the listing).
    hashing = threads.soon(lambda: local_hashes(local_dir, have), "hash-local")
    listing = s.run_code(remote_code.FETCH_LIST, {"job_dir": s.target.layout.job(job),
                                                  "local": asked(have)},
                         "listing the job's files")
    hashes = hashing.result()
    if not isinstance(listing, dict):
        raise RemoteError(f"{s.label}: listing the job's files: the answer is not a JSON object")
    if listing.get("exists") is not True:
        raise unknown_job(s, job)  # lists the jobs the host has (a typo is the usual cause)
    return fetch_listed(s, listing, local_dir, have, hashes, job)


def fetch_all(s: Session, host_dir: Path) -> tuple[dict[str, Fetched], list[str]]:
    """Bring every job folder of one host to `host_dir/<job>/` (one listing round trip);
    also the job folders refused (a name that is not a plain folder name, a symlink)."""
    have = ({p.name: local_copies(p) for p in host_dir.iterdir() if p.is_dir() and not p.is_symlink()}
            if host_dir.is_dir() else {})
    hashing = threads.soon(lambda: {job: local_hashes(host_dir / job, h) for job, h in have.items()},
                           "hash-local")
    listing = s.run_code(remote_code.FETCH_LIST, {"jobs_dir": s.target.layout.jobs,
                                                  "local": {job: asked(h) for job, h in have.items()}},
                         "listing the jobs' files")
    hashes = hashing.result()
    jobs = listing.get("jobs") if isinstance(listing, dict) else None
    jobs = jobs if isinstance(jobs, dict) else {}
    refused = [f"job folder {untrusted.visible(name, 200)}: a symlink on the host: not followed"
               for name in (listing.get("skipped") or [] if isinstance(listing, dict) else [])]
    fetched: dict[str, Fetched] = {}
    for job, one in jobs.items():
        try:
            untrusted.job_name(job)
            local = untrusted.inside(host_dir, job)
        except untrusted.Untrusted as exc:
            refused.append(f"{exc}: not fetched")
            continue
        fetched[job] = fetch_listed(s, one, local, have.get(job, {}), hashes.get(job, {}), job)
    if not fetched and not refused:
        raise RemoteError(f"{s.label}: no job under {s.target.layout.jobs} (launched?)")
    return fetched, refused


def fetch_listed(s: Session, listing: Any, local_dir: Path, have: dict[str, Have],
                 hashes: dict[str, str], job: str) -> Fetched:
    """Download what a listing shows is missing or incomplete in `local_dir`; what the
    listing names that may not be fetched is refused, named in `Fetched.refused`."""
    entries, refused = checked_entries(listing, local_dir, job)
    done = Fetched(refused=refused)
    remote_dir = job_folder(listing, s.target.layout.job(job))
    plans = [(entry, plan_file(entry, entry.local, have.get(entry.rel, Have()), hashes.get(entry.rel)))
             for entry in entries]
    resumed: dict[str, tuple[str, Path, int]] = {}  # the prefixes to prove whole (Proof)
    for entry, start in plans:
        if start is None or start.offset == 0:
            continue
        written = entry.local if start.in_place else partial(entry.local)
        # A prefix downloaded here from this very host file, and untouched since, needs no
        # whole-prefix hash: its probe (first and last MiB) matched the host's.
        if not merge_index.untouched(entry.local, written, entry.file_id, start.offset):
            resumed[entry.rel] = (f"{remote_dir}/{entry.rel}", written, start.offset)
    proof = Proof(s, resumed) if resumed else None
    for entry, start in plans:
        rel, size, local = entry.rel, entry.size, entry.local
        if start is None:
            done.skipped += 1
            continue
        shown = f"{untrusted.visible(job)}/{untrusted.visible(rel)}"
        if start.restart:
            done.restarted.append(f"{shown}: {start.restart}: fetched whole")
        need, free = size - start.offset, free_bytes(local.parent)
        if need > free:
            done.refused.append(f"{shown}: {untrusted.mb(need)} to download, but only "
                                f"{untrusted.mb(free)} free under {local.parent}: not fetched "
                                f"(free some space, or fetch to another --dest)")
            continue
        done.resumed += start.offset > 0
        remote = f"{remote_dir}/{rel}"
        verify = functools.partial(proof.holds, rel) if proof and rel in resumed else None
        try:
            try:
                _download(s, remote, entry, start, shown, verify)
            except PrefixMismatch:
                # The probe matched but the middle did not (a local copy altered, a host file
                # rewritten with the same ends): what came is discarded, the file comes whole.
                done.resumed -= 1
                done.restarted.append(f"{shown}: the first {start.offset} bytes here are not the "
                                      f"host's (whole-prefix sha256, checked after the rest "
                                      f"moved): fetched whole")
                done.nbytes += size - start.offset
                start = Start(0)
                _download(s, remote, entry, start, shown, None)
        except OSError as exc:
            raise RemoteError(f"{s.label}: fetching {shown} failed after {done.fetched} file(s): "
                              f"{exc}; run fetch again to resume") from None
        except HandoffError as exc:  # the connection dropped or stalled (the session says which)
            raise RemoteError(f"{exc} (fetching {shown}, after {done.fetched} file(s); run fetch "
                              f"again to resume)") from None
        done.fetched += 1
        done.nbytes += size - start.offset
    return done


def _download(s: Session, remote: str, entry: Entry, start: Start, shown: str,
              verify: Callable[[], bool] | None) -> None:
    """One file's download; a file the merge reads (merge_index.INDEXED, at the top of the
    job folder) is indexed as it lands, and the index kept when the download is cut (what
    a resume starts from) or dropped when its prefix proves not to be the host's."""
    growing = (merge_index.Growing(entry.local, start.offset, entry.file_id)
               if entry.rel in merge_index.INDEXED else None)
    if growing is not None and start.offset == 0:
        merge_index.drop(entry.local)  # what it indexed is being replaced
    try:
        download(s.files, remote, entry.local, start.offset, entry.size, entry.mtime,
                 in_place=start.in_place, label=s.label, name=shown, verify=verify,
                 on_written=growing, whole_lines=growing is not None)
    except PrefixMismatch:
        merge_index.drop(entry.local)
        raise
    except BaseException:
        if growing is not None:
            growing.save()
        raise
    if growing is not None:
        growing.save(landed=True)


@dataclass
class FetchedTo:
    """Where a host's jobs were fetched: the folder (one job: its own), each job's folder,
    and the entries of the host's listing refused (named, visibly)."""

    dir: str = ""
    jobs: dict[str, str] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)


def fetch(s: Session, report: HostReport, *, job_flag: str | None, dest: Path) -> None:
    """`fab fetch` on one host: `dest/<host>/<job>/` for the `--job` job or every job;
    the report's `FetchedTo` maps each job fetched to its local folder (for the merge)."""
    host_dir = dest / s.target.safe_label
    refused: list[str] = []
    if job_flag is not None:
        job = job_name(s.target, job_flag)
        results = {job: fetch_job(s, job, host_dir / job)}
    else:
        results, refused = fetch_all(s, host_dir)
    total = Fetched()
    for job, done in results.items():
        report.log(f"  [green]✓[/] {console.r(job)}: {done.fetched} file(s) fetched ({done.resumed} "
                   f"resumed, {done.nbytes / 1e6:.2f} MB), {done.skipped} already complete → "
                   f"{console.r(host_dir / job)}")
        for name in ("fetched", "skipped", "resumed", "nbytes"):
            setattr(total, name, getattr(total, name) + getattr(done, name))
        refused += done.refused
        for why in done.restarted:
            report.log(f"  [yellow]↻ not resumed[/] {console.r(why)}")
    for why in refused:
        report.log(f"  [red]✗ refused[/] {console.r(why)}")
    jobs = ", ".join(untrusted.visible(j) for j in results)
    report.summary = (f"{total.fetched} fetched, {total.skipped} complete ({jobs}) → {host_dir}"
                      + (f"; {len(refused)} REFUSED" if refused else ""))
    to = report.data_as(FetchedTo)
    to.dir = str(host_dir / next(iter(results))) if len(results) == 1 else str(host_dir)
    to.jobs = {job: str(host_dir / job) for job in results}
    to.refused = refused


def merge_jobs(reports: list[HostReport], dest: Path) -> list[merging.Merged]:
    """Each job fetched, its hosts' copies merged into `dest/<job>/` (handoff.ops.merge)."""
    copies: dict[str, list[merging.ShardCopy]] = {}
    for rep in reports:
        if rep.ok:
            for job, folder in rep.data_as(FetchedTo).jobs.items():
                copies.setdefault(job, []).append(merging.ShardCopy(rep.target.label, Path(folder)))
    # Job names were checked when fetched (untrusted.job_name); the merged folder must not
    # be reached through a symlink either. A job that wrote no answers file on any host
    # has nothing to merge (the extractor's features stay per host, each shard whole in
    # DEST/<host>/<job>/features/), and its status totals would count ids that no
    # output.jsonl holds.
    return [merging.merge(job, found, untrusted.inside(dest, job).parent)
            for job, found in sorted(copies.items())
            if any((c.folder / name).exists() for c in found
                   for name in (merging.OUTPUT, merging.ERRORS))]
