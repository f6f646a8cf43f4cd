"""For every test folder: tells scripts/test's second pass which files hold its tests.

scripts/test runs every test but the `serial` ones (and the traceback check) over xdist
workers, then those alone. The second pass need not import every test module again (the
extractor's pull in torch and transformers, tens of seconds of CPU): the first pass's
collection, before `-m` deselects anything, writes the files holding a `serial` or
`after_every_fab_run` test to $HANDOFF_SERIAL_FILES, and the second pass runs only those.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SECOND_PASS_MARKS = ("serial", "after_every_fab_run")


@pytest.hookimpl(tryfirst=True)  # before -m deselects them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    target = os.environ.get("HANDOFF_SERIAL_FILES")
    # one writer: the only process, or the first xdist worker (all collect the same items)
    if not target or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    files = sorted({item.nodeid.split("::")[0] for item in items
                    if any(item.get_closest_marker(m) for m in SECOND_PASS_MARKS)})
    Path(target).write_text("".join(f"{f}\n" for f in files))
