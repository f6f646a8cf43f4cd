"""A workstation and fake hosts for unit tests of per-host logic, without sshd (the fixtures
that set them up, `ws`, `keyed_api` and `memory`, are in tests/handoff/conftest.py).

`ws` (a `Workstation`) isolates HOME, the state dir, the inventory and the project dir in
a temp dir, and points `handoff.cli.commands.common.CONNECT` at `LocalSession`s: each inventory host
is a folder standing for its login user's home, where commands run with the local sh and
remote modules with this python. The project's `roles/` adds two test roles whose job is
tests/support/sleeper.py (runs until SIGTERM, crashes, finishes at once, or answers its shard
of the input): `sleeper` (one job, named by its `job` var) and `batch` (one job per dataset).
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keyring
import keyring.backend

from handoff.config.inventory import load_inventory
from handoff.host.targets import Target, resolve
from handoff.testing.local import LocalSession

SLEEPER = Path(__file__).with_name("sleeper.py")
DEAD_API = "http://127.0.0.1:9/api/v1"  # nothing listens there; no test leaves loopback

SLEEPER_ROLE = f"""\
description: a job that runs until SIGTERM (tests only)
secret: openrouter
vars:
  job: sleeper
  act: run
launch: ["{{python}}", "{SLEEPER}", "{{job_dir}}", "{{input}}", "{{act}}", ["--exclude-ids", "{{exclude_ids}}"]]
"""
# Like sleeper, without a `job` var: one job per dataset, named after the input's stem.
BATCH_ROLE = f"""\
description: one job per dataset (tests only)
secret: openrouter
vars:
  act: answer
launch: ["{{python}}", "{SLEEPER}", "{{job_dir}}", "{{input}}", "{{act}}", ["{{shard}}"]]
"""


@dataclass
class Workstation:
    root: Path

    @property
    def hosts_dir(self) -> Path:
        return self.root / "hosts"

    def home(self, label: str) -> Path:
        return self.hosts_dir / label

    def remote_dir(self, label: str) -> Path:
        return self.home(label) / ".handoff"

    def kill_jobs(self) -> None:
        """End every job a test left running on the fake hosts (a failed assertion must not
        leave processes behind)."""
        from handoff.host.remote_code.jobs import is_alive

        for pid_file in self.hosts_dir.glob("*/.handoff/jobs/*/pid"):
            with contextlib.suppress(ValueError, OSError):
                pid = int(pid_file.read_text())
                if is_alive(pid, str(pid_file.parent)):  # still that job, not a reused pid
                    os.kill(pid, signal.SIGKILL)

    def connect(self, target: Target) -> LocalSession:
        return LocalSession(target, self.home(target.label))

    def targets(self, spec: str | None = "a,b", role: str | None = None,
                flags: dict[str, object] | None = None) -> list[Target]:
        return resolve(spec, load_inventory(), role, flags)


@dataclass
class KeyedAPI:
    """The fake OpenRouter on loopback with its management API on."""

    fake: Any  # handoff.testing.fakeapi.FakeOpenRouter
    api_key: str  # the account's own key (plain mode)
    management_key: str

    @property
    def url(self) -> str:
        return str(self.fake.base_url)

    @property
    def keys(self) -> Any:  # handoff.testing.fakekeys.KeyStore
        return self.fake.keys


class MemoryKeyring(keyring.backend.KeyringBackend):
    """A keyring backend in a dict (set with keyring.set_keyring): what the keyring holds
    is the test's to decide."""

    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.store.pop((service, username), None)


