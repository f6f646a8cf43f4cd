"""Transfer benchmark: `fab fetch` of one 1 GB file against `scp` (same key, same host).

One loopback sandbox container (handoff.testing.sandbox: real sshd, an unprivileged user)
holds a job whose `output.jsonl` is SIZE bytes of records as the payload writes them. Each
repetition runs, back to back and in a rotating order so machine noise spreads over all:
  fetch   `fab fetch` into an empty folder (the whole command: startup, connect, listing,
          download, rename, and the merge into DEST/<job>/output.jsonl, each id
          checked once)                                       vs `scp host:FILE DEST`
  resume  `fab fetch` with the first half already there, as a cut fetch leaves it (the
          part file and the index of its lines, which records the host file it came from
          and the part as written): the probe (2 MiB each side), then only the rest moves,
          and the merge reads only the new lines              vs the whole fetch
          and again with no such record (a part left by an older handoff or copied in):
          the same, while both sides hash the half for the whole-prefix proof
  grown   `fab fetch` again after the host's file grew from half to whole (a running job
          appending to it; the first half fetched by `fab fetch` before, untimed): only the
          new bytes move and the merge adds only the new lines  vs the whole fetch
  upload  transfer.upload_file over an SSHSession, what `fab launch --input` runs (connect,
          temp file, rename)                                  vs `scp FILE host:DEST`
  upload resume  transfer.upload_resumable (what `fab launch --input` runs) with half the
          file already in the host's part file, as a cut upload leaves it
                                                              vs the whole upload
`--explore` adds what the choice of transport was measured against: `ssh host cat`,
`sftp -b`, rsync (when installed), and paramiko's stock SFTP file reads/writes (32 KiB
requests, 2 MiB window, aes128-ctr: handoff before this benchmark existed).

Wall time is the median over --reps; CPU is the client side only (user+sys of the child
processes, or of this process for in-process runs), the sshd side runs on the same cores.
Ratios are medians of per-repetition ratios. Every result is checked (size and sha256).

    sudo .venv/bin/python benchmarks/transfer.py                  # 1 GB, 5 reps
    sudo .venv/bin/python benchmarks/transfer.py --explore        # + the transports compared
    sudo .venv/bin/python benchmarks/transfer.py --write          # record in BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import report as report_md  # noqa: E402
from handoff.ops.local_copies import sha256_file  # noqa: E402
from handoff.testing.sandbox import Container, Sandbox  # noqa: E402

FAB = Path(sys.executable).parent / "fab"  # the venv running this benchmark
TARGET_RATIO = 1.25  # fab fetch / scp, wall
TARGET_RESUME = 0.6  # fab fetch of the missing half / a whole fab fetch, wall


@dataclass
class Case:
    name: str
    group: str  # fetch, resume, upload
    run: Callable[[], None]  # the timed part
    prepare: Callable[[], None] = lambda: None
    check: Callable[[], None] = lambda: None
    in_process: bool = False
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)


def cpu(in_process: bool) -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF if in_process else resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(case: Case) -> None:
    case.prepare()
    c0, t0 = cpu(case.in_process), time.perf_counter()
    case.run()
    case.walls.append(time.perf_counter() - t0)
    case.cpus.append(cpu(case.in_process) - c0)
    case.check()


def make_file(path: Path, size: int) -> str:
    """A job's `output.jsonl` of exactly `size` bytes at `path`: records as the payload writes
    them (`id` first, ~7 KB answers of incompressible text, the last one sized to end the
    file), so fetch's merge does its real work; its sha256."""
    rnd, digest, left, i = random.Random(12), hashlib.sha256(), size, 0

    def record(length: int) -> bytes:
        head = b'{"id":"p%d","usage":{"cost":0.0001},"response":"' % i
        text = base64.b64encode(rnd.randbytes(length * 3 // 4 + 3))[:length - len(head) - 3]
        return head + text + b'"}\n'

    with path.open("wb") as fh:
        while left:
            block = bytearray()
            while len(block) < (8 << 20) and len(block) < left:
                rest = left - len(block)
                block += record(rest if rest < 14_000 else 7000)
                i += 1
            fh.write(block)
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


class Bench:
    def __init__(self, sbx: Sandbox, work: Path, size: int) -> None:
        self.sbx = sbx
        self.c: Container = sbx.containers[0]
        self.work = work
        self.size = size
        job = self.c.home / ".handoff" / "jobs" / "generator"
        job.mkdir(parents=True)
        self.remote = job / "output.jsonl"
        self.digest = make_file(self.remote, size)
        self.upload_src = work / "input.jsonl"
        shutil.copyfile(self.remote, self.upload_src)
        self.uploaded = self.c.home / "input.jsonl"
        subprocess.run(["chown", "-R", self.c.user, str(self.c.home / ".handoff")], check=True)
        self.dest = work / "results"
        self.local = self.dest / self.c.name / "generator" / "output.jsonl"
        self.merged = self.dest / "generator" / "output.jsonl"
        self.copy = work / "copy.bin"
        # PYTHONPATH passes through: `PYTHONPATH=<another tree>` measures that tree's fab.
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
                    "TERM": "dumb", "NO_COLOR": "1", **sbx.env(),
                    **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}}
        self.ssh = ["-F", str(sbx.ssh_config), "-o", "BatchMode=yes"]
        self.download_s: dict[str, list[float]] = {}  # fab's own download times, by case
        self.grown_cut = "mid"  # where the grown case's first fetch found the file: mid-line, or "line"

    # -- the commands ------------------------------------------------------------------------
    def sub(self, argv: list[str], **kwargs: object) -> bytes:
        kwargs.setdefault("stdout", subprocess.PIPE)
        proc = subprocess.run(argv, env=self.env, cwd=REPO, stderr=subprocess.PIPE, check=False,
                              **kwargs)  # type: ignore[call-overload]
        if proc.returncode != 0:
            sys.exit(f"{argv[0]} failed ({proc.returncode}): {(proc.stdout or b'')[-2000:]!r} "
                     f"{proc.stderr[-2000:]!r}")
        return proc.stdout or b""

    def fab_fetch(self, case: str) -> None:
        out = self.sub([str(FAB), "fetch", "--host", self.c.name, "--dest", str(self.dest)])
        # fab's own line for the download ("↓ output.jsonl: 1.0 GB in 1.2 s (...)"): the
        # transfer apart from startup, listing and the merge.
        took = re.findall(rb"output\.jsonl: [\d.]+ [kMG]?B in ([\d.]+) s", out)
        if took:
            self.download_s.setdefault(case, []).append(float(took[-1]))

    def scp_get(self) -> None:
        self.sub(["scp", "-q", *self.ssh, f"{self.c.name}:{self.remote}", str(self.copy)])

    def scp_put(self) -> None:
        self.sub(["scp", "-q", *self.ssh, str(self.upload_src), f"{self.c.name}:{self.uploaded}"])

    def ssh_cat(self) -> None:
        with self.copy.open("wb") as out:
            self.sub(["ssh", *self.ssh, self.c.name, f"cat {self.remote}"], stdout=out)

    def sftp_get(self) -> None:
        self.sub(["sftp", "-q", *self.ssh, "-b", "-", self.c.name],
                 input=f"get {self.remote} {self.copy}\n".encode())

    def rsync_get(self) -> None:
        self.sub(["rsync", "-e", "ssh " + " ".join(self.ssh),
                  f"{self.c.name}:{self.remote}", str(self.copy)])

    def session(self, stock: bool = False):  # type: ignore[no-untyped-def]
        import paramiko

        from handoff.cli import commands
        from handoff.host.ssh_session import SSHSession
        from handoff.ssh import connect

        os.environ.update(self.sbx.env())
        [target] = commands.targets_for(self.c.name, None)
        saved = connect._Transport._preferred_ciphers
        if stock:  # paramiko's own order: aes128-ctr first
            connect._Transport._preferred_ciphers = paramiko.Transport._preferred_ciphers
        try:
            s = SSHSession(target)
            s.connect()
        finally:
            connect._Transport._preferred_ciphers = saved
        return s

    def handoff_put(self) -> None:
        from handoff.host.transfer import upload_file

        with self.session() as s:
            upload_file(s.files, self.upload_src, str(self.uploaded), label=s.label)

    def handoff_resume_put(self) -> None:
        from handoff.host.transfer import upload_resumable
        from handoff.ops.jobs.upload import _prefix_sha256, _probe_sha256

        notes: list[str] = []
        with self.session() as s:
            resumed = upload_resumable(
                s.files, self.upload_src, str(self.uploaded), label=s.label, notes=notes,
                remote_sha256=lambda path, n: _prefix_sha256(s, path, n),
                remote_probe=lambda path, n: _probe_sha256(s, path, n))
        if resumed != self.size // 2 or notes:
            sys.exit(f"the upload did not resume from half: {resumed} {notes}")

    def stock_get(self) -> None:
        """paramiko's own SFTP client as handoff used it before: 32 KiB prefetched reads."""
        import paramiko

        with self.session(stock=True) as s:
            sftp = paramiko.SFTPClient.from_transport(s.transport)  # 2 MiB window, 32 KiB packets
            assert sftp is not None
            with sftp.open(str(self.remote), "rb") as fh, self.copy.open("wb") as out:
                fh.prefetch(self.size)
                for block in iter(lambda: fh.read(1 << 20), b""):
                    out.write(block)
            sftp.close()

    def stock_put(self) -> None:
        import paramiko

        with self.session(stock=True) as s:
            sftp = paramiko.SFTPClient.from_transport(s.transport)
            assert sftp is not None
            with sftp.open(str(self.uploaded), "wb") as fh, self.upload_src.open("rb") as src:
                fh.set_pipelined(True)
                for block in iter(lambda: src.read(32768), b""):
                    fh.write(block)
            sftp.close()

    # -- preparing and checking ----------------------------------------------------------------
    def clear(self) -> None:
        shutil.rmtree(self.dest, ignore_errors=True)
        self.copy.unlink(missing_ok=True)
        self.uploaded.unlink(missing_ok=True)
        for leftover in self.c.home.glob(".input.jsonl.tmp-*"):
            leftover.unlink()

    def half_fetched(self, recorded: bool = True) -> None:
        """What a fetch cut at half leaves: the partial file with the first half, and the
        index of its lines that the cut download saved (transfer.download's on_written),
        which records the host file it came from (the device:inode the host's listing
        reports) and the part as written; `recorded=False`: a part with no such record
        (left by an older handoff, or copied in by hand), which is proven whole."""
        from handoff.host.remote_code import fetch_list
        from handoff.ops import merge_index

        self.clear()
        part = self.local.with_name(".output.jsonl.tmp-part")
        part.parent.mkdir(parents=True)
        with self.remote.open("rb") as src, part.open("wb") as out:
            copy_prefix(src, out, self.size // 2)
        host_file = fetch_list.file_id(self.remote.stat()) if recorded else None
        growing = merge_index.Growing(self.local, 0, host_file)
        growing(part)
        growing.save()

    def grown(self) -> None:
        """What fetching a running job leaves, and what the job adds next: the host's file
        cut back to its first half (keeping its inode; in the middle of a line, as a job
        writing its next record is found), fetched by `fab fetch` (untimed: the download,
        its index and the merge), then appended to up to the whole file, as the payload
        appends (same inode, same bytes first)."""
        self.clear()
        half = self.size // 2
        if self.grown_cut == "line":  # the first fetch found the job between two records
            with self.remote.open("rb") as fh:
                fh.seek(half)
                half += len(fh.readline())
        os.truncate(self.remote, half)
        self.fab_fetch("grown: the first fetch")
        with self.upload_src.open("rb") as src, self.remote.open("ab") as out:
            src.seek(half)
            copy_prefix(src, out, self.size - half)

    def half_uploaded(self) -> None:
        """What an upload cut at half leaves on the host: its part file, the login user's."""
        self.clear()
        part = self.uploaded.with_name(".input.jsonl.tmp-part")
        with self.upload_src.open("rb") as src, part.open("wb") as out:
            copy_prefix(src, out, self.size // 2)
        shutil.chown(part, self.c.user)

    def expect(self, path: Path) -> Callable[[], None]:
        def check() -> None:
            if path.stat().st_size != self.size or sha256_file(path) != self.digest:
                sys.exit(f"{path} does not hold the file")
        return check

    def cases(self, explore: bool) -> list[Case]:
        cases = [
            Case("fab fetch", "fetch", lambda: self.fab_fetch("fetch"), self.clear,
                 self.expect(self.local)),
            Case("scp", "fetch", self.scp_get, self.clear, self.expect(self.copy)),
            Case("fab fetch, half already here", "resume", lambda: self.fab_fetch("resume"),
                 self.half_fetched,
                 self.expect(self.local)),
            Case("fab fetch, half here with no record of it (proven whole)", "resume",
                 lambda: self.fab_fetch("resume proven"),
                 lambda: self.half_fetched(recorded=False), self.expect(self.local)),
            Case("fab fetch, the host's file grew since the last fetch", "grown",
                 lambda: self.fab_fetch("grown"), self.grown,
                 lambda: (self.expect(self.local)(), self.expect(self.merged)())),
            Case("handoff upload (fab launch --input)", "upload", self.handoff_put, self.clear,
                 self.expect(self.uploaded), in_process=True),
            Case("handoff upload, half already there", "upload resume", self.handoff_resume_put,
                 self.half_uploaded, self.expect(self.uploaded), in_process=True),
            Case("scp upload", "upload", self.scp_put, self.clear, self.expect(self.uploaded)),
        ]
        if explore:
            cases += [
                Case("ssh host cat", "fetch", self.ssh_cat, self.clear, self.expect(self.copy)),
                Case("sftp -b", "fetch", self.sftp_get, self.clear, self.expect(self.copy)),
                Case("paramiko stock SFTP (handoff before)", "fetch", self.stock_get, self.clear,
                     self.expect(self.copy), in_process=True),
                Case("paramiko stock SFTP upload (before)", "upload", self.stock_put, self.clear,
                     self.expect(self.uploaded), in_process=True),
            ]
            if shutil.which("rsync"):
                cases.append(Case("rsync -e ssh", "fetch", self.rsync_get, self.clear,
                                  self.expect(self.copy)))
        return cases


def copy_prefix(src: IO[bytes], out: IO[bytes], n: int) -> None:
    left = n
    while left > 0 and (block := src.read(min(left, 8 << 20))):
        out.write(block)
        left -= len(block)


def paired(case: Case, base: Case) -> float:
    return statistics.median(a / b for a, b in zip(case.walls, base.walls, strict=True))


def report(cases: list[Case], size: int, reps: int, command: str, loads: list[str],
           download_s: dict[str, list[float]]) -> str:
    by = {c.name: c for c in cases}
    fab, scp = by["fab fetch"], by["scp"]
    rows = ["| transfer | wall (median) | MB/s | client CPU (median) | wall runs | vs scp (same direction) |",
            "|---|---:|---:|---:|---|---:|"]
    for c in cases:
        base = by["scp upload"] if c.group.startswith("upload") else scp
        ratio = "-" if c is base else f"{paired(c, base):.2f}×"
        wall = statistics.median(c.walls)
        rows.append(f"| {c.group}: {c.name} | {wall:.2f} s | {size / wall / 1e6:.0f} | "
                    f"{statistics.median(c.cpus):.2f} s | {', '.join(f'{w:.2f}' for w in c.walls)} | "
                    f"{ratio} |")
    fetch_ratio = paired(fab, scp)
    resume = by["fab fetch, half already here"]
    proven = by["fab fetch, half here with no record of it (proven whole)"]
    up, up_resume = by["handoff upload (fab launch --input)"], by["handoff upload, half already there"]
    resumed = paired(resume, fab)
    up_resumed = paired(up_resume, up)
    verdicts = [
        f"- `fab fetch` of {size / 1e9:.2f} GB: {statistics.median(fab.walls):.2f} s, "
        f"{fetch_ratio:.2f}× scp's wall time (target ≤ {TARGET_RATIO}×: "
        f"{'met' if fetch_ratio <= TARGET_RATIO else 'MISSED'})",
        f"- resumed from half: {statistics.median(resume.walls):.2f} s, {resumed:.2f}× a whole "
        f"fetch (target ≤ {TARGET_RESUME}×: {'met' if resumed <= TARGET_RESUME else 'MISSED'}; "
        "the part a cut fetch left, with its record: only the second half moves, checked "
        "first by a 2 MiB probe on each side, no whole-prefix hash (the part is the one "
        "this workstation wrote from that host file, untouched), the merge reading only "
        "the new lines)",
        f"- resumed from a half with no record of it: {statistics.median(proven.walls):.2f} s, "
        f"{paired(proven, fab):.2f}× a whole fetch (the same, plus the whole half hashed "
        "on both sides beside the transfer, the host on a second channel)",
        f"- upload resumed from half: {statistics.median(up_resume.walls):.2f} s, "
        f"{up_resumed:.2f}× a whole upload (the same checks on the host's part file)",
    ]
    grown = by.get("fab fetch, the host's file grew since the last fetch")
    if grown is not None:
        ratio = paired(grown, fab)
        verdicts.append(
            f"- fetched again after the host's file grew from half to whole (a running job): "
            f"{statistics.median(grown.walls):.2f} s, {ratio:.2f}× a whole fetch (target ≤ "
            f"{TARGET_RESUME}×: {'met' if ratio <= TARGET_RESUME else 'MISSED'}; only the new "
            "bytes move, from the copy's last whole line, checked by the 2 MiB probe on each "
            "side with no whole-prefix hash (the copy is the one this workstation wrote from "
            "that host file, untouched); the copy grows in place and the merged file, its "
            "hard link, with it; the merge reads only the new lines)")
    down = statistics.median(download_s["fetch"]) if download_s.get("fetch") else 0.0
    if down > 0:  # fab prints tenths of a second: a small file reads 0.0 s
        verdicts.append(
            f"- of which the download itself (fab's own line, `output.jsonl: ... in X s`): "
            f"{down:.1f} s, {down / statistics.median(scp.walls):.2f}× scp's whole command "
            f"({size / down / 1e6:.0f} MB/s); the rest is startup, the listing and the merge "
            "into DEST/<job>/output.jsonl (each id checked once; one host's copy kept whole "
            "is hard-linked, not copied)")
    return "\n".join([
        f"One loopback sandbox container, a {size / 1e9:.2f} GB `output.jsonl`, {reps} "
        "repetitions in rotating order; wall time includes each tool's startup, CPU is the "
        "client side only (the sshd and sftp-server side runs on the same 2 cores). Ratios "
        "are medians of per-repetition ratios. Load average (1, 5, 15 min) at start: "
        f"{loads[0]}; at end: {loads[1]}. Command:",
        "", "```", command, "```", "", *rows, "", *verdicts])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=1000.0, help="file size in MB (1e6)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--explore", action="store_true",
                        help="also ssh cat, sftp -b, rsync, paramiko's stock SFTP")
    parser.add_argument("--write", action="store_true", help="record in BENCHMARKS.md ## Transfers")
    parser.add_argument("--grown-cut", choices=("mid", "line"), default="mid",
                        help="where the grown case's first fetch finds the host's file: in the "
                             "middle of a line (a job writing its next record; default) or at "
                             "a line's end")
    parser.add_argument("--only", default="", metavar="GROUPS",
                        help="comma-separated groups to run (fetch, resume, grown, upload, "
                             "upload resume); default all (the report needs all)")
    args = parser.parse_args(argv)
    command = "sudo .venv/bin/python benchmarks/transfer.py " + " ".join(argv or sys.argv[1:])
    size = int(args.size_mb * 1e6)
    loads = [report_md.load()]
    with tempfile.TemporaryDirectory(prefix="handoff-bench-") as tmp:
        work = Path(tmp)
        with Sandbox(work / "sandbox", hosts=1, api=False, keyring="file") as sbx:
            bench = Bench(sbx, work, size)
            bench.grown_cut = args.grown_cut
            cases = bench.cases(args.explore)
            if args.only:
                wanted = {g.strip() for g in args.only.split(",")}
                cases = [c for c in cases if c.group in wanted]
            for rep in range(args.reps):
                shift = rep % len(cases)
                for case in cases[shift:] + cases[:shift]:
                    measure(case)
                print(f"rep {rep + 1}/{args.reps} (load {report_md.load()}): " + ", ".join(
                    f"{c.name} {c.walls[-1]:.2f}s" for c in cases), file=sys.stderr)
    loads.append(report_md.load())
    if args.only:  # a subset: the walls and their ratio to the first case
        for c in cases:
            print(f"{c.group}: {c.name}: median {statistics.median(c.walls):.2f} s "
                  f"({', '.join(f'{w:.2f}' for w in c.walls)}); "
                  f"{paired(c, cases[0]):.2f}x {cases[0].name}")
        return 0
    text = report(cases, size, args.reps, command.strip(), loads, bench.download_s)
    report_md.publish("Transfers", text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
