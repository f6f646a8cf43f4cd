"""`fab trust-host`: fetch a host's key without logging in, show it, pin it once confirmed.

Only the SSH transport is started (key exchange), then closed: the key is shown to
the user and pinned (handoff.hostkeys, in the state dir) only after confirmation, so a
wrong key is never written.
"""

from __future__ import annotations

import socket
import sys

import paramiko

from handoff import console, hostkeys
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


def trust(target: Target, yes: bool) -> bool:
    """`fab trust-host` for one target: show the key it offers, pin it once confirmed (or
    with `yes`); True when the key is trusted afterwards."""
    ep = target.endpoint
    key = fetch_key(target)
    fp = hostkeys.fingerprint(key)
    known = hostkeys.lookup(ep.hostname, ep.port, ep.known_hosts)
    where = f"{console.r(target.label)} ({console.r(ep.hostname)}:{ep.port})"
    if any(k == key for k in known):
        console.say(f"{where}: {key.get_name()} {fp} is already trusted")
        return True
    if known:
        old = ", ".join(f"{k.get_name()} {hostkeys.fingerprint(k)}" for k in known)
        console.say(f"[bold red]WARNING: the host key of {console.r(target.label)} CHANGED[/]: "
                    f"trusted {old}, now offered {key.get_name()} {fp}")
    console.say(f"{where} offers {key.get_name()} key [bold]{fp}[/]")
    console.say("compare it with `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` run on the host itself")
    if not yes:
        if not sys.stdin.isatty():
            console.error("not pinned: confirm by re-running with --yes (stdin is not a terminal)")
            return False
        answer = input(f"Pin this key for {target.label}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            console.say("not pinned")
            return False
    path = hostkeys.pin(ep.hostname, ep.port, key)
    console.say(f"pinned {fp} for {console.r(ep.hostname)}:{ep.port} in {path}")
    return True
