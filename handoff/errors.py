"""The exceptions handoff raises on purpose.

Every message says what went wrong AND what to type to fix it: the tasks print
`str(exc)` and exit non-zero, so the message is the whole user interface of a
failure. None of them ever carries the API key (callers pass fingerprints only,
and the console redacts anyway).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`; did you mean 'x'?` for the closest known name (difflib), else "": a misspelt
    name is usually one or two letters off, and the fix is then the whole message."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class HandoffError(Exception):
    """Base class: an expected failure with a user-facing message."""

    exit_code = 1


class UsageError(HandoffError):
    """Bad flags or arguments (exit code 2, like the payload's bad usage)."""

    exit_code = 2


class InventoryError(HandoffError):
    """The inventory file is malformed, or names something that does not exist."""

    exit_code = 2


class RoleError(HandoffError):
    """A role file is malformed or unknown."""

    exit_code = 2


class TargetError(HandoffError):
    """`--host` (or the saved targets) cannot be resolved to a host."""

    exit_code = 2


class ConnectError(HandoffError):
    """The host could not be reached or refused our login."""


class HostKeyError(ConnectError):
    """The host's key is not one we trust. Nothing was sent to the host."""


class UnknownHostKey(HostKeyError):
    """No trusted key for the host matches the one it offered, and none of that type is
    known (a key of another type may be: the message says which)."""

    def __init__(self, host: str, hostname: str, key_type: str, fingerprint: str,
                 hint: str | None = None, other_types: list[str] | tuple[str, ...] = (),
                 note: str = "") -> None:
        self.host = host
        self.hostname = hostname
        self.fingerprint = fingerprint
        hint = hint or f"fab trust-host --host {host}"
        known = ""
        if other_types:
            known = (f" (only {', '.join(other_types)} keys are known for it: the host no "
                     f"longer offers that type, or was rebuilt)")
        if note:
            known += f" ({note})"
        super().__init__(
            f"{host}: unknown host key for {hostname} ({key_type} {fingerprint}){known}; "
            f"refusing to connect. If that fingerprint is right (compare it with `ssh-keygen "
            f"-lf /etc/ssh/ssh_host_*_key.pub` on the host), pin it with: {hint}"
        )


class ChangedHostKey(HostKeyError):
    """Keys of the offered type are known for the host and none of them (nor any other
    known key) is the one it offered."""

    def __init__(self, host: str, hostname: str, expected: list[tuple[str, str, str]],
                 got: tuple[str, str], hint: str | None = None) -> None:
        self.host = host
        self.hostname = hostname
        self.expected = [fp for _, fp, _ in expected]
        self.got = got[1]
        hint = hint or f"fab trust-host --host {host}"
        known = ", ".join(f"{kind} {fp} ({where})" for kind, fp, where in expected)
        super().__init__(
            f"{host}: HOST KEY CHANGED for {hostname}! expected {known}; the host offered "
            f"{got[0]} {got[1]}. Someone may be intercepting the connection, or the host was "
            f"rebuilt. Refusing to connect. If the change is legitimate, check the new "
            f"fingerprint on the host and replace the pin with: {hint} --replace"
        )


class RevokedHostKey(HostKeyError):
    """The host offered a key (or a certificate by a CA) that a `@revoked` line names."""

    def __init__(self, host: str, hostname: str, what: str, where: str) -> None:
        self.host = host
        self.hostname = hostname
        super().__init__(
            f"{host}: the host key of {hostname} is REVOKED ({what}, marked @revoked in "
            f"{where}); refusing to connect. A revoked key is never accepted: the host must "
            f"get a new key, then pin that one"
        )


class SecretError(HandoffError):
    """The API key cannot be read from the keyring, or placed / removed safely."""


class KeyringEntryMissing(SecretError):
    def __init__(self, service: str, username: str) -> None:
        super().__init__(
            f"no API key in the OS keyring for service {service!r}, username {username!r}. "
            f"Store it with `keyring set {service} {username}` (or `fab set-key`), "
            f"then run this again."
        )


class NoKeyringBackend(SecretError):
    def __init__(self, service: str, username: str, detail: str) -> None:
        super().__init__(
            f"the OS keyring is unreachable ({detail}): this says nothing about whether a key "
            f"is stored. Start and unlock a Secret Service (gnome-keyring, KeePassXC) in this "
            f"session's D-Bus, then rerun; to store the key: `keyring set {service} "
            f"{username}` (or `fab set-key`)."
        )


class PlaintextKeyring(SecretError):
    """keyring resolved to a backend that keeps secrets in a plaintext file."""

    def __init__(self, backend: str, file: str, why: str) -> None:
        super().__init__(
            f"the OS keyring here is {backend}, which keeps keys in plaintext (base64) in "
            f"{file}: {why}. handoff does not read or store a key there. Start and unlock a "
            f"Secret Service (gnome-keyring, KeePassXC) in a D-Bus session "
            f"(DBUS_SESSION_BUS_ADDRESS), then rerun; or, to accept a plaintext file "
            f"knowingly, set HANDOFF_ALLOW_PLAINTEXT_KEYRING=1."
        )


class RemoteError(HandoffError):
    """A command or transfer on the host failed; the message names host and step."""


class NotDeployed(RemoteError):
    """The host lacks the release or the key a task needs."""


class ManagementKeyMissing(SecretError):
    """A child key is to be minted, read, limited or revoked, but the keyring holds no
    management key."""

    def __init__(self, service: str, username: str,
                 why: str = "mint child keys (key_mode minted)") -> None:
        super().__init__(
            f"no management key in the OS keyring (service {service!r}, username "
            f"{username!r}), needed to {why}. Store your OpenRouter management key with "
            f"`fab set-key --username {username}`; to place the API key itself instead, set "
            f"key_mode: plain."
        )


# --- the management API (handoff.ops.keyapi) ------------------------------------------------------


class KeyAPIError(SecretError):
    """OpenRouter's key-management API did not do what was asked. Never carries a key: the
    messages name the key's keyring entry, and whatever the server said passes redaction."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ManagementKeyRefused(KeyAPIError):
    """401: the management key is wrong, revoked or expired."""


class NotAManagementKey(KeyAPIError):
    """403: the stored key is a plain API key, or lacks the right."""


class KeyAPIRateLimited(KeyAPIError):
    """429: too many management calls; waiting fixes it."""


class KeyAPIUnreachable(KeyAPIError):
    """No answer at all: DNS, refused connection, timeout, TLS."""


class KeyAPIFailed(KeyAPIError):
    """Any other failure: a 4xx we did not expect, a 5xx, an answer not in the spec's shape."""


# --- Ctrl-C ---------------------------------------------------------------------------------------


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with a message saying what it means: per host what was done, not done, or not
    known (and how to find out), and what to run next. Never "rerun the command" where a
    rerun would answer "already running": the command that knows what it did says."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
