"""The keyring side of the secret: clear messages naming the fix, redaction from the first read."""

from __future__ import annotations

import secrets as pysecrets
from collections.abc import Iterator

import keyring
import keyring.backend
import keyring.errors
import pytest

from handoff import secrets
from handoff.errors import KeyringEntryMissing, NoKeyringBackend
from payload.redact import REDACTOR


class MemoryKeyring(keyring.backend.KeyringBackend):
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


@pytest.fixture
def memory() -> Iterator[MemoryKeyring]:
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)


def test_missing_entry_names_the_commands(memory: MemoryKeyring) -> None:
    with pytest.raises(KeyringEntryMissing) as exc:
        secrets.read_key("openrouter", "api-key")
    assert "keyring set openrouter api-key" in str(exc.value) and "fab set-key" in str(exc.value)


def test_no_backend_names_the_fix() -> None:
    from keyring.backends import fail

    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        with pytest.raises(NoKeyringBackend) as exc:
            secrets.read_key("svc", "user")
    finally:
        keyring.set_keyring(previous)
    assert "keyring set svc user" in str(exc.value) and "fab set-key" in str(exc.value)


def test_read_strips_registers_for_redaction_and_fingerprints(memory: MemoryKeyring) -> None:
    key = "sk-or-v1-" + pysecrets.token_hex(32)
    secrets.store_key(key)
    memory.store[("openrouter", "api-key")] = f"  {key}\n"
    assert secrets.read_key() == key
    assert key not in REDACTOR.redact(f"x {key} y")
    fp = secrets.fingerprint(key)
    assert len(fp) == 8 and fp == secrets.sha256(key)[:8] and fp not in key
