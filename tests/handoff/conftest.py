"""Fixtures for the tests of handoff's packages: a workstation with fake hosts (`ws`), the
fake OpenRouter with its management API (`keyed_api`), a keyring in memory (`memory`).
The helpers they build on are in tests/support/workstation.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import keyring
import pytest

from handoff import console
from handoff.cli import commands
from handoff.config import paths
from tests.support.workstation import (
    BATCH_ROLE,
    DEAD_API,
    SLEEPER_ROLE,
    KeyedAPI,
    MemoryKeyring,
    Workstation,
)


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workstation]:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(tmp_path / "state"))
    project = tmp_path / "project"
    (project / "roles").mkdir(parents=True)
    (project / "roles" / "sleeper.yml").write_text(SLEEPER_ROLE)
    (project / "roles" / "batch.yml").write_text(BATCH_ROLE)
    inventory = project / "inventory" / "hosts.yml"
    inventory.parent.mkdir()
    inventory.write_text(
        # A short start watch: a launch's check then waits 0.1 s, not 1 s; the tests of what
        # the watch catches set it back to the default.
        f"defaults: {{python: {sys.executable}, base_url: '{DEAD_API}', start_watch_s: 0.1}}\n"
        "hosts:\n"
        "  a: {address: 127.0.0.2, port: 2201, user: u1, roles: [generator]}\n"
        "  b: {address: 127.0.0.3, port: 2202, user: u2, roles: [generator]}\n"
        "  s: {address: 127.0.0.4, port: 2203, user: u3, roles: [sleeper]}\n"
        "  t: {address: 127.0.0.5, port: 2204, user: u4, roles: [sleeper]}\n"
    )
    monkeypatch.delenv("HANDOFF_INVENTORY", raising=False)
    monkeypatch.setattr(paths, "_project", project)
    station = Workstation(tmp_path)
    monkeypatch.setattr(commands.common, "CONNECT", station.connect)
    console._console = None  # fresh consoles bound to the captured stdout/stderr
    console._err_console = None
    monkeypatch.setenv("COLUMNS", "300")  # one line per table row: nothing wrapped mid-phrase
    yield station
    console._console = None
    console._err_console = None
    station.kill_jobs()


@pytest.fixture
def keyed_api() -> Iterator[KeyedAPI]:
    import secrets as pysecrets

    from handoff.testing.fakeapi import FakeOpenRouter

    api_key = "sk-or-v1-" + pysecrets.token_hex(32)
    management = "sk-or-v1-" + pysecrets.token_hex(32)
    fake = FakeOpenRouter(api_key=api_key)
    fake.keys.enable(management)
    fake.start_in_thread()
    try:
        yield KeyedAPI(fake, api_key, management)
    finally:
        fake.stop_thread()


@pytest.fixture
def memory() -> Iterator[MemoryKeyring]:
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)
