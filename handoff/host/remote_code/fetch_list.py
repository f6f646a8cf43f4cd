"""The files of a job folder, for `fab fetch` (runs ON the host; stdlib only).

Lists every regular file under `job_dir` (sorted, relative paths) except the pid and
temp files being written. For each file the workstation already holds part of (`local`:
relative path -> local size), it returns the sha256 of the host file's first that many
bytes: equal means the local copy is a true prefix, so an append-only file resumes from
there and a complete one is skipped, without moving a byte.

With `jobs_dir` instead of `job_dir`, every job folder under it is listed in the same round
trip (`fab fetch` without `--job`); `local` then maps each job to its relative paths.
"""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TMP_MARK = ".tmp"  # payload.atomic's temp names (`.NAME.tmp-…`) and upload temps


def prefix_sha256(path: str, length: int) -> str:
    import hashlib

    digest = hashlib.sha256()
    left = length
    with open(path, "rb") as fh:
        while left > 0:
            chunk = fh.read(min(left, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def expand(path: str) -> str:
    return os.path.expanduser(path) if path.startswith("~") else path


def all_jobs(a: dict[str, Any]) -> dict[str, Any]:
    """Every job folder under `jobs_dir`, each listed as `listing` lists one."""
    jobs_dir = expand(a["jobs_dir"])
    local: dict[str, dict[str, int]] = a.get("local", {})
    try:
        names = sorted(n for n in os.listdir(jobs_dir)
                       if not n.startswith(".") and os.path.isdir(os.path.join(jobs_dir, n)))
    except OSError:
        names = []
    return {"jobs_dir": jobs_dir,
            "jobs": {n: listing({"job_dir": os.path.join(jobs_dir, n), "local": local.get(n, {})})
                     for n in names}}


def listing(a: dict[str, Any]) -> dict[str, Any]:
    job_dir = expand(a["job_dir"])
    local: dict[str, int] = a.get("local", {})
    files = []
    for root, dirs, names in os.walk(job_dir):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, job_dir)
            if rel == "pid" or TMP_MARK in name or not os.path.isfile(path):
                continue
            st = os.stat(path)
            entry: dict[str, Any] = {"rel": rel, "size": st.st_size, "mtime": st.st_mtime}
            have = local.get(rel)
            if have is not None and 0 < have <= st.st_size:
                entry["prefix_sha256"] = prefix_sha256(path, have)
            files.append(entry)
    return {"job_dir": job_dir, "exists": os.path.isdir(job_dir), "files": files}


def main(argv: list[str]) -> int:
    args = eval(argv[1], {"__builtins__": {}})
    print(json.dumps(all_jobs(args) if "jobs_dir" in args else listing(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
