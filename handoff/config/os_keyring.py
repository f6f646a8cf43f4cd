"""The OS keyring: the API key and the management key are read here, and registered for
redaction the moment they are read (payload.redact), so no later message can show them.

Two entries matter: the API key (`openrouter/api-key`) and, optionally, a management key
(`openrouter/management-key`) that never leaves the workstation. Only fingerprints (8 hex of
sha256) of a key are ever shown or recorded.
"""

from __future__ import annotations

import hashlib
import sys
from concurrent.futures import Future
from types import ModuleType

from handoff.defaults import (
    API_KEY_USERNAME,
    SECRET_SERVICE,
)
from handoff.errors import (
    KeyringEntryMissing,
    NoKeyringBackend,
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


def read_optional(service: str, username: str) -> str | None:
    """A keyring entry, registered for redaction before anything else; None when absent."""
    keyring = _keyring()
    try:
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


def store_key(key: str, service: str = SECRET_SERVICE, username: str = API_KEY_USERNAME) -> None:
    keyring = _keyring()
    REDACTOR.add(key)
    try:
        keyring.set_password(service, username, key)
    except keyring.errors.NoKeyringError as exc:
        raise NoKeyringBackend(service, username, str(exc).split(".")[0]) from None


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def fingerprint(key: str) -> str:
    """What the ledger and the output show: 8 hex of sha256, useless for recovering the key."""
    return sha256(key)[:8]


__all__ = ["fingerprint", "read_key", "read_key_soon", "read_optional", "sha256", "store_key"]
