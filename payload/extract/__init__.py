"""`python -m payload extract`: EAGLE-3 training features from generated conversations.

The payload's CLI registers this subcommand through `add_arguments` and `run`. Importing
this package must stay cheap and torch-free: a generator container has no torch, and
`python -m payload generate` imports the CLI (and thus this package) too. Only `config`
(the flags) is imported here; `pipeline` (and through it the model backend, which
imports torch) is imported inside `run()`.

The package's layers, lowest first (a module imports only from the layers below it):
what the target emits after its generation prompt (`rendering`); records to the
conversations to supervise (`conversations`); their tokens and loss masks (`tokens`);
a sample's tensors, batches and files (`tensors`, `batching`, `writer`); how the
features are stored, a cast or FP8 (`feature_dtype`); the output formats (`formats/`);
flags, the disk preflight and the run's reports (`config`, `preflight`, `status`,
`progress`, `metrics`); the model backends (`backends/`); meta.json and
the batch writer (`meta`, `writing`); the run's stages (`pipeline`).
"""

from __future__ import annotations

import argparse

from payload.extract.config import add_arguments

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    """Run the extractor; returns the exit code (0 ok, 1 some sample failed, 2 bad usage/input)."""
    from payload.extract.pipeline import main

    return main(args)
