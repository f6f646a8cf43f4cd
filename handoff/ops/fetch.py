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
device) are refused and named; so is a file that does not fit in the command's share of
the disk (`Room`: the free space under DEST when the command starts, less a margin of
max(5%, 1 GB), shared by every file of every host, so files offered one by one never fill
the disk between them), and one sparse beyond reason or longer than its host's filesystem
(`implausible`), each with the numbers; the rest is fetched, and the command exits
non-zero. A download that moves fewer than 32 KB/s over a minute (`_StallWatch`; a host
trickling bytes keeps every single wait short) is ended, its host named and cut off; the
other hosts are fetched and merged all the same.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from handoff import console, threads
from handoff.config import shards as shard_layouts
from handoff.config.layout import sftp_path
from handoff.errors import HandoffError, RemoteError
from handoff.host import remote_code, untrusted
from handoff.host.remote_code import fetch_list
from handoff.host.session import RemoteFiles, Session
from handoff.host.targets import folder_name
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
    allocated: int | None = None  # bytes the host says it holds on disk (its word)
    fs_bytes: int | None = None  # the size of the host's filesystem holding it (its word)
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
                             untrusted.file_id(file_id), untrusted.count(entry.get("allocated")),
                             lines_end=(lines_end if rel in merge_index.INDEXED and lines_end is not None
                                        and lines_end <= size else None)))
    fs_bytes = untrusted.count(listing.get("fs_bytes")) if isinstance(listing, dict) else None
    entries = [dataclasses.replace(e, fs_bytes=fs_bytes) for e in entries] if fs_bytes else entries
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


def _existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists (a --dest not made yet)."""
    return next(folder for folder in (path, *path.parents) if folder.exists())


# The disk `fab fetch` keeps free under --dest: max(5% of the filesystem, 1 GB), or
# HANDOFF_FETCH_KEEP_FREE bytes instead of the 1 GB floor (a test's small tmpfs).
KEEP_FREE_SHARE = 0.05
KEEP_FREE_FLOOR = 1 << 30
KEEP_FREE_ENV = "HANDOFF_FETCH_KEEP_FREE"


class Room:
    """The space one `fab fetch` may fill under DEST, for all its files, every host's
    together: the free space when the command starts, less a margin (`keep`, default
    max(5%, 1 GB) of the filesystem). Each file takes its bytes from what is left, or is
    refused: files offered one by one, each fitting the free space at its turn, can never
    fill the disk between them."""

    def __init__(self, dest: Path, keep: int | None = None) -> None:
        where = _existing(dest)
        usage = shutil.disk_usage(where)
        if keep is None:
            floor = os.environ.get(KEEP_FREE_ENV)
            keep = max(int(usage.total * KEEP_FREE_SHARE),
                       int(floor) if floor and floor.isdigit() else KEEP_FREE_FLOOR)
        self.dest = dest
        self.free = usage.free
        self.keep = keep
        self.left = max(0, usage.free - keep)
        self._lock = threading.Lock()

    def take(self, need: int) -> bool:
        """Reserve `need` bytes (True), or refuse them (False: nothing reserved)."""
        with self._lock:
            if need > self.left:
                return False
            self.left -= need
            return True

    def refusal(self, need: int) -> str:
        return (f"{untrusted.mb(need)} to download, but only {untrusted.mb(self.left)} of the "
                f"{untrusted.mb(self.free)} free under {self.dest} are left for this fetch (it "
                f"keeps {untrusted.mb(self.keep)} free): not fetched (free some space, or fetch "
                f"to another --dest)")


# A file with less than 1/SPARSE of its length allocated on the host is sparse beyond
# reason: no job writes that (a `truncate -s 1T` does), and fetching it would write its
# whole length here. Under SPARSE_FROM bytes the check is not worth a refusal.
SPARSE = 1000
SPARSE_FROM = 1 << 20


def implausible(entry: Entry) -> str | None:
    """Why the host's file is not one a job could have written: longer than the host's
    filesystem holding it, or sparse beyond reason (its listing's own figures; a host
    that lies about them still has to serve every byte, within the Room)."""
    if entry.fs_bytes is not None and entry.size > entry.fs_bytes:
        return (f"{untrusted.mb(entry.size)} long on a filesystem of {untrusted.mb(entry.fs_bytes)}: "
                f"no job wrote that (a sparse file); not fetched")
    if entry.allocated is not None and entry.size > SPARSE_FROM \
            and entry.allocated * SPARSE < entry.size:
        return (f"{untrusted.mb(entry.size)} long but only {untrusted.mb(entry.allocated)} of it "
                f"on the host's disk: sparse beyond reason, no job wrote that; not fetched")
    return None


# A download that moves fewer than MIN_RATE bytes per second over a window of STALL_S
# seconds has stalled (a host trickling bytes keeps every single wait short): it is ended,
# its host named, and the other hosts go on. HANDOFF_FETCH_MIN_RATE=BYTES/SECONDS sets both.
MIN_RATE = 32 << 10
STALL_S = 60.0
MIN_RATE_ENV = "HANDOFF_FETCH_MIN_RATE"


def stall_floor() -> tuple[float, float]:
    """(bytes per second, window in seconds) below which a download has stalled."""
    given = os.environ.get(MIN_RATE_ENV, "")
    rate, _, window = given.partition("/")
    try:
        return float(rate), float(window or STALL_S)
    except ValueError:
        return float(MIN_RATE), STALL_S


class Stalled(RemoteError):
    """A download moved less than the floor over a whole window: its host was cut off."""


class _StallWatch:
    """Counts the bytes a host's downloads move (`files`: its RemoteFiles, counted) and,
    on a thread, cuts the host's session when a window passes with fewer than the floor:
    the blocked read then fails, and the host's fetch ends with `Stalled`."""

    def __init__(self, s: Session, rate: float, window: float) -> None:
        self.session = s
        self.rate, self.window = rate, window
        self.moved = 0
        self.active = False  # a download is under way (a listing or a hash is not watched)
        self.stalled: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"stall-{s.label}", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        mark, since = self.moved, time.monotonic()
        while not self._stop.wait(min(1.0, self.window / 4)):
            now = time.monotonic()
            if not self.active:
                mark, since = self.moved, now
                continue
            if now - since < self.window:
                continue
            if self.moved - mark < self.rate * self.window:
                self.stalled = (f"{untrusted.mb(self.moved - mark)} in the last {self.window:g} s "
                                f"(the floor is {untrusted.mb(self.rate)}/s)")
                self.session.close()  # the blocked read fails at once
                return
            mark, since = self.moved, now

    def chunks(self, files: Any, path: str, offset: int, end: int) -> Iterator[bytes | memoryview]:
        self.active = True
        try:
            for chunk in files.read_chunks(path, offset, end):
                self.moved += len(chunk)
                yield chunk
        finally:
            self.active = False

    def close(self) -> None:
        self._stop.set()


class _Watched:
    """A host's RemoteFiles whose reads a `_StallWatch` counts (everything else as is)."""

    def __init__(self, files: Any, watch: _StallWatch) -> None:
        self._files, self._watch = files, watch

    def read_chunks(self, path: str, offset: int, end: int) -> Iterator[bytes | memoryview]:
        return self._watch.chunks(self._files, path, offset, end)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._files, name)


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


def fetch_job(s: Session, job: str, local_dir: Path, room: Room | None = None,
              watch: _StallWatch | None = None) -> Fetched:
    """Bring one host's job folder to `local_dir` (within `room`, the command's share of the
    disk; `watch` ends a download that stalls)."""
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
    return fetch_listed(s, listing, local_dir, have, hashes, job, room, watch)


def fetch_all(s: Session, host_dir: Path, room: Room | None = None,
              watch: _StallWatch | None = None) -> tuple[dict[str, Fetched], list[str]]:
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
        fetched[job] = fetch_listed(s, one, local, have.get(job, {}), hashes.get(job, {}), job,
                                    room, watch)
    if not fetched and not refused:
        raise RemoteError(f"{s.label}: no job under {s.target.layout.jobs} (launched?)")
    return fetched, refused


def fetch_listed(s: Session, listing: Any, local_dir: Path, have: dict[str, Have],
                 hashes: dict[str, str], job: str, room: Room | None = None,
                 watch: _StallWatch | None = None) -> Fetched:
    """Download what a listing shows is missing or incomplete in `local_dir`; what the
    listing names that may not be fetched (or that does not fit in `room`) is refused,
    named in `Fetched.refused`."""
    room = room or Room(local_dir)
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
        rel, size = entry.rel, entry.size
        if start is None:
            done.skipped += 1
            continue
        shown = f"{untrusted.visible(job)}/{untrusted.visible(rel)}"
        if start.restart:
            done.restarted.append(f"{shown}: {start.restart}: fetched whole")
        need = size - start.offset
        odd = implausible(entry)
        if odd:
            done.refused.append(f"{shown}: {odd}")
            continue
        if not room.take(need):
            done.refused.append(f"{shown}: {room.refusal(need)}")
            continue
        done.resumed += start.offset > 0
        remote = f"{remote_dir}/{rel}"
        verify = functools.partial(proof.holds, rel) if proof and rel in resumed else None
        try:
            try:
                _download(s, remote, entry, start, shown, verify, watch)
            except PrefixMismatch:
                # The probe matched but the middle did not (a local copy altered, a host file
                # rewritten with the same ends): what came is discarded, the file comes whole.
                done.resumed -= 1
                done.restarted.append(f"{shown}: the first {start.offset} bytes here are not the "
                                      f"host's (whole-prefix sha256, checked after the rest "
                                      f"moved): fetched whole")
                done.nbytes += size - start.offset
                start = Start(0)  # rewritten over its own bytes: no more room taken
                _download(s, remote, entry, start, shown, None, watch)
        except (OSError, HandoffError) as exc:
            if watch is not None and watch.stalled:
                raise Stalled(f"{s.label}: fetching {shown} stalled: {watch.stalled}; the host "
                              f"was cut off after {done.fetched} file(s), the other hosts go on. "
                              f"Run fetch again for it (a slow link: {MIN_RATE_ENV}=BYTES/SECONDS "
                              f"lowers the floor)") from None
            if isinstance(exc, HandoffError):  # the connection dropped (the session says why)
                raise RemoteError(f"{exc} (fetching {shown}, after {done.fetched} file(s); run "
                                  f"fetch again to resume)") from None
            raise RemoteError(f"{s.label}: fetching {shown} failed after {done.fetched} file(s): "
                              f"{exc}; run fetch again to resume") from None
        done.fetched += 1
        done.nbytes += size - start.offset
    return done


def _download(s: Session, remote: str, entry: Entry, start: Start, shown: str,
              verify: Callable[[], bool] | None, watch: _StallWatch | None = None) -> None:
    """One file's download; a file the merge reads (merge_index.INDEXED, at the top of the
    job folder) is indexed as it lands, and the index kept when the download is cut (what
    a resume starts from) or dropped when its prefix proves not to be the host's."""
    growing = (merge_index.Growing(entry.local, start.offset, entry.file_id)
               if entry.rel in merge_index.INDEXED else None)
    if growing is not None and start.offset == 0:
        merge_index.drop(entry.local)  # what it indexed is being replaced
    try:
        files = cast(RemoteFiles, _Watched(s.files, watch)) if watch is not None else s.files
        download(files, remote, entry.local, start.offset, entry.size, entry.mtime,
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


def fetch(s: Session, report: HostReport, *, job_flag: str | None, dest: Path,
          room: Room | None = None) -> None:
    """`fab fetch` on one host: `dest/<host>/<job>/` for the `--job` job or every job,
    within `room` (the command's share of the disk under `dest`, shared by every host);
    the report's `FetchedTo` maps each job fetched to its local folder (for the merge)."""
    host_dir = dest / s.target.safe_label
    refused: list[str] = []
    room = room or Room(dest)
    watch = _StallWatch(s, *stall_floor())
    try:
        if job_flag is not None:
            job = job_name(s.target, job_flag)
            results = {job: fetch_job(s, job, host_dir / job, room, watch)}
        else:
            results, refused = fetch_all(s, host_dir, room, watch)
    finally:
        watch.close()
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


def last_copies(job: str, dest: Path, fetched: set[str],
                failed: dict[str, str]) -> list[merging.ShardCopy]:
    """The copies of `job` under `dest` that this fetch did not bring: each host of the job
    (its layout's, else the hosts its last merge took) not fetched now (`failed`: why its
    fetch failed; else it was not asked) contributes its last fetched copy, so a merge
    never holds less than the copies here do."""
    layout = shard_layouts.load(job)
    hosts: list[str] = list(layout.order) if layout is not None else []
    if layout is None:
        try:
            before = json.loads((dest / job / merging.MANIFEST).read_text(encoding="utf-8"))
            named = before.get("output", {}).get("hosts") if isinstance(before, dict) else None
            hosts = [str(h) for h in named] if isinstance(named, list) else []
        except (OSError, ValueError, AttributeError):
            hosts = []
    out = []
    for host in hosts:
        if host in fetched:
            continue
        try:
            folder = untrusted.inside(dest, folder_name(host)) / job
        except untrusted.Untrusted:
            continue
        if folder.is_symlink() or not folder.is_dir() or not any(
                (folder / name).is_file() for name in (merging.OUTPUT, merging.ERRORS)):
            continue
        why = f"its fetch failed: {failed[host]}" if host in failed else "not asked"
        out.append(merging.ShardCopy(host, folder, stale=why))
    return out


def merge_jobs(reports: list[HostReport], dest: Path, room: Room | None = None) -> list[merging.Merged]:
    """Each job fetched, its hosts' copies merged into `dest/<job>/` (handoff.ops.merge),
    with the last fetched copy of each of its hosts this fetch did not bring (unreachable,
    not asked: `last_copies`), each within `room` (the fetch's share of the disk): a merge
    that may not fit is not written, and says so."""
    copies: dict[str, list[merging.ShardCopy]] = {}
    for rep in reports:
        if rep.ok:
            for job, folder in rep.data_as(FetchedTo).jobs.items():
                copies.setdefault(job, []).append(merging.ShardCopy(rep.target.label, Path(folder)))
    failed = {rep.target.label: rep.reason for rep in reports if not rep.ok}
    for job, found in copies.items():
        found += last_copies(job, dest, {c.host for c in found}, failed)
    # Job names were checked when fetched (untrusted.job_name); the merged folder must not
    # be reached through a symlink either. A job that wrote no answers file on any host
    # has nothing to merge (the extractor's features stay per host, each shard whole in
    # DEST/<host>/<job>/features/), and its status totals would count ids that no
    # output.jsonl holds.
    out = []
    for job, found in sorted(copies.items()):
        if not any((c.folder / name).exists() for c in found
                   for name in (merging.OUTPUT, merging.ERRORS)):
            continue
        merged_dir = untrusted.inside(dest, job)
        # A single copy kept whole is linked, not copied: only several copies take room.
        need = sum(c.sizes()[name] for c in found for name in (merging.OUTPUT, merging.ERRORS)) \
            if len(found) > 1 else 0
        if room is not None and need and not room.take(need):
            out.append(merging.Merged(job, merged_dir, [c.host for c in found],
                                      error=f"not merged: {room.refusal(need)}"))
            continue
        try:  # each job judged by the layout this workstation recorded when it launched it
            out.append(merging.merge(job, found, merged_dir.parent, shard_layouts.load(job)))
        except OSError as exc:
            out.append(merging.Merged(job, merged_dir, [c.host for c in found],
                                      error=f"the merge could not be written ({exc.strerror or exc}); "
                                            f"free some space under {dest} and fetch again"))
    return out
