"""The ciphers handoff's connections offer: AES-GCM first (bulk transfers, see
handoff.ssh.sftp), then every cipher paramiko offers, in paramiko's order; nothing else
about the key exchange changes. (TCP_NODELAY and the negotiated cipher are checked against
real sshd in tests/integration/test_transfer.py.)"""

from __future__ import annotations

import paramiko

from handoff.ssh import connect


def test_gcm_first_then_paramiko_s_own_order() -> None:
    offered = connect._Transport._preferred_ciphers
    assert offered[:2] == connect.PREFERRED_CIPHERS == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
    rest = [c for c in paramiko.Transport._preferred_ciphers if c not in connect.PREFERRED_CIPHERS]
    assert list(offered[2:]) == rest  # a server without GCM still connects
    assert connect._Transport._preferred_kex == paramiko.Transport._preferred_kex
    assert connect._Transport._preferred_macs == paramiko.Transport._preferred_macs
