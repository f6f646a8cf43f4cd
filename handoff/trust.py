"""Fetch a host's key for `trust-host` without logging in.

Only the SSH transport is started (key exchange), then closed: the key is shown to
the user and pinned only after confirmation, so a wrong key is never written.
"""

from __future__ import annotations

import socket

import paramiko

from handoff import hostkeys
from handoff.errors import ConnectError
from handoff.ssh import CONNECT_TIMEOUT, endpoint, open_connection, parse_spec
from handoff.targets import Target


def fetch_key(target: Target) -> paramiko.PKey:
    ep = target.endpoint
    where = f"{target.label} ({ep.hostname}:{ep.port})"
    sock: object
    gateway = None
    try:
        if ep.proxyjump and ep.proxyjump.lower() != "none":
            hop_user, hop_addr, hop_port = parse_spec(ep.proxyjump.split(",")[-1].strip())
            gateway = open_connection(endpoint(hop_addr, hop_port, hop_user), f"{target.label} (jump)")
            sock = gateway.client.get_transport().open_channel(
                "direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0))
        else:
            sock = socket.create_connection((ep.hostname, ep.port), timeout=CONNECT_TIMEOUT)
    except OSError as exc:
        raise ConnectError(f"{where}: cannot connect: {exc.strerror or exc}") from None
    transport = paramiko.Transport(sock)
    try:
        known = hostkeys.lookup(ep.hostname, ep.port, ep.known_hosts)
        if known:
            # Ask for the type we already trust first, so "changed" is not a mere type switch.
            opts = transport.get_security_options()
            first = known[0].get_name()
            opts.key_types = [first] + [k for k in opts.key_types if k != first]
        transport.start_client(timeout=CONNECT_TIMEOUT)
        return transport.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise ConnectError(f"{where}: SSH handshake failed: {exc}") from None
    finally:
        transport.close()
        if gateway is not None:
            gateway.close()
