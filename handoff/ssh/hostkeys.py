"""Host key checking as OpenSSH does it (StrictHostKeyChecking=yes), never Fabric's
accept-anything default.

Trusted keys come from, in this order: the keys pinned by `fab trust-host` (state dir),
the user known_hosts files ssh would read (`UserKnownHostsFile`, default
`~/.ssh/known_hosts ~/.ssh/known_hosts2`) and the global ones (`GlobalKnownHostsFile`,
default `/etc/ssh/ssh_known_hosts ~2`), read as OpenSSH reads them
(handoff.ssh.known_hosts). What their lines mean for one host (`Knowledge.check`):

- `@revoked` lines: that key is refused for the hosts the line names, whatever else says;
- `@cert-authority` lines: a host certificate signed by that CA (right type, principal
  and validity: handoff.ssh.certificates) is accepted; the CA's key is never taken for the host's own key;
- a plain line: that key is the host's (any other key of the same type is CHANGED).

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

This module is the surface of host key checking: the file-level names (`fingerprint`,
`parse_line`, `read_file`, `pin`, ...) are re-exported from known_hosts and certificates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import paramiko

from handoff.errors import ChangedHostKey, HostKeyError, RevokedHostKey, UnknownHostKey
from handoff.ssh.certificates import Certificate, _certificate_of, offered_name, parse_certificate
from handoff.ssh.known_hosts import (
    CA,
    CERT_SUFFIX,
    REVOKED,
    Entry,
    default_known_hosts,
    fingerprint,
    known_hosts_name,
    names_for,
    parse_line,
    pin,
    plain_type,
    read_file,
    trusted_files,
    user_known_hosts,
)

# paramiko's host key algorithms in its default preference (OpenSSH's order too).
DEFAULT_ALGORITHMS: tuple[str, ...] = tuple(paramiko.Transport._preferred_keys)


# A known key of type T makes these algorithms show it.
_ALGORITHMS_FOR_TYPE = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


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


__all__ = ["CA", "REVOKED", "Certificate", "Entry", "HostKeyError", "Knowledge", "fingerprint",
           "knowledge", "known_hosts_name", "lookup", "names_for", "offered_name",
           "parse_certificate", "parse_line", "pin", "plain_type", "read_file", "trusted_files",
           "user_known_hosts"]
