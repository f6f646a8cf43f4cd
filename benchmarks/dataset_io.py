"""What datasets cost on the workstation: `fab launch`'s local check and `fab fetch`'s merge,
each against the bare floor of the same work.

    .venv/bin/python benchmarks/dataset_io.py [--lines 40000] [--reps 5]

Writes an EAGLE-3-shaped corpus in a temp dir (ShareGPT records with an old answer, ~3.8 KB
a line), two hosts' shards of its answers, then alternates, --reps times:
  check   handoff.ops.jobs.datasets.check_file: sha256, the payload's parser, ids, lengths;
  parse   the floor: one `json.loads` per line, nothing else;
  merge   handoff.ops.merge.merge of the two shards (ids read in place, each once, atomic
          writes), the manifest removed first so it really merges;
  copy    the floor: the two shards' bytes concatenated into one file.
Prints medians, MB/s and the ratios check/parse and merge/copy. Wall-clock figures swing
with whatever else runs on the machine; quote them as provisional on a shared box.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from handoff.ops.jobs.datasets import check_file  # noqa: E402
from handoff.ops.merge import MANIFEST, ShardCopy, merge  # noqa: E402
from payload.generate.journal import encode_record  # noqa: E402
from payload.records import parse_shard  # noqa: E402


def corpus(root: Path, lines: int) -> tuple[Path, list[ShardCopy]]:
    inp = root / "B3.jsonl"
    answer = "answer text " * 280
    with inp.open("w") as fh:
        for i in range(lines):
            fh.write(json.dumps({"id": f"q{i:06d}", "conversations": [
                {"from": "human", "value": "question " * 40}, {"from": "gpt", "value": answer}]}) + "\n")
    copies = []
    for i in range(2):
        folder = root / f"host{i}" / "B3"
        folder.mkdir(parents=True)
        shard, n = parse_shard(f"{i}/2"), 0
        with (folder / "output.jsonl").open("wb") as out:
            for k in range(lines):
                key = f"q{k:06d}"
                if shard.owns(key):  # as the payload writes them: id first, compact
                    out.write(encode_record({"id": key, "usage": {"cost": 0.002}, "response": answer,
                                             "messages": [{"role": "user", "content": "question " * 40}]}))
                    n += 1
        (folder / "output.errors.jsonl").write_text("")
        (folder / "status.json").write_text(json.dumps({"state": "finished", "total": n}))
        (folder / "job.json").write_text(json.dumps({"shard": f"{i}/2"}))
        copies.append(ShardCopy(f"host{i}", folder))
    return inp, copies


def parse_floor(path: Path) -> None:
    with path.open("rb") as fh:
        for line in fh:
            json.loads(line)


def copy_floor(copies: list[ShardCopy], dest: Path) -> None:
    with dest.open("wb") as out:
        for c in copies:
            with (c.folder / "output.jsonl").open("rb") as fh:
                shutil.copyfileobj(fh, out, 8 << 20)


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--lines", type=int, default=40000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-datasets-"))
    try:
        inp, copies = corpus(root, args.lines)
        in_mb = inp.stat().st_size / 1e6
        out_mb = sum((c.folder / "output.jsonl").stat().st_size for c in copies) / 1e6
        times: dict[str, list[float]] = {"check": [], "parse": [], "merge": [], "copy": []}
        for _ in range(args.reps):
            times["check"].append(timed(lambda: check_file(inp)))
            times["parse"].append(timed(lambda: parse_floor(inp)))
            (root / "merged" / "B3" / MANIFEST).unlink(missing_ok=True)
            times["merge"].append(timed(lambda: merge("B3", copies, root / "merged")))
            times["copy"].append(timed(lambda: copy_floor(copies, root / "copy.jsonl")))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"datasets: {args.lines} lines, input {in_mb:.0f} MB, shards {out_mb:.0f} MB, "
              f"medians of {args.reps}")
        for name, mb in (("check", in_mb), ("parse", in_mb), ("merge", out_mb), ("copy", out_mb)):
            print(f"  {name:6s} {med[name]:7.3f} s  {mb / med[name]:6.0f} MB/s")
        print(f"  check / parse = {med['check'] / med['parse']:.2f}x   "
              f"merge / copy = {med['merge'] / med['copy']:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
