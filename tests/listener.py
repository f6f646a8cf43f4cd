"""A loopback TCP port that misbehaves, for the connection layer's failure messages (unit
tests of handoff.ssh and the integration tests through `fab`)."""

from __future__ import annotations

import socket
import threading


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
