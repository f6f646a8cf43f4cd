"""known_hosts files as OpenSSH reads and writes them: the lines (`Entry`, `parse_line`),
the files (`read_file`, cached per process until a file changes; `trusted_files`, in the
order they are trusted) and pinning a key (`pin`, the only writer).

Files are read the way OpenSSH reads them:

- host patterns with `*`/`?` wildcards and `!` negation, `[host]:port` for other ports,
  hashed names (`|1|salt|hash`, as `HashKnownHosts yes` writes them);
- `@revoked` and `@cert-authority` markers kept on the line (what they mean for a host is
  handoff.ssh.hostkeys's);
- a line that cannot be parsed (truncated, unknown marker, a key ssh could not use) is
  skipped with one warning per file, as ssh skips it; it never breaks the other lines.

`pin()` (trust-host, after confirmation) writes into the pinned file in the state dir, or,
with `trust-host --known-hosts`, into the user's known_hosts where plain `ssh` finds it too.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

from handoff import console
from handoff.config import state
from payload import atomic

REVOKED = "@revoked"


CA = "@cert-authority"


CERT_SUFFIX = "-cert-v01@openssh.com"


def fingerprint(key: paramiko.PKey | bytes) -> str:
    """OpenSSH's `SHA256:…` form (base64 without padding), as `ssh-keygen -l` prints it."""
    blob = key if isinstance(key, bytes) else key.asbytes()
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def default_known_hosts() -> Path:
    return Path(os.path.expanduser("~/.ssh/known_hosts"))


def plain_type(key_type: str) -> str:
    """`ssh-ed25519-cert-v01@openssh.com` -> `ssh-ed25519`; rsa-sha2-* -> ssh-rsa."""
    base = key_type[: -len(CERT_SUFFIX)] if key_type.endswith(CERT_SUFFIX) else key_type
    return "ssh-rsa" if base.startswith("rsa-sha2-") else base


@dataclass(frozen=True)
class Entry:
    """One usable known_hosts line."""

    marker: str  # "", REVOKED or CA
    patterns: tuple[str, ...]  # host patterns, or one hashed `|1|salt|hash`
    key_type: str
    blob: bytes
    where: str  # file:line, for messages

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.blob)

    def matches(self, names: Sequence[str]) -> bool:
        """OpenSSH's rule: some name matches a positive pattern and none a negated one."""
        if len(self.patterns) == 1 and self.patterns[0].startswith("|1|"):
            return any(_hashed_match(self.patterns[0], n) for n in names)
        hit = False
        for pattern in self.patterns:
            negated = pattern.startswith("!")
            pat = pattern[1:] if negated else pattern
            if any(wildcard_match(n, pat) for n in names):
                if negated:
                    return False
                hit = True
        return hit


def wildcard_match(name: str, pattern: str) -> bool:
    """OpenSSH's match_pattern: `*` and `?` only (a `[` is literal, as in `[host]:port`),
    case-insensitive."""
    return _wildcard_regex(pattern).fullmatch(name) is not None


@functools.lru_cache(maxsize=4096)
def _wildcard_regex(pattern: str) -> re.Pattern[str]:
    """Built once per pattern: every connection matches its names against every
    known_hosts line, and building the regex (re.escape per character) was most of that
    (~2 ms of CPU per connection with 32 lines)."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(regex, re.IGNORECASE | re.DOTALL)


def _hashed_match(field: str, name: str) -> bool:
    try:
        _, _, salt_b64, hash_b64 = field.split("|", 3)
        salt, want = base64.b64decode(salt_b64, validate=True), base64.b64decode(hash_b64, validate=True)
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)


def _parse_key(key_type: str, b64: str) -> bytes:
    """The key blob, or ValueError when ssh could not use it either (bad base64, a blob of
    another type, truncated key material)."""
    blob = base64.b64decode(b64, validate=True)
    inner = paramiko.Message(blob).get_text()
    if inner != key_type:
        raise ValueError(f"key type {key_type} but the key says {inner!r}")
    try:
        paramiko.PKey.from_type_string(key_type, blob)
    except paramiko.UnknownKeyType:
        pass  # a type paramiko cannot use (e.g. sk-*): valid for ssh, matches nothing here
    return blob


def parse_line(line: str, where: str) -> Entry | None:
    """An Entry; None for a blank or comment line; ValueError for a line ssh would skip."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    fields = text.split()
    marker = ""
    if fields[0].startswith("@"):
        marker = fields.pop(0)
        if marker not in (REVOKED, CA):
            raise ValueError(f"unknown marker {marker}")
    if len(fields) < 3:
        raise ValueError("too few fields")
    patterns = tuple(p for p in fields[0].split(",") if p)
    if not patterns:
        raise ValueError("no host pattern")
    try:
        blob = _parse_key(fields[1], fields[2])
    except (ValueError, binascii.Error, paramiko.SSHException, IndexError, TypeError) as exc:
        raise ValueError(f"unusable {fields[1]} key ({exc or type(exc).__name__})") from None
    return Entry(marker, patterns, fields[1], blob, where)


_cache_lock = threading.Lock()


_cache: dict[str, tuple[tuple[int, int], list[Entry]]] = {}


_warned: set[str] = set()


def read_file(path: Path) -> list[Entry]:
    """The usable lines of one file (cached per process until the file changes); the
    unusable ones are reported once per file, as a warning."""
    try:
        st = path.stat()
    except OSError:
        return []
    stamp = (st.st_mtime_ns, st.st_size)
    with _cache_lock:
        cached = _cache.get(str(path))
        if cached and cached[0] == stamp:
            return cached[1]
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []  # an unreadable file trusts nothing; never fatal, never written
    entries: list[Entry] = []
    skipped: list[str] = []
    for number, line in enumerate(lines, 1):
        try:
            entry = parse_line(line, f"{path}:{number}")
        except ValueError as exc:
            skipped.append(f"line {number}: {exc}")
            continue
        if entry is not None:
            entries.append(entry)
    with _cache_lock:
        _cache[str(path)] = (stamp, entries)
        first_time = str(path) not in _warned
        _warned.add(str(path))
    if skipped and first_time:
        shown = "; ".join(skipped[:3]) + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        console.warn(f"{path}: skipped {len(skipped)} line(s) that ssh cannot use either ({shown})")
    return entries


def trusted_files(user_files: Iterable[str] = (), global_files: Iterable[str] = ()) -> list[Path]:
    """The pinned file first (a deliberate re-pin wins), then ssh's user and global files."""
    files = [state.pinned_keys_path()]
    files += [Path(os.path.expanduser(p)) for p in user_files]
    files += [Path(os.path.expanduser(p)) for p in global_files]
    return list(dict.fromkeys(files))


def names_for(hostname: str, port: int, alias: str | None = None) -> tuple[str, ...]:
    """The known_hosts names ssh checks: HostKeyAlias if set, else the host (with
    `[host]:port` for another port than 22)."""
    return (known_hosts_name(alias or hostname, port),)


def pin(hostname: str, port: int, key: paramiko.PKey, name: str | None = None,
        path: Path | None = None) -> Path:
    """Replace every key pinned for this host with `key` (only after the user confirmed):
    a key replaced because it was compromised must not stay trusted under another type.
    `path`: a known_hosts file of the user's (trust-host --known-hosts), else the state
    dir's pinned file. In a user's file only the lines naming exactly this host change
    (a line naming other hosts too keeps them; wildcards, @revoked and @cert-authority
    lines stay as the user wrote them); its mode is kept (0600 when new, in a 0700 ~/.ssh)."""
    name = name or known_hosts_name(hostname, port)
    target = path or state.pinned_keys_path()
    lines: list[str] = []
    if target.is_file():
        for line in target.read_text(encoding="utf-8").splitlines():
            fields = line.split()
            if not fields or fields[0].startswith(("#", "@")):
                lines.append(line)
                continue
            names = fields[0].split(",")
            if len(names) == 1 and names[0].startswith("|1|"):
                if not _hashed_match(names[0], name):
                    lines.append(line)
                continue
            if name not in names:
                lines.append(line)
            elif len(names) > 1:
                lines.append(" ".join([",".join(n for n in names if n != name), *fields[1:]]))
    lines.append(f"{name} {key.get_name()} {key.get_base64()}")
    text = "\n".join(lines) + "\n"
    if path is None:
        state.write_pinned(text)
        return target
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = target.stat().st_mode & 0o777 if target.exists() else 0o600
    atomic.write_text(target, text, mode=mode)
    return target


def user_known_hosts(files: Iterable[str] = ()) -> Path:
    """The known_hosts file ssh adds keys to: the first UserKnownHostsFile, else
    ~/.ssh/known_hosts."""
    first = next(iter(files), None)
    return Path(os.path.expanduser(first)) if first else default_known_hosts()
