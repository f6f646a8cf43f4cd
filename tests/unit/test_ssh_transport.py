"""How handoff opens a connection's transport: AES-GCM first (bulk transfers), TCP_NODELAY
on the socket (no 40 ms Nagle stall per round trip); everything else is paramiko's."""

from __future__ import annotations

import socket

import paramiko

from handoff import ssh


def test_transport_prefers_gcm_and_sets_nodelay() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    try:
        made = ssh.transport(client)
        ciphers = made.get_security_options().ciphers
        assert ciphers[:2] == ssh.PREFERRED_CIPHERS
        # Every cipher paramiko offers is still offered (a server without GCM still connects).
        assert sorted(ciphers) == sorted(paramiko.Transport._preferred_ciphers)
        assert made.get_security_options().kex == paramiko.Transport._preferred_kex
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        made.close()
    finally:
        client.close()
        server.close()


def test_a_proxy_hop_channel_is_left_alone() -> None:
    left, right = socket.socketpair()  # not TCP (as a ProxyJump channel is not a socket)
    try:
        made = ssh.transport(left)
        assert made.get_security_options().ciphers[:2] == ssh.PREFERRED_CIPHERS
        made.close()
    finally:
        left.close()
        right.close()
