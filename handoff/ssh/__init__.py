"""Layer 2, SSH as `ssh` does it: ssh_config honoured, host keys checked in the handshake,
every hop of a ProxyJump chain gone through, failures explained.

- `ssh_config`: `ssh -G`'s view of a host (or the same rules read here without ssh).
- `hostkeys`: known_hosts, CAs and revoked keys; the check a host key must pass.
- `endpoint`: `Endpoint` (where and as whom) and its route of hops; no sockets, no paramiko.
- `auth`: the login (identity files, the agent).
- `connect`: the socket, the key exchange and the host key check, put together (`Link`).
- `sftp`: bulk SFTP reads and writes with many requests in flight.

Imports the foundations and handoff.config only.
"""

__all__ = ["auth", "connect", "endpoint", "hostkeys", "sftp", "ssh_config"]
