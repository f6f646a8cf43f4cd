"""Host key checking against a real (in-process, loopback) paramiko SSH server.

Proves: an unknown key is refused with its SHA256 fingerprint and the trust-host
command; a changed key is refused with both fingerprints; in both cases the server
never sees an authentication attempt (the check is in the handshake); a known key
(from known_hosts, UserKnownHostsFile or the pinned file) proceeds to login; nothing
is written to known_hosts."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from handoff import hostkeys
from handoff.errors import ChangedHostKey, ConnectError, UnknownHostKey
from handoff.ssh import Endpoint, open_connection


class Server(paramiko.ServerInterface):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self.log.append(f"auth {username}")
        return paramiko.AUTH_FAILED

    def check_auth_none(self, username: str) -> int:
        self.log.append(f"auth-none {username}")
        return paramiko.AUTH_FAILED


@pytest.fixture(scope="module")
def host_key() -> paramiko.PKey:
    return paramiko.RSAKey.generate(1024)


@pytest.fixture(scope="module")
def other_key() -> paramiko.PKey:
    return paramiko.RSAKey.generate(1024)


@pytest.fixture(scope="module")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("client") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return str(path)


@pytest.fixture
def server(host_key: paramiko.PKey) -> Iterator[tuple[int, list[str]]]:
    log: list[str] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(5)
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            t = paramiko.Transport(conn)
            t.add_server_key(host_key)
            try:
                t.start_server(server=Server(log))
                t.accept(0.3)
            except Exception:
                pass
            finally:
                t.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1], log
    stop.set()
    thread.join(2)
    sock.close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def ep(port: int, known: tuple[str, ...] = (), identity: tuple[str, ...] = ()) -> Endpoint:
    return Endpoint("127.0.0.1", port, "tester", identity, known)


def test_fingerprint_format(host_key: paramiko.PKey) -> None:
    fp = hostkeys.fingerprint(host_key)
    assert fp.startswith("SHA256:") and len(fp) == 50 and not fp.endswith("=")


def test_unknown_key_refused_before_auth(server: tuple[int, list[str]], host_key: paramiko.PKey, home: Path) -> None:
    port, log = server
    with pytest.raises(UnknownHostKey) as exc:
        open_connection(ep(port), "box")
    msg = str(exc.value)
    assert hostkeys.fingerprint(host_key) in msg and "fab trust-host --host box" in msg
    assert log == []  # never reached authentication
    assert not (home / ".ssh" / "known_hosts").exists()  # and nothing was written


def test_changed_key_refused_loudly(server: tuple[int, list[str]], host_key: paramiko.PKey, home: Path,
                                    other_key: paramiko.PKey) -> None:
    port, log = server
    other = other_key
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} ssh-rsa {other.get_base64()}\n")
    with pytest.raises(ChangedHostKey) as exc:
        open_connection(ep(port), "box")
    msg = str(exc.value)
    assert "CHANGED" in msg and hostkeys.fingerprint(other) in msg and hostkeys.fingerprint(host_key) in msg
    assert log == []
    assert other.get_base64() in (home / ".ssh" / "known_hosts").read_text()  # untouched


@pytest.mark.parametrize("where", ["known_hosts", "user_known_hosts_file", "pinned"])
def test_known_key_proceeds_to_login(where: str, server: tuple[int, list[str]], host_key: paramiko.PKey,
                                     home: Path, tmp_path: Path, client_key: str) -> None:
    port, log = server
    line = f"[127.0.0.1]:{port} ssh-rsa {host_key.get_base64()}\n"
    known: tuple[str, ...] = ()
    if where == "known_hosts":
        (home / ".ssh" / "known_hosts").write_text(line)
    elif where == "user_known_hosts_file":
        (tmp_path / "kh").write_text(line)
        known = (str(tmp_path / "kh"),)
    else:
        hostkeys.pin("127.0.0.1", port, host_key)
    with pytest.raises(ConnectError, match="login refused"):
        open_connection(ep(port, known, (client_key,)), "box")
    assert any(entry.startswith("auth") for entry in log)


def test_pin_replaces_previous_pin(home: Path, host_key: paramiko.PKey, other_key: paramiko.PKey) -> None:
    old = other_key
    hostkeys.pin("127.0.0.41", 22, old)
    hostkeys.pin("127.0.0.42", 2222, old)
    path = hostkeys.pin("127.0.0.41", 22, host_key)
    text = path.read_text()
    assert old.get_base64() in text and text.count("127.0.0.41 ") == 1
    assert hostkeys.lookup("127.0.0.41", 22) == [host_key]
    assert (path.stat().st_mode & 0o777) == 0o600
