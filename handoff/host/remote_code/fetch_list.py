"""The files of a job folder, for `fab fetch` (runs ON the host; stdlib only).

Lists every regular file under `job_dir` (sorted, relative paths) except the pid and
temp files being written. Nothing is followed: a symlink (to a file or a folder), a
device, a fifo or a socket is never listed as a file but reported in `skipped` with its
kind, so a link to the key file is never read (the workstation names what it skipped). For `output.jsonl` and `output.errors.jsonl`, which the workstation copies by whole
lines, `lines_end` says where the last whole line ends. For each file the workstation
already holds part of (`local`:
relative path -> local size N), it returns `prefix_sha256`, the sha256 of the *probe* of
the host file's first N bytes (`probe_sha256`: the whole N bytes when N <= 2 MiB, else
their first and last MiB): cheap on both sides whatever N, and it catches a file that was
replaced or rewritten (it starts otherwise) or cut and rewritten (it ends otherwise). The
workstation resumes on a matching probe and, unless its prefix is one it wrote itself from
this very host file and left untouched since (`file_id`, the file's device and inode,
tells the host file apart from one that replaced it: handoff.ops.merge_index.untouched),
proves the whole prefix while the rest moves (the `hash` mode below), so a difference in
the middle is caught before the file is renamed into place.

With `jobs_dir` instead of `job_dir`, every job folder under it is listed in the same round
trip (`fab fetch` without `--job`); `local` then maps each job to its relative paths.

With `hash` (absolute path -> N) instead, nothing is listed: the answer is `{"sha256":
{path: hex}}`, the sha256 of each file's first N bytes (`"probe": True`: of their probe),
or null for a file that cannot be read or is shorter than N. A resumed fetch runs it
beside its download, a resumed upload (`fab launch --input`) on its part file.
"""

from __future__ import annotations

import json
import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TMP_MARK = ".tmp"  # payload.atomic's temp names (`.NAME.tmp-…`) and upload temps
# The files the merge reads (handoff.ops.merge_index.INDEXED): fetched by whole lines, so
# the listing says where each one's last whole line ends (`lines_end`).
WHOLE_LINES = ("output.jsonl", "output.errors.jsonl")
LINES_END_SEARCH = 64 << 20  # how far back from the end a newline is looked for
PROBE = 1 << 20  # bytes hashed at each end of a prefix (handoff.ops.fetch.probe_ranges: the same)


def probe_ranges(length: int) -> list[tuple[int, int]]:
    """The byte ranges of a `length`-byte prefix that its probe hashes."""
    if length <= 2 * PROBE:
        return [(0, length)]
    return [(0, PROBE), (length - PROBE, length)]


def sha256_ranges(path: str, ranges: list[tuple[int, int]]) -> str | None:
    """sha256 of the bytes of `ranges` read in order; None when the file ends before them."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for start, end in ranges:
            fh.seek(start)
            left = end - start
            while left > 0:
                chunk = fh.read(min(left, 1 << 20))
                if not chunk:
                    return None
                digest.update(chunk)
                left -= len(chunk)
    return digest.hexdigest()


def probe_sha256(path: str, length: int) -> str | None:
    return sha256_ranges(path, probe_ranges(length))


def prefix_sha256(path: str, length: int) -> str | None:
    return sha256_ranges(path, [(0, length)])


def hashes(a: dict[str, Any]) -> dict[str, Any]:
    """The `hash` mode: sha256 of each file's first N bytes (or of their probe)."""
    how = probe_sha256 if a.get("probe") else prefix_sha256
    out: dict[str, str | None] = {}
    for path, length in a["hash"].items():
        try:
            out[path] = how(expand(path), int(length))
        except (OSError, ValueError):
            out[path] = None
    return {"sha256": out}


def lines_end(path: str, size: int) -> int:
    """Where the last whole line of a file of `size` bytes ends (after its last newline): 0
    when it holds none; `size` when none is found in its last LINES_END_SEARCH bytes (such a
    line is fetched as it is: handoff.host.transfer.WholeLines)."""
    end = size
    with open(path, "rb") as fh:
        while end > 0 and size - end < LINES_END_SEARCH:
            start = max(0, end - (64 << 10))
            fh.seek(start)
            found = fh.read(end - start).rfind(b"\n")
            if found >= 0:
                return start + found + 1
            end = start
    return 0 if end == 0 else size


def file_id(st: os.stat_result) -> str:
    """Which file this is on its host (device:inode): the same while it is appended to,
    another once it is replaced."""
    return f"{st.st_dev}:{st.st_ino}"


def expand(path: str) -> str:
    return os.path.expanduser(path) if path.startswith("~") else path


def all_jobs(a: dict[str, Any]) -> dict[str, Any]:
    """Every job folder under `jobs_dir`, each listed as `listing` lists one."""
    jobs_dir = expand(a["jobs_dir"])
    local: dict[str, dict[str, int]] = a.get("local", {})
    names, links = [], []
    try:
        for n in sorted(os.listdir(jobs_dir)):
            if n.startswith("."):
                continue
            mode = os.lstat(os.path.join(jobs_dir, n)).st_mode
            if stat.S_ISLNK(mode):
                links.append(n)
            elif stat.S_ISDIR(mode):
                names.append(n)
    except OSError:
        pass
    return {"jobs_dir": jobs_dir, "skipped": links,
            "jobs": {n: listing({"job_dir": os.path.join(jobs_dir, n), "local": local.get(n, {})})
                     for n in names}}


def kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def listing(a: dict[str, Any]) -> dict[str, Any]:
    job_dir = expand(a["job_dir"])
    local: dict[str, int] = a.get("local", {})
    files, skipped = [], []
    for root, dirs, names in os.walk(job_dir):  # never into a symlinked folder
        for d in [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            dirs.remove(d)
            skipped.append({"rel": os.path.relpath(os.path.join(root, d), job_dir), "kind": "symlink"})
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, job_dir)
            if rel == "pid" or TMP_MARK in name:
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                skipped.append({"rel": rel, "kind": kind(st.st_mode)})
                continue
            entry: dict[str, Any] = {"rel": rel, "size": st.st_size, "mtime": st.st_mtime,
                                     "file_id": file_id(st), "allocated": st.st_blocks * 512}
            if rel in WHOLE_LINES:
                try:
                    entry["lines_end"] = lines_end(path, st.st_size)
                except OSError:
                    pass
            have = local.get(rel)
            if have is not None and 0 < have <= st.st_size:
                digest = probe_sha256(path, have)
                if digest is not None:
                    entry["prefix_sha256"] = digest
            files.append(entry)
    exists = os.path.isdir(job_dir) and not os.path.islink(job_dir)
    try:  # what the filesystem holding the job can hold at all (a file longer is sparse)
        fs = os.statvfs(job_dir)
        fs_bytes = fs.f_blocks * fs.f_frsize
    except OSError:
        fs_bytes = None
    return {"job_dir": job_dir, "exists": exists, "files": files if exists else [],
            "skipped": skipped if exists else [], "fs_bytes": fs_bytes}


def main(argv: list[str]) -> int:
    args = eval(argv[1], {"__builtins__": {}})
    if "hash" in args:
        print(json.dumps(hashes(args)))
    else:
        print(json.dumps(all_jobs(args) if "jobs_dir" in args else listing(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
