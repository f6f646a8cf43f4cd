"""OpenSSH host certificates (PROTOCOL.certkeys): the fields that decide whether a host
may use one (`Certificate.problem`: type, validity, critical options, principals, the CA's
signature), read from the key a server offers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import paramiko

from handoff.ssh.known_hosts import CERT_SUFFIX, wildcard_match

HOST_CERT = 2  # SSH2_CERT_TYPE_HOST


# Key material fields after the nonce in a certificate, per plain type (PROTOCOL.certkeys).
_CERT_KEY_FIELDS = {"ssh-rsa": 2, "ssh-dss": 4, "ssh-ed25519": 1, "sk-ssh-ed25519@openssh.com": 2,
                    "sk-ecdsa-sha2-nistp256@openssh.com": 3}


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
