"""Benchmark: `fab report` on a 40k-answer run of thinking-size answers, against its floor.

    .venv/bin/python benchmarks/run_report.py [--samples 40000] [--reps 3] [--write]

Makes up the fetched run (handoff.testing.fakerun: 3 hosts, 2000 in flight each, the seed
run's answer lengths and latencies, ~600 MB of merged records, metrics.jsonl per host),
then alternates, --reps times, each in its own process (wall time, peak RSS from wait4):
  report  `fab report --dest DIR`: every page written (records read once, streamed; the
          plots drawn; the answers browser sampled);
  floor   one `json.loads` per line of the merged output.jsonl and nothing else: what any
          report built from the records has to pay.
Prints medians, the ratio report/floor, the pages' sizes (and what the figures weigh in
them), then opens the job's page in headless Chromium (when installed): its load time, the
console errors (none expected) and its figures against the records' (samples, cost, p50).
Wall-clock figures swing with whatever else runs on the machine: quote medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import report as report_md  # noqa: E402
from handoff.testing.fakerun import FakeRun  # noqa: E402

SECTION = "Run report (fab report, 40k answers)"
MAKE = ("import json,sys\nfrom pathlib import Path\nfrom handoff.testing.fakerun import FakeRun\n"
        "w = FakeRun(samples=int(sys.argv[2]), concurrency=2000).write(Path(sys.argv[1]))\n"
        "print(json.dumps([w.answers, w.failures]))\n")
FLOOR = ("import json,sys\nn=0\nwith open(sys.argv[1],'rb') as fh:\n    for line in fh:\n"
         "        json.loads(line); n+=1\nprint(n)\n")


def measured(cmd: list[str]) -> tuple[float, float, str]:
    """(wall s, peak RSS MB, stdout) of one process."""
    t = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t
    out = proc.stdout.read().decode() if proc.stdout else ""
    err = proc.stderr.read().decode() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{cmd} failed ({proc.returncode}): {err[-2000:]}")
    return wall, usage.ru_maxrss / 1024, out


def browser_check(page: Path, records: Path, work: Path) -> str:
    sys.path.insert(0, str(REPO))
    from tests.support.browser import CHROMIUM, Chromium

    if CHROMIUM is None:
        return "Chromium: not installed here (scripts/bootstrap installs it): not checked"
    out = [json.loads(line) for line in records.open("rb")]
    cost = sum(r["usage"]["cost"] for r in out)
    q = statistics.quantiles([r["latency_s"] for r in out], n=100, method="inclusive")
    with Chromium(work / "chromium") as browser:
        t = time.monotonic()
        browser.open(page.as_uri())
        load = time.monotonic() - t
        got = browser.evaluate("JSON.parse(document.getElementById('handoff-summary').textContent)")
        errors = list(browser.errors)
        browser.screenshot(work / "report-40k.png")
    same = (got["samples"] == len(out) and abs(got["cost_usd"] - cost) < 1e-6
            and abs(got["latency_s"]["p50"] - q[49]) < 1e-3)
    return (f"Chromium {load:.2f} s to load the job page; console errors: {len(errors)}; "
            f"figures against the records (samples {len(out):,}, cost ${cost:,.2f}, p50 "
            f"{q[49]:.2f} s): {'equal' if same else 'DIFFERENT ' + json.dumps(got)[:300]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=40_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--write", action="store_true", help=f"record as `## {SECTION}` in BENCHMARKS.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="handoff-report-bench-") as tmp:
        work = Path(tmp)
        dest = work / "results"
        t = time.monotonic()
        # made in a process of its own: a child forked from a process holding the run's
        # records would report that process's memory as its own peak RSS (wait4)
        _, _, made_json = measured([sys.executable, "-c", MAKE, str(dest), str(args.samples)])
        run = FakeRun()
        run.job, counts = "prompts", json.loads(made_json)
        made = time.monotonic() - t
        merged = dest / run.job / "output.jsonl"
        size_mb = merged.stat().st_size / 1e6
        fab = str(REPO / ".venv" / "bin" / "fab")
        reps: dict[str, list[tuple[float, float]]] = {"report": [], "floor": []}
        for _ in range(args.reps):
            wall, rss, _ = measured([fab, "report", "--dest", str(dest)])
            reps["report"].append((wall, rss))
            wall, rss, _ = measured([sys.executable, "-c", FLOOR, str(merged)])
            reps["floor"].append((wall, rss))
        # the same run a tenth the size: what memory the records themselves add
        small = work / "small"
        measured([sys.executable, "-c", MAKE, str(small), str(max(1, args.samples // 10))])
        small_rss = statistics.median(measured([fab, "report", "--dest", str(small)])[1]
                                      for _ in range(args.reps))
        job_page = dest / run.job / "report.html"
        html = job_page.read_text()
        svg = sum(len(m) for m in re.findall(r"<svg.*?</svg>", html, re.S))
        answers = len(html.split('<section id="answers">', 1)[1]) if 'id="answers"' in html else 0
        run_page_kb = (dest / "report.html").stat().st_size / 1e3
        check = browser_check(job_page, merged, work)

    def med(name: str, i: int) -> float:
        return statistics.median(x[i] for x in reps[name])

    lines = [
        f"Command: `.venv/bin/python benchmarks/run_report.py --samples {args.samples} --reps "
        f"{args.reps}` (load {report_md.load()}).",
        "",
        f"The run: {counts[0]:,} answers + {counts[1]:,} failures over 3 hosts, merged "
        f"output.jsonl {size_mb:.0f} MB (thinking-size answers, ~14 KB a record), "
        f"metrics.jsonl per host; made up in {made:.1f} s (handoff.testing.fakerun).",
        "",
        "| | wall (median) | peak RSS (median) |",
        "|---|---:|---:|",
        f"| `fab report --dest DIR` (every page) | {med('report', 0):.2f} s | {med('report', 1):.0f} MB |",
        f"| floor: one `json.loads` a line of output.jsonl | {med('floor', 0):.2f} s | "
        f"{med('floor', 1):.0f} MB |",
        f"| ratio report / floor | {med('report', 0) / med('floor', 0):.2f}x | |",
        f"| `fab report` on the same run a tenth the size ({args.samples // 10:,} ids) | | "
        f"{small_rss:.0f} MB |",
        "",
        f"Reps (wall s): report {', '.join(f'{w:.2f}' for w, _ in reps['report'])}; floor "
        f"{', '.join(f'{w:.2f}' for w, _ in reps['floor'])}. Peak RSS: ten times the records "
        f"add {med('report', 1) - small_rss:.0f} MB (the columns kept per record, never its "
        f"text; most of the rest is matplotlib and numpy).",
        "",
        f"The job's page: {len(html.encode()) / 1e6:.2f} MB: its {html.count('<svg')} "
        f"figures {svg / 1e3:.0f} KB (inline SVG; the 40k-point scatter rasterized inside its "
        f"SVG), the answers browser {answers / 1e6:.2f} MB (a bounded sample: 200 random, every "
        f"cut one and up to 200 failures, texts cut), the rest (summary, tables, style, "
        f"scripts) {(len(html) - svg - answers) / 1e3:.0f} KB. The run's page: {run_page_kb:.0f} KB.",
        "",
        check,
    ]
    report_md.publish(SECTION, "\n".join(lines), args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
