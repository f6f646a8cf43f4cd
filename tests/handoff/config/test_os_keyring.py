"""The keyring side of the secret: clear messages naming the fix, redaction from the first read."""

from __future__ import annotations

import os
import secrets as pysecrets
import subprocess
import sys
from pathlib import Path

import keyring
import keyring.errors
import pytest

from handoff.config import os_keyring
from handoff.errors import KeyringEntryMissing, NoKeyringBackend
from payload.redact import REDACTOR
from tests.support.workstation import MemoryKeyring


def test_missing_entry_names_the_commands(memory: MemoryKeyring) -> None:
    with pytest.raises(KeyringEntryMissing) as exc:
        os_keyring.read_key("openrouter", "api-key")
    assert "keyring set openrouter api-key" in str(exc.value) and "fab set-key" in str(exc.value)


def test_no_backend_names_the_fix() -> None:
    from keyring.backends import fail

    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        with pytest.raises(NoKeyringBackend) as exc:
            os_keyring.read_key("svc", "user")
    finally:
        keyring.set_keyring(previous)
    assert "keyring set svc user" in str(exc.value) and "fab set-key" in str(exc.value)


def test_read_strips_registers_for_redaction_and_fingerprints(memory: MemoryKeyring) -> None:
    key = "sk-or-v1-" + pysecrets.token_hex(32)
    os_keyring.store_key(key)
    memory.store[("openrouter", "api-key")] = f"  {key}\n"
    assert os_keyring.read_key() == key
    assert key not in REDACTOR.redact(f"x {key} y")
    fp = os_keyring.fingerprint(key)
    assert len(fp) == 8 and fp == os_keyring.sha256(key)[:8] and fp not in key


def test_read_key_soon_delivers_the_key_or_the_error(memory: MemoryKeyring) -> None:
    """The threaded read gives the same key (redaction registered) or the same clear error."""
    missing = os_keyring.read_key_soon("openrouter", "api-key")
    with pytest.raises(KeyringEntryMissing):
        missing.result(timeout=10)
    key = "sk-or-v1-" + pysecrets.token_hex(32)
    memory.store[("openrouter", "api-key")] = key
    assert os_keyring.read_key_soon().result(timeout=10) == key
    assert key not in REDACTOR.redact(key)


def test_backend_discovery_off_macos_skips_the_macos_api_but_picks_the_same_backend(
        tmp_path: Path) -> None:
    """In fresh interpreters (keyring picks its backend once per process), with no keyringrc
    and no PYTHON_KEYRING_BACKEND so keyring ranks every backend by priority: through handoff
    the macOS backend's api module (its find_library spawns ldconfig/gcc) is never imported,
    and the backend chosen is the one plain keyring chooses."""
    if sys.platform == "darwin":
        pytest.skip("the guard applies off macOS only")
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_KEYRING_BACKEND"}
    env["XDG_CONFIG_HOME"] = str(tmp_path)  # no keyringrc.cfg there
    name = "type(k).__module__ + '.' + type(k).__name__"
    via_handoff = ("import sys; from handoff.config import os_keyring; k = os_keyring._keyring().get_keyring(); "
                   f"print({name}, sys.modules.get('keyring.backends.macOS.api', 'absent'))")
    plain = f"import keyring; k = keyring.get_keyring(); print({name})"
    out = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.split() for code in (via_handoff, plain)]
    assert out[0] == [out[1][0], "None"], out
