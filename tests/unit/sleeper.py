"""The `sleeper` test role's job: a stand-in for `payload generate` in unit tests.

    sleeper.py JOB_DIR INPUT MODE

Writes JOB_DIR/status.json as the payload does. MODE `run`: state running until SIGTERM,
then stopped (exit 3, as the payload's graceful stop); `crash`: a message on stderr, exit
2 at once; `finish`: state finished at once, exit 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def write(job_dir: str, state: str, done: int) -> None:
    tmp = os.path.join(job_dir, ".status.json.tmp")
    with open(tmp, "w") as fh:
        json.dump({"state": state, "done": done, "failed": 0, "total": 3, "cost": 0.5,
                   "rate_rps": 1.0, "tokens_per_s": 10.0}, fh)
    os.replace(tmp, os.path.join(job_dir, "status.json"))


def main(job_dir: str, input_path: str, mode: str) -> int:
    if mode == "crash":
        print(f"sleeper: cannot read {input_path}: simulated failure", file=sys.stderr)
        return 2
    if mode == "finish":
        write(job_dir, "finished", 3)
        return 0
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    write(job_dir, "running", 1)
    print("sleeper: running", flush=True)
    while not stopping:
        time.sleep(0.02)
    write(job_dir, "stopped", 2)
    print("sleeper: stopped", flush=True)
    return 3


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
