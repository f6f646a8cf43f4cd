"""Layer 2, SSH as `ssh` does it: ssh_config honoured, host keys checked in the handshake,
every hop of a ProxyJump chain gone through, failures explained.

- `ssh_config`: `ssh -G`'s view of a host (or the same rules read here without ssh).
- `known_hosts`: known_hosts files read as OpenSSH reads them, and pinning a key.
- `certificates`: OpenSSH host certificates (type, validity, principals, signature).
- `hostkeys`: the check a host key must pass (revoked, CAs, changed or unknown).
- `endpoint`: `Endpoint` (where and as whom) and its route of hops; no sockets, no paramiko.
- `auth`: the login (identity files, the agent).
- `connect`: the socket, the key exchange and the host key check, put together (`Link`).
- `sftp`: bulk SFTP reads and writes with many requests in flight.

Imports the foundations and handoff.config only.
"""

__all__ = ["auth", "certificates", "connect", "endpoint", "hostkeys", "known_hosts", "sftp",
           "ssh_config"]
