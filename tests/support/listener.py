"""Loopback helpers for the connection layer's tests (unit tests of handoff.ssh.connect and the
integration tests through `fab`): a TCP port that misbehaves, and a ProxyCommand relay."""

from __future__ import annotations

import socket
import threading
from pathlib import Path


class Listener:
    """Answers each connection by `behaviour`: `silent` (nothing), `http` (a web server's
    400), `banner` (an SSH banner, then silence) or `close` (hangs up at once)."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            if self.behaviour == "http":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            elif self.behaviour == "banner":
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
            elif self.behaviour == "close":
                conn.close()

    def close(self) -> None:
        self.stop.set()
        for conn in self.conns:
            conn.close()
        self.sock.close()


def write_relay(folder: Path) -> Path:
    """A ProxyCommand script (`python relay.py HOST PORT`) that relays stdin/stdout to
    HOST:PORT and appends `HOST:PORT` to `folder/relayed`, so a test sees that it ran."""
    script = folder / "relay.py"
    script.write_text(
        "import socket, sys, threading\n"
        f"open({str(folder / 'relayed')!r}, 'a').write(sys.argv[1] + ':' + sys.argv[2] + '\\n')\n"
        "s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
        "def up():\n"
        "    while (d := sys.stdin.buffer.read1(65536)):\n"
        "        s.sendall(d)\n"
        "threading.Thread(target=up, daemon=True).start()\n"
        "while (d := s.recv(65536)):\n"
        "    sys.stdout.buffer.write(d); sys.stdout.buffer.flush()\n")
    return script
