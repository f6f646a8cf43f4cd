"""Host key checking as OpenSSH does it (StrictHostKeyChecking=yes), never Fabric's
accept-anything default.

Trusted keys come from, in this order: the keys pinned by `fab trust-host` (state dir),
the user known_hosts files ssh would read (`UserKnownHostsFile`, default
`~/.ssh/known_hosts ~/.ssh/known_hosts2`) and the global ones (`GlobalKnownHostsFile`,
default `/etc/ssh/ssh_known_hosts ~2`). Files are read the way OpenSSH reads them:

- host patterns with `*`/`?` wildcards and `!` negation, `[host]:port` for other ports,
  hashed names (`|1|salt|hash`, as `HashKnownHosts yes` writes them);
- `@revoked` lines: that key is refused for the hosts the line names, whatever else says;
- `@cert-authority` lines: a host certificate signed by that CA (right type, principal
  and validity) is accepted; the CA's key is never taken for the host's own key;
- a line that cannot be parsed (truncated, unknown marker) is skipped with one warning
  per file, as ssh skips it; it never breaks the other lines or other hosts.

Which host key the server shows is negotiated (`algorithms`): the types already known
for the host come first, as OpenSSH orders HostKeyAlgorithms, so a host known only by
its RSA key is asked for RSA (rsa-sha2-512/256) and compared with that key. A key is
"CHANGED" only when keys of the offered type are known and none of any type matches;
a host offering a type nobody knew is "unknown" (trust-host can pin it), never CHANGED.

The check runs inside the handshake, after key exchange and before any authentication
(handoff.ssh.connect calls `check` between the two): no credential, command or byte of the
secret reaches a refused host. Nothing here writes a known_hosts file except `pin()`
(trust-host, after confirmation): into the pinned file in the state dir, or, with
`trust-host --known-hosts`, into the user's known_hosts where plain `ssh` finds it too.
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
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from handoff import console
from handoff.config import state
from handoff.errors import ChangedHostKey, HostKeyError, RevokedHostKey, UnknownHostKey
from payload import atomic

REVOKED = "@revoked"
CA = "@cert-authority"
CERT_SUFFIX = "-cert-v01@openssh.com"
HOST_CERT = 2  # SSH2_CERT_TYPE_HOST

# paramiko's host key algorithms in its default preference (OpenSSH's order too).
DEFAULT_ALGORITHMS: tuple[str, ...] = tuple(paramiko.Transport._preferred_keys)
# A known key of type T makes these algorithms show it.
_ALGORITHMS_FOR_TYPE = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}
# Key material fields after the nonce in a certificate, per plain type (PROTOCOL.certkeys).
_CERT_KEY_FIELDS = {"ssh-rsa": 2, "ssh-dss": 4, "ssh-ed25519": 1, "sk-ssh-ed25519@openssh.com": 2,
                    "sk-ecdsa-sha2-nistp256@openssh.com": 3}


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


# --- reading known_hosts files ------------------------------------------------------------------


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


# --- what the files say about one host ----------------------------------------------------------


@dataclass
class Knowledge:
    """The trusted files' lines for one host (its known_hosts names)."""

    names: tuple[str, ...]
    keys: list[Entry] = field(default_factory=list)  # plain host keys
    cas: list[Entry] = field(default_factory=list)  # @cert-authority lines naming it
    revoked: list[Entry] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def known_types(self) -> list[str]:
        return list(dict.fromkeys(e.key_type for e in self.keys))

    def algorithms(self) -> tuple[str, ...]:
        """Host key algorithms in the order to offer them: certificates first when a CA is
        known for the host, then the algorithms of the key types already known (so the host
        shows a key we can compare), then every other one, each group in default order."""
        plain = list(DEFAULT_ALGORITHMS)
        known = {plain_type(t) for t in self.known_types}
        first = [a for a in plain if plain_type(a) in known]
        certs = [a + CERT_SUFFIX for a in plain if a != "ssh-dss"]
        order = (certs if self.cas else []) + first
        order += [a for a in plain if a not in order]
        if not self.cas:
            order += certs  # a certificate without a known CA is checked as its plain key
        return tuple(order)

    def check(self, label: str, hostname: str, key: paramiko.PKey, hint: str) -> str:
        """Accept `key` or raise a HostKeyError; returns how it was trusted (for logs).
        `hint` is the command that pins a key for this host (trust-host)."""
        blob = key.asbytes()
        cert = _certificate_of(key)
        note = ""
        if cert is not None:
            ca_blob = cert.signature_key
            for entry in self.revoked:
                if entry.blob == ca_blob:
                    raise RevokedHostKey(label, hostname, f"certificate authority {fingerprint(ca_blob)}",
                                         entry.where)
            for entry in self.cas:
                if entry.blob == ca_blob:
                    problem = cert.problem(self.host_for_principals())
                    if problem is None:
                        return f"certificate signed by {entry.where}"
                    note = f"its certificate by the CA of {entry.where} is {problem}"
                    break  # OpenSSH falls back to the certificate's plain key
        for entry in self.revoked:
            if entry.blob == blob:
                raise RevokedHostKey(label, hostname, f"{key.get_name()} {fingerprint(blob)}", entry.where)
        for entry in self.keys:
            if entry.blob == blob:
                return entry.where
        offered = plain_type(key.get_name())
        same_type = [e for e in self.keys if plain_type(e.key_type) == offered]
        if same_type:
            raise ChangedHostKey(label, hostname,
                                 [(e.key_type, e.fingerprint, e.where) for e in same_type],
                                 (key.get_name(), fingerprint(blob)), hint)
        raise UnknownHostKey(label, hostname, key.get_name(), fingerprint(blob), hint,
                             other_types=self.known_types, note=note)

    def host_for_principals(self) -> str:
        """The name a host certificate must carry: the host without the `[...]:port` form."""
        name = self.names[-1]
        return name[1:].split("]:", 1)[0] if name.startswith("[") else name


def names_for(hostname: str, port: int, alias: str | None = None) -> tuple[str, ...]:
    """The known_hosts names ssh checks: HostKeyAlias if set, else the host (with
    `[host]:port` for another port than 22)."""
    return (known_hosts_name(alias or hostname, port),)


def knowledge(hostname: str, port: int, user_files: Iterable[str] = (),
              global_files: Iterable[str] = (), alias: str | None = None) -> Knowledge:
    names = names_for(hostname, port, alias)
    if port != 22:
        names = (*names, alias or hostname)  # for a certificate's principals only
    found = Knowledge(names)
    lookup = names[:1]
    for path in trusted_files(user_files, global_files):
        for entry in read_file(path):
            if not entry.matches(lookup):
                continue
            if entry.marker == REVOKED:
                found.revoked.append(entry)
            elif entry.marker == CA:
                found.cas.append(entry)
            else:
                found.keys.append(entry)
    return found


def lookup(hostname: str, port: int, extra: Iterable[str] = ()) -> list[paramiko.PKey]:
    """The plain keys trusted for a host (pinned + `extra` user files + ~/.ssh/known_hosts)."""
    keys = []
    files = [*extra, str(default_known_hosts())]
    for entry in knowledge(hostname, port, files).keys:
        try:
            keys.append(paramiko.PKey.from_type_string(entry.key_type, entry.blob))
        except paramiko.UnknownKeyType:
            continue
    return keys


# --- host certificates --------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificate:
    """The fields of an OpenSSH certificate that decide whether a host may use it."""

    cert_type: int
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    critical: bytes
    signature_key: bytes
    signed: bytes
    signature: bytes

    def problem(self, host: str) -> str | None:
        """Why the certificate does not vouch for `host` (None: it does)."""
        if self.cert_type != HOST_CERT:
            return "not a host certificate"
        now = time.time()
        if not self.valid_after <= now < self.valid_before:
            return "outside its validity period"
        if self.critical:
            return "has critical options"
        if self.principals and not any(wildcard_match(host, p) for p in self.principals):
            return f"not issued for {host}"
        try:
            ca = paramiko.PKey.from_type_string(paramiko.Message(self.signature_key).get_text(),
                                                self.signature_key)
            if not ca.verify_ssh_sig(self.signed, paramiko.Message(self.signature)):
                return "bad signature"
        except (paramiko.SSHException, ValueError, TypeError):
            return "unusable signature"
        return None


def parse_certificate(blob: bytes) -> Certificate:
    msg = paramiko.Message(blob)
    cert_type_name = msg.get_text()
    plain = cert_type_name[: -len(CERT_SUFFIX)]
    fields = _CERT_KEY_FIELDS.get(plain, 2 if plain.startswith("ecdsa-") else None)
    if fields is None:
        raise ValueError(f"unsupported certificate type {cert_type_name}")
    msg.get_binary()  # nonce
    for _ in range(fields):
        msg.get_binary()
    msg.get_int64()  # serial
    kind = msg.get_int()
    msg.get_binary()  # key id
    principals_msg = paramiko.Message(msg.get_binary())
    principals = []
    while principals_msg.get_remainder():
        principals.append(principals_msg.get_text())
    valid_after, valid_before = msg.get_int64(), msg.get_int64()
    critical = msg.get_binary()
    msg.get_binary()  # extensions
    msg.get_binary()  # reserved
    signature_key = msg.get_binary()
    signed = msg.get_so_far()
    return Certificate(kind, tuple(principals), valid_after, valid_before, critical,
                       signature_key, signed, msg.get_binary())


def _certificate_of(key: paramiko.PKey) -> Certificate | None:
    blob = getattr(key, "public_blob", None)
    if blob is None or not str(blob.key_type).endswith(CERT_SUFFIX):
        return None
    try:
        return parse_certificate(bytes(blob.key_blob))
    except (ValueError, paramiko.SSHException, IndexError, TypeError):
        return None


def offered_name(key: paramiko.PKey) -> str:
    """The offered key's type as users know it (a certificate says so)."""
    blob = getattr(key, "public_blob", None)
    return str(blob.key_type) if blob is not None else key.get_name()


# --- pinning (trust-host) -------------------------------------------------------------------------


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


__all__ = ["CA", "REVOKED", "Certificate", "Entry", "HostKeyError", "Knowledge", "fingerprint",
           "knowledge", "known_hosts_name", "lookup", "names_for", "offered_name",
           "parse_certificate", "parse_line", "pin", "plain_type", "read_file", "trusted_files",
           "user_known_hosts"]
