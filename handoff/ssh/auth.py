"""The login, step 3 of a connection (handoff.ssh.connect): the IdentityFiles ssh would use,
in ssh's order, and the agent's keys unless `IdentitiesOnly yes`; every refusal explained.
"""

from __future__ import annotations

import base64
import os
import socket
import threading
from typing import Any

import paramiko

from handoff.errors import ConnectError
from handoff.ssh import hostkeys
from handoff.ssh.endpoint import Endpoint, Hop


def _agent(ep: Endpoint) -> paramiko.Agent | None:
    """The ssh-agent ssh would use (IdentityAgent, else $SSH_AUTH_SOCK), or None."""
    if ep.identity_agent == "none":
        return None
    path = ep.identity_agent or os.environ.get("SSH_AUTH_SOCK")
    if not path:
        return None
    agent = paramiko.Agent.__new__(paramiko.Agent)
    paramiko.agent.AgentSSH.__init__(agent)
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(5)
        conn.connect(path)
        agent._connect(conn)
    except (OSError, paramiko.SSHException):
        return None  # ssh too goes on without an agent it cannot reach
    return agent


def _public_blob(path: str) -> bytes | None:
    """The public key of an identity file (`F.pub`), to find it in the agent."""
    try:
        with open(path + ".pub", encoding="utf-8") as fh:
            return base64.b64decode(fh.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


_loaded_lock = threading.Lock()
# Identity files already read, by path and the file's identity, size and mtime then: every
# host of a fleet logs in with the same file, and parsing it per connection was ~0.4 ms
# each. A changed file (another size, mtime or inode) is read again.
_loaded: dict[tuple[str, int, int, int], paramiko.PKey] = {}


def _load(path: str) -> paramiko.PKey:
    """The private key in `path` (paramiko's errors as they are: an encrypted file raises)."""
    st = os.stat(path)
    stamp = (path, st.st_ino, st.st_size, st.st_mtime_ns)
    with _loaded_lock:
        key = _loaded.get(stamp)
    if key is None:
        key = paramiko.PKey.from_path(path)
        with _loaded_lock:
            _loaded[stamp] = key
    return key


def _candidates(ep: Endpoint, agent: paramiko.Agent | None) -> tuple[list[tuple[str, Any]], list[str]]:
    """Keys to offer, in ssh's order, and encrypted identity files that could not be used
    (no agent holds them)."""
    agent_keys = list(agent.get_keys()) if agent is not None else []
    by_blob = {k.asbytes(): k for k in agent_keys}
    offered: list[tuple[str, Any]] = []
    used: set[bytes] = set()
    encrypted: list[str] = []
    for path in ep.identity:
        if not os.path.isfile(path):
            continue
        pub = _public_blob(path)
        if pub is not None and pub in by_blob:
            offered.append((f"{path} (agent)", by_blob[pub]))
            used.add(pub)
            continue
        try:
            key = _load(path)
        except paramiko.PasswordRequiredException:
            encrypted.append(path)
            continue
        except TypeError as exc:  # cryptography's words for the same thing
            if "password" in str(exc).lower():
                encrypted.append(path)
            continue
        except (paramiko.SSHException, OSError, ValueError):
            continue  # not a key ssh could use either
        if key.asbytes() in by_blob:
            used.add(key.asbytes())
        offered.append((path, key))
    if not ep.identities_only:
        offered += [(f"agent key {hostkeys.fingerprint(k.asbytes())}", k)
                    for k in agent_keys if k.asbytes() not in used]
    return offered, encrypted


def login(transport: paramiko.Transport, hop: Hop) -> None:
    ep, label = hop.endpoint, hop.label
    where = f"{label} ({ep})"
    agent = _agent(ep)
    try:
        offered, encrypted = _candidates(ep, agent)
        if not offered:
            if encrypted:
                raise ConnectError(f"{where}: encrypted key {encrypted[0]} and no agent: add it "
                                   f"with `ssh-add {encrypted[0]}`, then run this again")
            files = ", ".join(ep.identity) or "none"
            raise ConnectError(f"{where}: no key to log in with (identity files tried: {files}; "
                               f"no ssh-agent); set `identity` in the inventory or IdentityFile "
                               f"in ~/.ssh/config")
        for _name, key in offered:
            try:
                transport.auth_publickey(ep.user, key)
            except paramiko.BadAuthenticationType as exc:
                raise ConnectError(f"{where}: the server does not take SSH keys (it allows: "
                                   f"{', '.join(exc.allowed_types) or 'nothing'})") from None
            except paramiko.AuthenticationException as exc:
                if "timeout" in str(exc).lower():
                    # paramiko reports a slow server with the same class as a refused key;
                    # "refused" would send the user after the wrong fix.
                    raise ConnectError(f"{where}: the login did not finish within "
                                       f"{ep.connect_timeout:.0f} s (host overloaded?); try "
                                       f"again") from None
                continue
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise ConnectError(f"{where}: the host closed the connection during the login "
                                   f"({exc or type(exc).__name__}); too many keys offered "
                                   f"(MaxAuthTries)? set IdentitiesOnly yes") from None
            if transport.is_authenticated():
                return
        tried = ", ".join(name for name, _ in offered)
        extra = (f"; encrypted key {encrypted[0]} was skipped (no agent holds it): add it "
                 f"with `ssh-add {encrypted[0]}`") if encrypted else ""
        raise ConnectError(f"{where}: login refused for user {ep.user!r} with {tried}{extra}; "
                           f"check `user`/`identity` in the inventory or User/IdentityFile in "
                           f"~/.ssh/config")
    finally:
        if agent is not None:
            agent.close()


__all__ = ["login"]
