"""The API key: read from the OS keyring, placed 0600 from creation, removed on cleanup.

Placement over SFTP, never via a command line or `env=`:
1. the key's folder is created / forced to 0700;
2. a temp name in that folder is opened with O_CREAT|O_EXCL and mode 0600 given IN
   the open request itself, so the file is 0600 from the instant it exists (an
   fchmod 0600 follows in case a server ignored the attrs; no byte is written yet);
3. the key is written, flushed and fsync'ed (`fsync@openssh.com`);
4. the temp name is renamed over the final path (`posix-rename@openssh.com`);
5. `stat` checks mode 0600 and owner = the login user; anything else is removed and
   reported.
Idempotence is checked on the host: the probe returns the sha256 of the remote file,
compared with the local key's sha256; the key itself never travels for that.
The ledger records host, path, time and the first 8 hex of sha256(key).
"""

from __future__ import annotations

import hashlib
import secrets as pysecrets
import stat
import sys
import threading
import time
from concurrent.futures import Future
from types import ModuleType

import paramiko
from paramiko.sftp import (
    CMD_EXTENDED,
    CMD_HANDLE,
    CMD_OPEN,
    SFTP_FLAG_CREATE,
    SFTP_FLAG_EXCL,
    SFTP_FLAG_WRITE,
)

from handoff import state
from handoff.errors import KeyringEntryMissing, NoKeyringBackend, RemoteError, SecretError
from handoff.plan import Skipped
from handoff.releases import mkdirs
from handoff.remote import Session
from handoff.verify import Facts
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


def read_key(service: str = "openrouter", username: str = "api-key") -> str:
    """The key from the OS keyring, registered for redaction before anything else."""
    keyring = _keyring()
    try:
        value = keyring.get_password(service, username)
    except keyring.errors.NoKeyringError as exc:
        raise NoKeyringBackend(service, username, str(exc).split(".")[0] or "none found") from None
    except keyring.errors.KeyringError as exc:
        raise NoKeyringBackend(service, username, f"{type(exc).__name__}: {exc}") from None
    if not value or not value.strip():
        raise KeyringEntryMissing(service, username)
    key = value.strip()
    REDACTOR.add(key)
    return key


def read_key_soon(service: str = "openrouter", username: str = "api-key") -> Future[str]:
    """`read_key` on a thread: keyring's backend discovery and the Secret Service round trip
    (0.1-0.3 s) then overlap the SSH connections and probes, and only the first step that
    changes a host waits for it.

    A daemon thread rather than an executor: a keyring that hangs (a locked collection
    waiting for an unlock prompt) must not keep the process alive after Ctrl-C.
    """
    future: Future[str] = Future()
    future.set_running_or_notify_cancel()

    def work() -> None:
        try:
            future.set_result(read_key(service, username))
        except BaseException as exc:  # delivered to whoever waits on the future
            future.set_exception(exc)

    threading.Thread(target=work, name="keyring-read", daemon=True).start()
    return future


def store_key(key: str, service: str = "openrouter", username: str = "api-key") -> None:
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


def key_path(session: Session) -> str:
    return session.abs(str(session.vars["key_path"]))


def _open_private(sftp: paramiko.SFTPClient, path: str) -> paramiko.SFTPFile:
    """Exclusive create with mode 0600 set in the OPEN request (not a chmod afterwards).

    paramiko's `open()` sends empty attrs, so the server would create the file with
    0666 & ~umask first; this sends the permissions with the create.
    """
    attrs = paramiko.SFTPAttributes()
    attrs.st_mode = 0o600
    t, msg = sftp._request(CMD_OPEN, path, SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_EXCL, attrs)
    if t != CMD_HANDLE:
        raise SecretError("SFTP server did not return a file handle")
    return paramiko.SFTPFile(sftp, msg.get_binary(), "wb")


def _fsync(sftp: paramiko.SFTPClient, f: paramiko.SFTPFile) -> None:
    try:
        sftp._request(CMD_EXTENDED, "fsync@openssh.com", f.handle)
    except (OSError, paramiko.SFTPError):
        pass  # a server without the extension: rename still gives atomicity, not durability


def ledger_entry(session: Session, path: str, fp: str, event: str) -> state.LedgerEntry:
    ep = session.target.endpoint
    return state.LedgerEntry(
        host=session.label, hostname=ep.hostname, port=ep.port, user=ep.user,
        identity=list(ep.identity), path=path, fingerprint=fp, time=time.time(), event=event,
    )


def _in_ledger(entry: state.LedgerEntry) -> bool:
    return any(e.slot == entry.slot and e.fingerprint == entry.fingerprint for e in state.placed())


def place(session: Session, facts: Facts, key: str) -> str:
    """Place `key` at the host's key_path unless the same key is already there."""
    path = key_path(session)
    fp = fingerprint(key)
    remote = facts.file("key")
    entry = ledger_entry(session, path, fp, "placed")
    if (
        remote.get("exists")
        and remote.get("sha256") == sha256(key)
        and remote.get("mode") == 0o600
        and remote.get("uid") == facts.uid
    ):
        if not _in_ledger(entry):
            state.record(entry)
        return Skipped(f"key {fp} already at {path} (0600), nothing written")
    folder, name = path.rsplit("/", 1)
    sftp = session.sftp
    tmp = f"{folder}/.{name}.tmp-{pysecrets.token_hex(6)}"
    created = False
    try:
        mkdirs(sftp, folder, 0o700, known=facts.dirs)
        sftp.chmod(folder, 0o700)  # also when it existed: the folder is private either way
        f = _open_private(sftp, tmp)
        created = True
        try:
            f.chmod(0o600)  # no-op normally; guards against a server that ignored the attrs
            f.write(key.encode("utf-8"))
            f.flush()
            _fsync(sftp, f)
        finally:
            f.close()
        sftp.posix_rename(tmp, path)
        created = False
        st = sftp.stat(path)
    except OSError as exc:
        raise RemoteError(f"{session.label}: placing the key at {path} failed: {exc}") from None
    finally:
        if created:
            try:
                sftp.remove(tmp)
            except OSError:
                pass
    mode = stat.S_IMODE(st.st_mode or 0)
    if mode != 0o600 or st.st_uid != facts.uid:
        try:
            sftp.remove(path)
        except OSError:
            pass
        raise RemoteError(
            f"{session.label}: {path} came out with mode {mode:o} owner uid {st.st_uid} "
            f"(want 600, uid {facts.uid}); removed it. Check the folder's ACLs / filesystem."
        )
    state.record(entry)
    return f"placed key {fp} at {path} (0600, uid {st.st_uid})"


def remove(session: Session, path: str, fp: str) -> str:
    """Delete the key file (and any temp leftovers), then prove it is gone."""
    sftp = session.sftp
    folder, name = path.rsplit("/", 1)
    removed = False
    try:
        sftp.remove(path)
        removed = True
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise RemoteError(f"{session.label}: cannot remove {path}: {exc}") from None
    try:
        for leftover in sftp.listdir(folder):
            if leftover.startswith(f".{name}.tmp-"):
                sftp.remove(f"{folder}/{leftover}")
                removed = True
    except FileNotFoundError:
        pass
    try:
        sftp.stat(path)
    except FileNotFoundError:
        state.record(ledger_entry(session, path, fp, "removed"))
        return f"removed {path}, verified gone" if removed else f"{path} already absent"
    raise RemoteError(f"{session.label}: {path} still exists after removal")
