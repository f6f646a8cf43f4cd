"""An SSH server in-process on loopback (paramiko) that offers the host keys it is given and
refuses every login, logging each attempt: the host key and connection tests' other end."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import threading

import paramiko

from handoff.ssh import hostkeys


class Server(paramiko.ServerInterface):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.log.append(f"auth {username} {hostkeys.fingerprint(key)}")
        return paramiko.AUTH_FAILED

    def check_auth_none(self, username: str) -> int:
        self.log.append(f"auth-none {username}")
        return paramiko.AUTH_FAILED


def ed25519_key() -> paramiko.PKey:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
        return paramiko.Ed25519Key.from_private_key_file(path)


class FakeSSH:
    """Accepts connections on loopback and serves SSH with some of `keys` as host keys."""

    def __init__(self, keys: list[paramiko.PKey]) -> None:
        self.keys = keys
        self.log: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(5)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            t = paramiko.Transport(conn)
            for key in self.keys:
                t.add_server_key(key)
            try:
                t.start_server(server=Server(self.log))
                t.accept(0.5)
            except Exception:
                pass
            finally:
                t.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()
