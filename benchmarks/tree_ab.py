"""Old tree against this one, side by side: `fab deploy` (fresh and no-op) to N loopback
hosts and `fab fetch` of one SIZE output, each tree's own `fab`, alternated on one sandbox.

A change that must not cost speed ("deploy to 8 hosts and `fab fetch` of 1 GB stay within 5%
of today") is checked here rather than by two runs of benchmarks/deploy.py and
benchmarks/transfer.py minutes apart: on a shared, loaded machine those swing by ±30%
between runs, while two commands run back to back see the same load. Each repetition runs
both trees, in an order that flips every repetition; wall time is measured around the
command, CPU is the `fab` process tree's own (user + sys, os.wait4), so the sshd side,
which both trees share, is left out. Reported: medians, and the median of the per-pair
ratios new/old (the figure to judge by: it cancels the load each pair shared).

The old tree is any checkout with its own venv (`git worktree add /tmp/base COMMIT && cd
/tmp/base && bash scripts/bootstrap`); both are byte-compiled first (as benchmarks/deploy.py
does) and run with PYTHONDONTWRITEBYTECODE=1.

    sudo .venv/bin/python benchmarks/tree_ab.py --old /tmp/base --hosts 8 --reps 12 --fetch-mb 1000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from handoff.testing.sandbox import Sandbox  # noqa: E402


def compile_tree(tree: Path) -> None:
    subprocess.run([str(tree / ".venv" / "bin" / "python"), "-m", "compileall", "-q",
                    str(tree / "handoff"), str(tree / "payload"), str(tree / "fabfile.py")],
                   check=True, stdout=subprocess.DEVNULL)


def run(tree: Path, env: dict[str, str], *args: str) -> tuple[float, float]:
    """(wall s, CPU s of the fab process tree) of one `fab ARGS` in `tree`; exits on failure."""
    start = time.perf_counter()
    proc = subprocess.Popen([str(tree / ".venv" / "bin" / "fab"), *args], cwd=tree, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{tree}: fab {' '.join(args)} failed:\n{out.decode(errors='replace')[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def wipe(sbx: Sandbox) -> None:
    for c in sbx.containers:
        shutil.rmtree(c.home / ".handoff", ignore_errors=True)
    for child in sbx.state_dir.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()


def output_file(path: Path, size: int) -> None:
    """`size` bytes of records as the payload writes them (id first, one per line)."""
    line = '{"id":"%09d","messages":[{"role":"user","content":"q"}],"response":"' + "x" * 900 + '"}\n'
    with path.open("w") as fh:
        written, i = 0, 0
        while written < size:
            text = line % i
            fh.write(text)
            written += len(text)
            i += 1


def summary(name: str, results: dict[str, list[tuple[float, float]]]) -> str:
    old, new = results["old"], results["new"]
    med = statistics.median
    wall = med([n[0] / o[0] for o, n in zip(old, new, strict=True)])
    cpu = med([n[1] / o[1] for o, n in zip(old, new, strict=True)])
    return (f"| {name} | {med([o[0] for o in old]):.3f} s | {med([n[0] for n in new]):.3f} s | "
            f"{wall:.3f} | {med([o[1] for o in old]):.3f} s | {med([n[1] for n in new]):.3f} s | "
            f"{cpu:.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, type=Path, help="the old tree (with its .venv)")
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--reps", type=int, default=12)
    parser.add_argument("--fetch-mb", type=float, default=1000.0, help="the fetched file, MB (1e6)")
    args = parser.parse_args(argv)
    trees = {"old": args.old.resolve(), "new": REPO}
    for tree in trees.values():
        compile_tree(tree)
    loads = [os.getloadavg()[0]]
    cases = ("deploy fresh", "deploy no-op", "fetch")
    results: dict[str, dict[str, list[tuple[float, float]]]] = {
        case: {name: [] for name in trees} for case in cases}
    with tempfile.TemporaryDirectory(prefix="handoff-ab-") as tmp:
        with Sandbox(Path(tmp) / "sbx", hosts=args.hosts) as sbx:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(sbx.home),
                   "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb", "NO_COLOR": "1",
                   "PYTHONDONTWRITEBYTECODE": "1", **sbx.env()}
            c = sbx.containers[0]
            source = Path(tmp) / "output.jsonl"
            output_file(source, int(args.fetch_mb * 1e6))
            dest = Path(tmp) / "dest"
            for rep in range(args.reps):
                order = list(trees) if rep % 2 == 0 else list(trees)[::-1]
                for name in order:
                    wipe(sbx)
                    results["deploy fresh"][name].append(run(trees[name], env, "deploy"))
                    results["deploy no-op"][name].append(run(trees[name], env, "deploy"))
                    job = c.home / ".handoff" / "jobs" / "bench"
                    job.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, job / "output.jsonl")
                    (job / "status.json").write_text(json.dumps({"state": "finished"}))
                    subprocess.run(["chown", "-R", f"{c.user}:", str(c.home / ".handoff")], check=True)
                    shutil.rmtree(dest, ignore_errors=True)
                    results["fetch"][name].append(run(trees[name], env, "fetch", "--host", c.name,
                                                      "--dest", str(dest)))
                print(f"rep {rep + 1}/{args.reps} (load {os.getloadavg()[0]:.1f}): " + ", ".join(
                    f"{case} {name} {results[case][name][-1][0]:.2f}s" for case in cases
                    for name in trees), file=sys.stderr, flush=True)
    loads.append(os.getloadavg()[0])
    print(f"old tree {trees['old']}, new tree {REPO}; {args.hosts} hosts, fetch of "
          f"{args.fetch_mb:g} MB, {args.reps} reps alternated, load {loads[0]:.1f} -> {loads[1]:.1f}")
    print("| case | old wall | new wall | new/old wall | old CPU | new CPU | new/old CPU |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        print(summary(case, results[case]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
