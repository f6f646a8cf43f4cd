"""Host key checking that refuses, instead of Fabric's accept-anything default.

Trusted keys come from, in lookup order: the keys pinned by `fab trust-host` (state
dir), the ssh_config `UserKnownHostsFile`s, and `~/.ssh/known_hosts`. Pinned keys
come first so a deliberate re-pin after a legitimate key rotation wins over a stale
known_hosts line.

The check runs inside paramiko's handshake, after key exchange and before any
authentication: an unknown key makes the policy raise, a changed key makes paramiko
raise BadHostKeyException, and in both cases no credential, command or byte of the
secret has been sent. Nothing is ever written to a known_hosts file here; only
`pin()` (called by trust-host after confirmation) writes the pinned file.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import paramiko

from handoff import state
from handoff.errors import UnknownHostKey


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's `SHA256:…` form (base64 without padding), as `ssh-keygen -l` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def default_known_hosts() -> Path:
    return Path(os.path.expanduser("~/.ssh/known_hosts"))


def trusted_files(extra: Iterable[str] = ()) -> list[Path]:
    files = [state.pinned_keys_path()]
    files += [Path(os.path.expanduser(p)) for p in extra]
    files.append(default_known_hosts())
    seen: list[Path] = []
    for f in files:
        if f not in seen:
            seen.append(f)
    return seen


def load_trusted(extra: Iterable[str] = (), into: paramiko.HostKeys | None = None) -> paramiko.HostKeys:
    """All trusted keys in one HostKeys (never given a filename, so never saved)."""
    keys = paramiko.HostKeys() if into is None else into
    for path in trusted_files(extra):
        if path.is_file():
            try:
                keys.load(str(path))
            except (OSError, UnicodeDecodeError):
                continue  # an unreadable file trusts nothing; never fatal, never written
    return keys


class RefuseUnknownPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse any host whose key is not already trusted, naming the fix."""

    def __init__(self, label: str) -> None:
        self.label = label

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise UnknownHostKey(self.label, hostname, key.get_name(), fingerprint(key))


def install(client: paramiko.SSHClient, label: str, extra: Iterable[str] = ()) -> None:
    """Make `client` check host keys like OpenSSH with StrictHostKeyChecking=yes."""
    client.set_missing_host_key_policy(RefuseUnknownPolicy(label))
    # get_host_keys() is the client's own (not the "system") set; loading into it does not
    # give the client a filename, so save_host_keys() could not write it even if called.
    trusted = client.get_host_keys()
    trusted.clear()
    load_trusted(extra, into=trusted)


def lookup(hostname: str, port: int, extra: Iterable[str] = ()) -> list[paramiko.PKey]:
    entry = load_trusted(extra).lookup(known_hosts_name(hostname, port))
    return list(entry.values()) if entry else []


def pin(hostname: str, port: int, key: paramiko.PKey) -> Path:
    """Replace any pinned key for this host with `key` (only after the user confirmed)."""
    name = known_hosts_name(hostname, port)
    path = state.pinned_keys_path()
    lines: list[str] = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            fields = line.split()
            if fields and name in fields[0].split(","):
                continue
            lines.append(line)
    lines.append(f"{name} {key.get_name()} {key.get_base64()}")
    state.write_pinned("\n".join(lines) + "\n")
    return path
