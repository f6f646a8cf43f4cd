"""What minted keys cost a deploy: `fab deploy` with a management key (one child key per host,
reused on a redeploy) against the same deploy placing the plain API key, on loopback sandbox
containers with the real Secret Service and the fake OpenRouter's management API.

    sudo .venv/bin/python benchmarks/keys.py [--hosts 3] [--reps 7]

A fresh deploy in minted mode adds, per host, a POST /keys and a second small SFTP write (the
record beside the key); an unchanged redeploy adds one SFTP read of that record and one GET
/keys/{hash} per host (is the key still live?). Both modes read the keyring on a thread
while the hosts connect. Prints medians and the minted/plain ratio of each.
"""

from __future__ import annotations

import argparse
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
FAB = Path(sys.executable).parent / "fab"  # the venv running this benchmark


def fab(env: dict[str, str], *args: str) -> float:
    start = time.monotonic()
    proc = subprocess.run([str(FAB), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"fab {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return time.monotonic() - start


def measure(mode: str, hosts: int, reps: int) -> tuple[list[float], list[float]]:
    from handoff.testing.sandbox import Sandbox

    root = Path(tempfile.mkdtemp(prefix="bench-keys-"))
    minted = mode == "minted"
    try:
        with Sandbox(root / "sbx", hosts=hosts, management=minted,
                     key_limit=1.0 if minted else None) as sbx:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
                   "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1", **sbx.env()}
            fresh, noop = [], []
            for _ in range(reps):
                fab(env, "cleanup-secrets")
                fresh.append(fab(env, "deploy"))  # the release stays: only the key is fresh
                noop.append(fab(env, "deploy"))
            return fresh, noop
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    results = {mode: measure(mode, args.hosts, args.reps) for mode in ("plain", "minted")}
    print(f"{args.hosts} hosts, {args.reps} reps, medians (wall time of `fab deploy`):")
    print("| mode | key placed (median) | unchanged redeploy (median) |")
    print("|---|---:|---:|")
    for mode, (fresh, noop) in results.items():
        print(f"| {mode} | {statistics.median(fresh):.3f} s | {statistics.median(noop):.3f} s |")
    (pf, pn), (mf, mn) = results["plain"], results["minted"]
    print(f"minted / plain: key placed {statistics.median(mf) / statistics.median(pf):.2f}x, "
          f"unchanged redeploy {statistics.median(mn) / statistics.median(pn):.2f}x")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
