"""The connection layer (handoff.ssh.connect) against loopback servers of every kind of trouble:
silence, a web server, a banner then nothing, a refused port; the login with an encrypted
key and no agent, with `IdentitiesOnly` and a real ssh-agent; ProxyCommand; Ctrl-C's
abort. Every failure is one clear ConnectError within the connect timeout, and paramiko
prints nothing of its own."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from handoff.errors import ConnectError
from handoff.ssh import connect, endpoint, hostkeys
from handoff.ssh.connect import open_connection
from handoff.ssh.endpoint import Endpoint
from tests.support.fakessh import FakeSSH, ed25519_key
from tests.support.listener import Listener, write_relay


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def ep(port: int, **kw: object) -> Endpoint:
    fields: dict[str, object] = {"known_hosts": (os.path.expanduser("~/.ssh/known_hosts"),),
                                 "connect_timeout": 2.0}
    fields.update(kw)
    return Endpoint("127.0.0.1", port, "tester", **fields)  # type: ignore[arg-type]


@pytest.mark.serial  # wall time < 4.5 s: run alone (scripts/test's serial pass)
@pytest.mark.parametrize("behaviour, expected", [
    ("silent", "no SSH answer from box (127.0.0.1:{port}) within 2 s"),
    ("http", "answered but is not an SSH server (it said 'HTTP/1.1 400 Bad Request')"),
    ("banner", "sent its SSH banner (SSH-2.0-OpenSSH_9.2) and then stopped answering"),
    ("close", "closed the connection before saying anything"),
])
def test_each_failure_is_one_clear_message(behaviour: str, expected: str, home: Path,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    server = Listener(behaviour)
    try:
        start = time.monotonic()
        with pytest.raises(ConnectError) as exc:
            open_connection(ep(server.port), "box")
        elapsed = time.monotonic() - start
    finally:
        server.close()
    assert expected.format(port=server.port) in str(exc.value), str(exc.value)
    assert elapsed < 4.5  # the connect timeout (2 s) plus a little
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err + captured.out
    assert "Exception (client)" not in captured.err + captured.out


def test_refused_port(home: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(ConnectError, match="connection refused"):
        open_connection(ep(port), "box")


@pytest.fixture(scope="module")
def server_key() -> paramiko.PKey:
    return ed25519_key()


@pytest.fixture
def known_server(server_key: paramiko.PKey, home: Path) -> Iterator[FakeSSH]:
    srv = FakeSSH([server_key])
    (home / ".ssh" / "known_hosts").write_text(
        f"[127.0.0.1]:{srv.port} {server_key.get_name()} {server_key.get_base64()}\n")
    yield srv
    srv.close()


def keygen(path: Path, passphrase: str = "") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)], check=True)
    return path


def test_encrypted_key_without_agent_says_ssh_add(known_server: FakeSSH, home: Path) -> None:
    key = keygen(home / ".ssh" / "id_locked", "secret words")
    with pytest.raises(ConnectError) as exc:
        open_connection(ep(known_server.port, identity=(str(key),)), "box")
    assert f"encrypted key {key} and no agent: add it with `ssh-add {key}`" in str(exc.value)
    assert known_server.log == []  # no key was ever offered


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A real ssh-agent holding one key that no identity file names."""
    # A unix socket's path is at most 107 bytes: pytest's tmp_path (longer under xdist's
    # popen-gwN folders) can exceed it, so the socket gets a short folder of its own.
    short = Path(tempfile.mkdtemp(prefix="agent-", dir="/tmp"))
    sock = short / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30  # the agent's start, on a loaded CI machine too
    while not sock.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert sock.exists(), f"ssh-agent made no socket at {sock} (exit {proc.poll()})"
    agent_key = keygen(tmp_path / "agent_key")
    subprocess.run(["ssh-add", "-q", str(agent_key)], env={**os.environ, "SSH_AUTH_SOCK": str(sock)},
                   check=True, capture_output=True)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
    yield agent_key
    proc.send_signal(signal.SIGTERM)
    proc.wait(5)
    shutil.rmtree(short, ignore_errors=True)


@pytest.mark.parametrize("only", [True, False])
def test_identities_only_keeps_agent_keys_back(only: bool, known_server: FakeSSH, home: Path,
                                               agent: Path) -> None:
    mine = keygen(home / ".ssh" / "id_mine")
    with pytest.raises(ConnectError, match="login refused"):
        open_connection(ep(known_server.port, identity=(str(mine),), identities_only=only), "box")
    agent_fp = hostkeys.fingerprint(paramiko.Ed25519Key.from_private_key_file(str(agent)))
    mine_fp = hostkeys.fingerprint(paramiko.Ed25519Key.from_private_key_file(str(mine)))
    offered = " ".join(known_server.log)
    assert mine_fp in offered
    assert (agent_fp in offered) is (not only)


def test_proxy_command_is_used_with_its_tokens(known_server: FakeSSH, home: Path, tmp_path: Path) -> None:
    """ProxyCommand is honoured (never bypassed): a relay that records it ran, for %h:%p."""
    relay = write_relay(tmp_path)
    command = f"{sys.executable} {relay} %h %p"
    with pytest.raises(ConnectError, match=r"login refused|no key to log in"):
        open_connection(ep(known_server.port, proxy_command=command,
                           identity=(str(keygen(home / ".ssh" / "id_x")),)), "box")
    assert (tmp_path / "relayed").read_text() == f"127.0.0.1:{known_server.port}\n"


def test_unsupported_proxy_command_token_is_refused(home: Path) -> None:
    with pytest.raises(Exception, match="token %C is not supported"):
        open_connection(ep(1, proxy_command="nc %C"), "box")


@pytest.mark.serial  # wall time < 2 s: run alone (scripts/test's serial pass)
def test_abort_all_ends_a_connection_attempt_at_once(home: Path) -> None:
    server = Listener("silent")
    errors: list[str] = []

    def attempt() -> None:
        try:
            open_connection(ep(server.port, connect_timeout=30.0), "box")
        except ConnectError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=attempt)
    thread.start()
    time.sleep(0.5)
    start = time.monotonic()
    assert connect.abort_all() >= 1
    thread.join(5)
    server.close()
    assert not thread.is_alive() and time.monotonic() - start < 2
    assert errors


def test_route_goes_through_every_hop_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Host outer\n  HostName 127.0.0.31\n  Port 2201\n"
        "Host inner\n  HostName 127.0.0.32\n  ProxyJump nowhere-else\n"
        "Host deep\n  HostName 127.0.0.33\n  ProxyJump outer,bob@inner:2202\n")
    monkeypatch.setenv("HOME", str(home))
    from handoff.ssh import ssh_config

    ssh_config.clear_cache()
    hops = endpoint.route(endpoint.endpoint("deep"), "deep")
    assert [(h.endpoint.hostname, h.endpoint.port, h.endpoint.user) for h in hops][:2] == [
        ("127.0.0.31", 2201, hops[0].endpoint.user), ("127.0.0.32", 2202, "bob")]
    assert hops[-1].endpoint.hostname == "127.0.0.33" and hops[-1].label == "deep"
    assert hops[1].endpoint.proxy_jump == ()  # a later hop goes through the previous one only
    assert hops[0].label == "outer (jump host for deep)"


class _SpySocket:
    """A real TCP socket that counts the quick-ACK requests QuickAcks makes of it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.quick_acks = 0

    def recv(self, size: int) -> bytes:
        return self.sock.recv(size)

    def fileno(self) -> int:
        return self.sock.fileno()

    def setsockopt(self, level: int, option: int, value: int) -> None:
        assert (level, option, value) == (socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        self.quick_acks += 1
        self.sock.setsockopt(level, option, value)

    def gettimeout(self) -> float | None:
        return self.sock.gettimeout()


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")
def test_small_answers_are_acknowledged_at_once_bulk_data_is_not() -> None:
    """sshd answers a non-interactive session under Nagle: its second small packet waits for
    our ACK, which Linux delays by up to 40 ms. So a small read that leaves nothing waiting
    asks for the ACK at once; a read with more waiting does not, nor does a bulk read (the
    kernel acknowledges every other full segment anyway, and a download's ~40,000 reads
    must not each cost a system call)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        peer = socket.create_connection(server.getsockname())
        mine, _ = server.accept()
    with peer, mine:
        spy = _SpySocket(mine)
        quick = connect.QuickAcks(spy)  # type: ignore[arg-type]

        def arrived(n: int) -> None:
            deadline = time.monotonic() + 10
            while len(mine.recv(n, socket.MSG_PEEK)) < n:
                assert time.monotonic() < deadline
                time.sleep(0.01)

        peer.sendall(b"x" * 10)
        arrived(10)
        assert quick.recv(100) == b"x" * 10 and spy.quick_acks == 1
        peer.sendall(b"y" * 20)
        arrived(20)
        assert quick.recv(10) == b"y" * 10 and spy.quick_acks == 1  # 10 more waiting
        assert quick.recv(10) == b"y" * 10 and spy.quick_acks == 2
        bulk = 100 * 1024
        peer.sendall(b"z" * bulk)
        arrived(bulk)
        got = quick.recv(64 * 1024)
        got += quick.recv(bulk)
        assert got == b"z" * bulk and spy.quick_acks == 2
        peer.sendall(b"w")
        arrived(1)
        assert quick.recv(10) == b"w" and spy.quick_acks == 3  # small again after the bulk
        assert quick.gettimeout() == mine.gettimeout()  # anything else goes to the socket
