"""What every benchmark here shares: its `## Section` of BENCHMARKS.md, and the machine's
load, so each figure is recorded with the command that made it and how busy the box was."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_section(title: str, body: str, path: Path = REPO / "BENCHMARKS.md") -> None:
    """Replace (or append) the `## {title}` section of BENCHMARKS.md, leaving others alone."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == f"## {title}"), None)
    section = [f"## {title}", "", *body.splitlines(), ""]
    if start is None:
        lines = [*lines, "", *section] if lines and lines[-1].strip() else [*lines, *section]
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        lines[start:end] = section
    path.write_text("\n".join(lines).rstrip("\n") + "\n")


def publish(title: str, text: str, write: bool, path: Path = REPO / "BENCHMARKS.md") -> None:
    """Print a benchmark's report and, when asked, record it as the `## {title}` section."""
    print(text)
    if write:
        write_section(title, text, path)
        print(f"\nwritten to {path} (## {title})", file=sys.stderr)


def load() -> str:
    """The 1, 5 and 15 minute load averages, as `uptime` prints them."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())
