"""`python -m payload extract`: EAGLE-3 training features from generated conversations.

The payload's CLI registers this subcommand through `add_arguments` and `run`. Importing
this package must stay cheap and torch-free: a generator container has no torch, and
`python -m payload generate` imports the CLI (and thus this package) too. The heavy
modules (`model`, `run`) are imported inside `run()` only.
"""

from __future__ import annotations

import argparse

from payload.extract.config import add_arguments

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    """Run the extractor; returns the exit code (0 ok, 1 some sample failed, 2 bad usage/input)."""
    from payload.extract.pipeline import main

    return main(args)
