"""For every test folder: tells scripts/test's second pass which files hold its tests, and
puts the long chains of module-scoped fixtures first, each on one xdist worker.

scripts/test runs every test but the `serial` ones (and the traceback check) over xdist
workers, then those alone. The second pass need not import every test module again (the
extractor's pull in torch and transformers, tens of seconds of CPU): the first pass's
collection, before `-m` deselects anything, writes the files holding a `serial` or
`after_every_fab_run` test to $HANDOFF_SERIAL_FILES, and the second pass runs only those.

Under xdist (`-n N`, the default `--dist load`) the scheduler below makes each file of
LONG_CHAINS one unit of work (one worker runs all its tests, so its module-scoped engines,
models and extractions are built once, not once per worker that drew one of its tests), and
those files come first, so their chains start at once instead of being drawn late and
running alone at the end (the vLLM extraction chain, ~11 min at load 8, started half-way
through and was the whole tail). Every other test is its own unit, handed to whichever
worker is free. (xdist's own `--dist loadgroup` cannot do it here: with pytest 9 its
`@group` suffix never reaches the node ids, so every test stays its own unit.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

SECOND_PASS_MARKS = ("serial", "after_every_fab_run")
# Longest first: a vLLM engine start per module fixture (tests/payload/extract/vllm/: two
# files, so that their engines start on two workers; as one file they were one worker's
# ~13 min at load 8, the whole parallel pass's tail), a vLLM server, the vllm backend
# through fab, then tiny-model extractions shared by a module's tests.
LONG_CHAINS = (
    "tests/payload/extract/vllm/test_kill_resume.py",
    "tests/payload/extract/vllm/test_native.py",
    "tests/payload/test_generate_vllm.py",
    "tests/integration/test_extractor_vllm_role.py",  # one test, ~2 min: a vLLM engine via fab
    "tests/payload/extract/formats/test_trainers.py",
    "tests/payload/extract/formats/test_formats.py",
    "tests/payload/extract/backends/test_hf.py",
)


def _chain(item: pytest.Item) -> int:
    path = item.nodeid.split("::")[0]
    return LONG_CHAINS.index(path) if path in LONG_CHAINS else len(LONG_CHAINS)


# optionalhook: without xdist (`-p no:xdist`, a plain single-process run) pytest would
# refuse the unknown hook and stop before collecting anything.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "load":
        return None  # an explicit --dist mode is xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class ChainsFirst(LoadScopeScheduling):
        """Units: a LONG_CHAINS file whole, any other test alone; in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return path if path in LONG_CHAINS else nodeid

    config.option.loadscopereorder = False  # keep the chains first (not the largest unit)
    return ChainsFirst(config, log)


@pytest.hookimpl(tryfirst=True)  # before -m deselects them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_chain)  # stable: the order within each file and among the rest is kept
    target = os.environ.get("HANDOFF_SERIAL_FILES")
    # one writer: the only process, or the first xdist worker (all collect the same items)
    if not target or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    files = sorted({item.nodeid.split("::")[0] for item in items
                    if any(item.get_closest_marker(m) for m in SECOND_PASS_MARKS)})
    Path(target).write_text("".join(f"{f}\n" for f in files))
