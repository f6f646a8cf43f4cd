"""SSH connections as `ssh` makes them: ssh_config honoured, host keys checked inside the
handshake, every hop of a ProxyJump chain gone through, failures explained.

A connection is built here on paramiko's Transport, not Fabric's Connection, because each
step must be ours to order and to time:

1. the socket: TCP (ConnectTimeout, default 10 s), a `direct-tcpip` channel through the
   previous hop of a ProxyJump chain (the route: handoff.ssh.endpoint), or a
   ProxyCommand's pipes;
2. the key exchange, with the host key algorithms ordered by what known_hosts already holds
   for the host (handoff.ssh.hostkeys), then the host key check: a refused key ends the
   connection here, before any authentication;
3. the login (handoff.ssh.auth): the IdentityFiles ssh would use, agent keys unless
   `IdentitiesOnly yes`.

Every wait is bounded (no banner, banner then silence, a stalled login) and every failure
becomes a ConnectError that says what happened and what to do; paramiko's own log lines
and tracebacks are silenced, so none reaches the output. `abort_all()` closes every
connection in flight (Ctrl-C), which unblocks the threads waiting on them at once.
"""

from __future__ import annotations

import fcntl
import getpass
import logging
import os
import shlex
import socket
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import paramiko

from handoff.errors import ConnectError, TargetError
from handoff.ssh import hostkeys
from handoff.ssh.auth import login
from handoff.ssh.endpoint import Endpoint, Hop, route
from handoff.ssh.ssh_config import shell_unsafe

# Ciphers offered first: AES-GCM is an AEAD, so paramiko makes one C call per packet where
# aes-ctr + hmac-sha2-256 (its default) makes two; a 1 GB fetch took ~25% less CPU
# (BENCHMARKS.md, "Transfers"). paramiko has no chacha20-poly1305. A server without them
# negotiates the next cipher in paramiko's own order; key exchange, MACs and the host key
# check are untouched.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")

# Asking the kernel for an ACK at once (QuickAcks, below) is Linux's; FIONREAD's answer (an
# int) when no byte is waiting.
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
_NOTHING = bytes(4)

# paramiko logs "Exception (client): …" and whole tracebacks at ERROR for failures that
# handoff reports itself (as one clear line per host); with no handler of its own, Python's
# last-resort handler would print them into the grouped output.
_paramiko_log = logging.getLogger("paramiko")
_paramiko_log.addHandler(logging.NullHandler())
_paramiko_log.propagate = False

_live_lock = threading.Lock()

_live: set[Any] = set()  # transports, sockets, proxy commands being used or set up


def _track(thing: Any) -> Any:
    with _live_lock:
        _live.add(thing)
    return thing


def _untrack(thing: Any) -> None:
    with _live_lock:
        _live.discard(thing)


def _close_quietly(thing: Any) -> None:
    try:
        thing.close()
    except Exception:
        pass
    _untrack(thing)


def abort_all() -> int:
    """Close every connection and connection attempt of this process (Ctrl-C): threads
    blocked on them get an error at once instead of waiting for a timeout."""
    with _live_lock:
        things = list(_live)
        _live.clear()
    for thing in things:
        try:
            thing.close()
        except Exception:
            pass
    return len(things)


class _Transport(paramiko.Transport):
    """paramiko's Transport offering host key algorithms in the order handoff chose (known
    types first, certificates first when a CA is known), exactly and nothing else; and the
    PREFERRED_CIPHERS before paramiko's others."""

    host_key_order: tuple[str, ...] = ()
    _preferred_ciphers = PREFERRED_CIPHERS + tuple(
        c for c in paramiko.Transport._preferred_ciphers if c not in PREFERRED_CIPHERS)

    @property
    def preferred_keys(self) -> tuple[str, ...]:
        usable = set(self._key_info)
        disabled = set(self.disabled_algorithms.get("keys", []))
        return tuple(a for a in self.host_key_order if a in usable and a not in disabled)


class Link:
    """One authenticated SSH connection and the hops (links) it runs through."""

    def __init__(self, hop: Hop, transport: paramiko.Transport, through: Link | None,
                 sock: Any = None) -> None:
        self.hop = hop
        self.label = hop.label
        self.endpoint = hop.endpoint
        self.transport = transport
        self.through = through
        self.sock = sock  # the socket, channel or ProxyCommand under the transport
        self.trusted_by = ""  # which known_hosts line (or CA) vouched for the key

    @property
    def active(self) -> bool:
        return self.transport.is_active()

    def close(self) -> None:
        _close_quietly(self.transport)
        if self.sock is not None:
            _close_quietly(self.sock)
        if self.through is not None:
            self.through.close()

    @property
    def route(self) -> list[str]:
        """The hops' labels, first to last (this link last)."""
        return ([] if self.through is None else self.through.route) + [self.label]


def _where(ep: Endpoint) -> str:
    return f"{ep.hostname}:{ep.port}"


def _expand_proxy_command(command: str, ep: Endpoint) -> str:
    """ssh's tokens in a ProxyCommand: %h %p %r %n %u %d %%."""
    tokens = {"h": ep.hostname, "p": str(ep.port), "r": ep.user, "n": ep.name or ep.hostname,
              "u": getpass.getuser(), "d": os.path.expanduser("~"), "%": "%"}
    for token, what in (("h", "host name"), ("r", "user name"), ("n", "host name")):
        why = shell_unsafe(tokens[token]) if f"%{token}" in command else None
        if why:
            raise TargetError(f"ProxyCommand {command!r}: the {what} {tokens[token]!r} for "
                              f"%{token} {why}; refused before anything runs (OpenSSH refuses "
                              f"it too). Fix the address or user in the inventory or --host")
    out, i = [], 0
    while i < len(command):
        ch = command[i]
        if ch == "%" and i + 1 < len(command):
            token = command[i + 1]
            if token not in tokens:
                raise TargetError(f"ProxyCommand {command!r}: token %{token} is not supported "
                                  f"by handoff (supported: %h %p %r %n %u %d %%)")
            out.append(tokens[token])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _open_socket(hop: Hop, through: Link | None) -> Any:
    """A socket-like object to `hop`: TCP, a channel through the previous link, or a
    ProxyCommand's pipes."""
    ep, label = hop.endpoint, hop.label
    timeout = ep.connect_timeout
    if through is not None:
        try:
            chan = through.transport.open_channel(
                "direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0), timeout=timeout)
        except paramiko.ChannelException as exc:
            why = {1: "forwarding is not allowed there (AllowTcpForwarding?)",
                   2: "it could not connect", 3: "unknown channel type",
                   4: "resource shortage"}.get(exc.code, exc.text)
            raise ConnectError(f"{label} ({_where(ep)}): the jump host {through.label} cannot "
                               f"reach it: {why}") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectError(f"{label} ({_where(ep)}): the jump host {through.label} did not "
                               f"open a connection to it within {timeout:.0f} s "
                               f"({exc or type(exc).__name__})") from None
        return _track(chan)
    if ep.proxy_command:
        command = _expand_proxy_command(ep.proxy_command, ep)
        try:
            proxy = paramiko.ProxyCommand(command)
        except (OSError, ValueError) as exc:
            raise ConnectError(f"{label}: ProxyCommand {command!r} could not start: {exc}") from None
        return _track(proxy)
    try:
        sock = socket.create_connection((ep.hostname, ep.port), timeout=timeout)
    except ConnectionRefusedError:
        raise ConnectError(f"{label} ({_where(ep)}): connection refused; is sshd running and is "
                           f"the port right?") from None
    except TimeoutError:
        raise ConnectError(f"{label} ({_where(ep)}): no answer within {timeout:.0f} s (host down "
                           f"or firewalled?)") from None
    except socket.gaierror as exc:
        raise ConnectError(f"{label}: cannot resolve {ep.hostname!r} ({exc.strerror}); check the "
                           f"address or ssh_config HostName") from None
    except OSError as exc:
        raise ConnectError(f"{label} ({_where(ep)}): cannot connect: {exc.strerror or exc}") from None
    # Every round trip (a channel open, an SFTP stat) is a small write after another, which
    # Nagle's algorithm holds until the server's delayed ACK: 40 ms on Linux. ssh sets it too.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return _track(QuickAcks(sock) if _QUICKACK is not None else sock)


class QuickAcks:
    """A TCP socket that acknowledges at once what it has read when a small read leaves
    nothing more waiting (TCP_QUICKACK, armed again each time: the kernel drops back to
    delayed ACKs by itself).

    Why: sshd sets TCP_NODELAY only on interactive (pty) sessions, so on ours Nagle's
    algorithm holds its second small packet in a row until our ACK of the first, and Linux
    delays that ACK by up to 40 ms. The first channel of every connection waited so:
    connect, login, open a channel and run `true` took 76 ms against OpenSSH's sshd on
    loopback, 31 ms with this (benchmarks/connect.py); a `fab fetch` with nothing to move
    0.376 s, 0.321 s (BENCHMARKS.md, "Transfers"). Only small reads are looked at: a 1 GB
    download makes ~40,000 reads, and a system call after each cost it 6%; its ~4,000
    small ones (packet heads) cost nothing measurable."""

    SMALL = 4096  # a read this short may be a whole answer; bulk data comes in larger ones

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._fd = sock.fileno()

    def recv(self, size: int) -> bytes:
        data = self._sock.recv(size)
        if len(data) < self.SMALL:
            try:
                # Nothing more waiting: the server may be waiting for our ACK. (FIONREAD,
                # not a peek: paramiko gives the socket a timeout, and Python waits that
                # long for a peek to find nothing.)
                if fcntl.ioctl(self._fd, termios.FIONREAD, _NOTHING) == _NOTHING:
                    self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)  # type: ignore[arg-type]
            except OSError:  # closed or reset: the next read says so
                pass
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def knowledge_for(ep: Endpoint) -> hostkeys.Knowledge:
    return hostkeys.knowledge(ep.hostname, ep.port, ep.known_hosts, ep.global_known_hosts,
                              ep.host_key_alias)


def _handshake(sock: Any, hop: Hop, known: hostkeys.Knowledge) -> paramiko.Transport:
    """Key exchange only (no check, no login): the transport and the server's key."""
    ep, label = hop.endpoint, hop.label
    timeout = ep.connect_timeout
    where = f"{label} ({_where(ep)})"
    recorder = _Recording(sock)
    transport = _Transport(recorder)
    transport.host_key_order = known.algorithms()
    transport.banner_timeout = timeout
    transport.handshake_timeout = timeout
    transport.auth_timeout = timeout
    _track(transport)
    done = threading.Event()
    try:
        transport.start_client(event=done)
    except (paramiko.SSHException, OSError) as exc:
        _close_quietly(transport)
        raise ConnectError(f"{where}: SSH could not start: {exc}") from None
    started = time.monotonic()
    while not done.wait(0.05):
        if time.monotonic() - started > timeout + 1 or not transport.is_active():
            break
    if done.is_set() and transport.is_active() and transport.host_key is not None:
        return transport
    failure = transport.get_exception()
    banner = getattr(transport, "remote_version", "")
    _close_quietly(transport)
    raise ConnectError(_handshake_failure(where, timeout, failure, banner,
                                          time.monotonic() - started, recorder.head))


class _Recording:
    """A socket-like object that keeps the first bytes the server sent: what a server that
    is not an SSH server said, for the message (paramiko skips such lines silently)."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.head = b""

    def recv(self, size: int) -> bytes:
        data: bytes = self._sock.recv(size)
        if len(self.head) < 256:
            self.head += data[: 256 - len(self.head)]
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _handshake_failure(where: str, timeout: float, failure: BaseException | None,
                       banner: str, elapsed: float, head: bytes = b"") -> str:
    """One sentence for what went wrong before the host key was known."""
    text = str(failure or "")
    cause = failure.__context__ if failure is not None else None
    stalled = elapsed >= timeout - 0.5
    first = head.decode("utf-8", "replace").splitlines()[0].strip() if head.strip() else ""
    if ("Indecipherable protocol version" in text or "Invalid SSH banner" in text
            or (not banner and first and not first.startswith("SSH-"))):
        said = first or (text.split('"', 1)[1].rstrip('"') if '"' in text else "")
        return (f"{where} answered but is not an SSH server (it said {said[:60]!r}); check "
                f"the address and port")
    if isinstance(failure, paramiko.ProxyCommandFailure):
        return f"{where}: the ProxyCommand failed: {text}"
    if "Incompatible version" in text:
        return f"{where}: the server speaks an SSH version handoff does not ({text})"
    if not banner:
        if isinstance(cause, (EOFError, ConnectionError)) and not stalled:
            return (f"{where} closed the connection before saying anything (sshd refusing "
                    f"connections: MaxStartups, TCP wrappers, a dying host?)")
        return (f"no SSH answer from {where} within {timeout:.0f} s: it accepted the "
                f"connection but sent no SSH banner (not an SSH server, or overloaded)")
    if failure is None or stalled:
        return (f"{where} sent its SSH banner ({banner[:40]}) and then stopped answering during "
                f"the key exchange (nothing within {timeout:.0f} s); the host may be overloaded")
    if isinstance(failure, paramiko.ssh_exception.IncompatiblePeer):
        return f"{where}: no SSH algorithm in common with the server ({text})"
    if isinstance(failure, (EOFError, ConnectionError)):
        return f"{where} closed the connection during the key exchange"
    return f"{where}: SSH key exchange failed: {text or type(failure).__name__}"


def hint_for(target_label: str) -> str:
    """The command that pins host keys for a target (and every jump host on its way)."""
    return f"fab trust-host --host {shlex.quote(target_label)}"


def _link(hop: Hop, through: Link | None, hint: str) -> Link:
    sock = _open_socket(hop, through)
    try:
        known = knowledge_for(hop.endpoint)
        transport = _handshake(sock, hop, known)
        try:
            how = known.check(hop.label, hop.endpoint.hostname, transport.get_remote_server_key(), hint)
            login(transport, hop)
        except BaseException:
            _close_quietly(transport)
            raise
    except BaseException:
        _close_quietly(sock)
        raise
    link = Link(hop, transport, through, sock)
    link.trusted_by = how
    return link


def open_connection(ep: Endpoint, label: str) -> Link:
    """Connect through every hop of the route, checking each host key and logging in to
    each, or raise a ConnectError (HostKeyError for a refused key) that says why."""
    hint = hint_for(label)
    link: Link | None = None
    try:
        for hop in route(ep, label):
            link = _link(hop, link, hint)
    except BaseException:
        if link is not None:
            link.close()
        raise
    assert link is not None
    return link


def fetch_host_key(hop: Hop, through: Link | None) -> tuple[paramiko.PKey, hostkeys.Knowledge]:
    """The key `hop` shows (negotiated as for a connection), without checking it or logging
    in: for trust-host, which shows it to the user."""
    sock = _open_socket(hop, through)
    try:
        known = knowledge_for(hop.endpoint)
        transport = _handshake(sock, hop, known)
        try:
            return transport.get_remote_server_key(), known
        finally:
            _close_quietly(transport)
    finally:
        _close_quietly(sock)


def connect_hop(hop: Hop, through: Link | None, hint: str) -> Link:
    """One checked, authenticated link (trust-host walks a route with it)."""
    try:
        return _link(hop, through, hint)
    except BaseException:
        if through is not None:
            through.close()
        raise


@contextmanager
def deadline(link: Link, seconds: float, what: str) -> Iterator[None]:
    """Bound a blocking call on `link`: past `seconds`, the connection is closed (which ends
    the call with an error) and a ConnectError says what stalled."""
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        link.close()

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except (paramiko.SSHException, OSError, EOFError) as exc:
        if fired.is_set():
            raise ConnectError(f"{link.label}: no answer from the host within {seconds:.0f} s "
                               f"while {what}; the connection was closed") from None
        raise exc
    finally:
        timer.cancel()
    if fired.is_set():
        raise ConnectError(f"{link.label}: no answer from the host within {seconds:.0f} s while "
                           f"{what}; the connection was closed")


__all__ = ["Link", "abort_all", "connect_hop", "deadline", "fetch_host_key", "hint_for", "knowledge_for", "open_connection"]
