"""The `sleeper` and `batch` test roles' job: a stand-in for `payload generate` in unit tests.

    sleeper.py JOB_DIR INPUT MODE [SHARD]

Writes JOB_DIR/status.json as the payload does. MODE `run`: state running until SIGTERM,
then stopped (exit 3, as the payload's graceful stop); `crash`: a message on stderr, exit
2 at once; `finish`: state finished at once, exit 0; `answer`: one output record per prompt
of INPUT this SHARD (I/N) owns, by the payload's own rules, then finished, exit 0.
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


def answer(job_dir: str, input_path: str, shard_spec: str) -> int:
    from pathlib import Path

    from payload.records import BadRecord, iter_input, parse_prompt, parse_shard

    shard = parse_shard(shard_spec)
    done = 0
    bad: list[dict[str, object]] = []
    with open(os.path.join(job_dir, "output.jsonl"), "w") as out:
        for line_no, text in iter_input(Path(input_path)):
            try:
                if isinstance(text, BadRecord):
                    raise text
                prompt = parse_prompt(text, line_no)
            except BadRecord as exc:
                bad.append({"line": line_no, "reason": str(exc)})
                continue
            if shard.owns(prompt.key):
                out.write(json.dumps({"id": prompt.id, "usage": {"cost": 0.001},
                                      "response": "ok", "messages": prompt.messages}) + "\n")
                done += 1
    tmp = os.path.join(job_dir, ".status.json.tmp")
    with open(tmp, "w") as fh:
        json.dump({"state": "finished", "exit_code": 0, "done": done, "failed": 0, "total": done,
                   "cost": done * 0.001, "bad_lines": len(bad), "bad_line_samples": bad[:20],
                   "rate_rps": 1.0}, fh)
    os.replace(tmp, os.path.join(job_dir, "status.json"))
    return 0


def main(job_dir: str, input_path: str, mode: str, shard: str = "0/1") -> int:
    if mode == "answer":
        return answer(job_dir, input_path, shard)
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
    args = sys.argv[1:]
    if "--exclude-ids" in args:  # a shard taken over: the sleeper asks nothing, so no matter
        i = args.index("--exclude-ids")
        args = args[:i] + args[i + 2:]
    sys.exit(main(*args[:4]))
