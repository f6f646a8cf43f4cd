"""The OS keyring: the API key and the management key are read here, and registered for
redaction the moment they are read (payload.redact), so no later message can show them.

Two entries matter: the API key (`openrouter/api-key`) and, optionally, a management key
(`openrouter/management-key`) that never leaves the workstation. Only fingerprints (8 hex of
sha256) of a key are ever shown or recorded.

A keyring that resolves to a plaintext file (keyrings.alt's PlaintextKeyring: what the
keyring library falls back to without a D-Bus session, on a headless box, over ssh, in tmux)
is refused for every read and write, naming the backend, its file and the fix, unless
HANDOFF_ALLOW_PLAINTEXT_KEYRING=1 accepts it (the sandbox's throwaway file keyring sets it).
"""

from __future__ import annotations

import hashlib
import os
import sys
from concurrent.futures import Future
from types import ModuleType
from typing import Any

from handoff.defaults import (
    API_KEY_USERNAME,
    SECRET_SERVICE,
)
from handoff.errors import (
    KeyringEntryMissing,
    NoKeyringBackend,
    PlaintextKeyring,
)
from handoff.threads import soon
from payload.redact import REDACTOR


def _keyring() -> ModuleType:
    """The keyring module, without its macOS backend's import cost off macOS.

    keyring imports every backend to ask which is viable; the macOS one's `api` module
    calls ctypes.util.find_library at import, which spawns ldconfig/gcc on Linux (about
    0.1 s of every deploy) only for the backend to declare itself unusable there. A None
    in sys.modules makes that import fail at once, which the backend already handles
    ("Security API unavailable"); keyring then picks Secret Service / the file backend
    exactly as before.
    """
    if sys.platform != "darwin":
        sys.modules.setdefault("keyring.backends.macOS.api", None)  # type: ignore[arg-type]
    import keyring
    import keyring.errors

    return keyring


# Set (to 1) to accept a keyring backend that keeps keys in a plaintext file.
PLAINTEXT_OPT_IN = "HANDOFF_ALLOW_PLAINTEXT_KEYRING"


def _plaintext_file(backend: Any) -> str | None:
    """The file a plaintext backend (keyrings.alt's PlaintextKeyring) keeps keys in; None
    for any other backend. keyring resolves to it directly when it is the only viable one
    (no D-Bus session). A chainer is not looked into: its members are recomputed on each
    access (a D-Bus round trip each), and it only forms with a backend of higher priority
    (a Secret Service) first."""
    kind = type(backend)
    if kind.__module__.startswith("keyrings.alt.file") and kind.__name__ == "PlaintextKeyring":
        return str(getattr(backend, "file_path", "") or "its data folder")
    return None


def backend(keyring: ModuleType) -> tuple[str, str | None]:
    """(the backend keyring resolved to, by name; its plaintext file when it is one). A
    plaintext backend is refused (PlaintextKeyring: the backend, the file, the fix) unless
    HANDOFF_ALLOW_PLAINTEXT_KEYRING=1: a key "in the OS keyring" must not sit in a file."""
    found = keyring.get_keyring()
    file = _plaintext_file(found)
    name = f"{type(found).__module__}.{type(found).__qualname__}"
    if file is not None and os.environ.get(PLAINTEXT_OPT_IN) != "1":
        bus = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
        why = ("no Secret Service is reachable: there is no D-Bus session "
               "(DBUS_SESSION_BUS_ADDRESS is unset: a headless box, ssh, tmux?)" if not bus else
               f"no Secret Service answered on the D-Bus session {bus} (the keyring is "
               f"unreachable, so this says nothing about whether a key is stored there)")
        raise PlaintextKeyring(name, file, why)
    return name, file


def read_optional(service: str, username: str) -> str | None:
    """A keyring entry, registered for redaction before anything else; None when absent."""
    keyring = _keyring()
    try:
        backend(keyring)
        value = keyring.get_password(service, username)
    except keyring.errors.NoKeyringError as exc:
        raise NoKeyringBackend(service, username, str(exc).split(".")[0] or "none found") from None
    except keyring.errors.KeyringError as exc:
        raise NoKeyringBackend(service, username, f"{type(exc).__name__}: {exc}") from None
    if not value or not value.strip():
        return None
    key = value.strip()
    REDACTOR.add(key)
    return key


def read_key(service: str = SECRET_SERVICE, username: str = API_KEY_USERNAME) -> str:
    """The key from the OS keyring, registered for redaction before anything else."""
    key = read_optional(service, username)
    if key is None:
        raise KeyringEntryMissing(service, username)
    return key


def read_key_soon(service: str = SECRET_SERVICE, username: str = API_KEY_USERNAME) -> Future[str]:
    """`read_key` on a thread (handoff.threads.soon): keyring's backend discovery and the
    Secret Service round trip (0.1-0.3 s) then overlap the SSH connections and probes, and
    only the first step that changes a host waits for it."""
    return soon(lambda: read_key(service, username), "keyring-read")


def store_key(key: str, service: str = SECRET_SERVICE, username: str = API_KEY_USERNAME) -> str:
    """Store `key`; where it went, for the message (a plaintext file is said as such)."""
    keyring = _keyring()
    REDACTOR.add(key)
    try:
        name, file = backend(keyring)
        keyring.set_password(service, username, key)
    except keyring.errors.NoKeyringError as exc:
        raise NoKeyringBackend(service, username, str(exc).split(".")[0]) from None
    except keyring.errors.KeyringError as exc:
        raise NoKeyringBackend(service, username, f"{type(exc).__name__}: {exc}") from None
    if file is not None:
        return f"a PLAINTEXT file keyring ({name}, {file}; {PLAINTEXT_OPT_IN}=1 accepted it)"
    return f"the OS keyring ({name})"


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def fingerprint(key: str) -> str:
    """What the ledger and the output show: 8 hex of sha256, useless for recovering the key."""
    return sha256(key)[:8]


__all__ = ["PLAINTEXT_OPT_IN", "backend", "fingerprint", "read_key", "read_key_soon", "read_optional",
           "sha256", "store_key"]
