"""ssh_config as `ssh` itself resolves it.

Where the OpenSSH client is installed, `ssh -G HOST` prints the settings ssh would use for
HOST after every rule of ssh_config: Include, Match, wildcards, first-value-wins, token
expansion, the system file. handoff asks it instead of re-implementing those rules, so
`fab` goes where `ssh NAME` goes. Values the inventory sets are passed as the command-line
options they stand for (`-p PORT -l USER -i IDENTITY`), so they override ssh_config exactly
as they would for `ssh`.

Without the client, paramiko's parser reads `$HOME/.ssh/config` (no Include, limited Match)
and a warning says so once.

`~` is `$HOME` for every file handoff reads (docs/configuration.md). OpenSSH takes its own config and its
default known_hosts from the passwd home, so when `$HOME` is another folder (tests, sudo,
some containers) handoff points `ssh -G` at `$HOME/.ssh/config` (plus the system file)
and reads known_hosts paths ssh expanded under the passwd home from `$HOME` instead.

Lookups are cached for the process (one `fab` run): each costs a fork of ssh (5-8 ms of
CPU). Names that no Host line of the config files singles out (handoff.ssh.config_scan:
typically a fleet listed by address) share one answer, checked with a second `ssh -G`
to depend on no name, port or user, so 32 such hosts cost two forks, not 32; any Match
block, token or Include that module cannot follow sends every name to ssh as before.
handoff.host.targets resolves a command's names side by side.
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache

from handoff import console
from handoff.errors import TargetError
from handoff.ssh import config_scan

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
DEFAULT_IDENTITIES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk",
                      "~/.ssh/id_ed25519", "~/.ssh/id_ed25519_sk", "~/.ssh/id_xmss",
                      "~/.ssh/id_dsa")
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
# A name no Host or Match block is written for: what `ssh -G` says for it is the baseline
# every name gets, so a name whose settings differ from it is configured (an alias).
_UNMATCHED = "handoff-unmatched-name.invalid"


@dataclass(frozen=True)
class HostConfig:
    """What ssh would use to reach one name (paths already expanded with $HOME)."""

    name: str  # the name looked up
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    identity_agent: str | None = None  # None: $SSH_AUTH_SOCK; "none": no agent
    user_known_hosts: tuple[str, ...] = ()
    global_known_hosts: tuple[str, ...] = ()
    host_key_alias: str | None = None
    proxy_jump: tuple[str, ...] = ()  # hops in the order they are connected through
    proxy_command: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    source: str = "ssh -G"

    def settings(self) -> tuple[object, ...]:
        """Everything but the name: equal for two names ssh treats alike."""
        return (self.port, self.user, self.identity_files, self.identities_only,
                self.identity_agent, self.user_known_hosts, self.global_known_hosts,
                self.host_key_alias, self.proxy_jump, self.proxy_command, self.connect_timeout)


def home() -> str:
    """$HOME: what `~` means in every path handoff reads."""
    return os.path.expanduser("~")


def passwd_home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return home()


def expand(path: str) -> str:
    """`~` is $HOME; a path ssh expanded under the passwd home is read under $HOME."""
    if path == "~" or path.startswith("~/"):
        return home() + path[1:]
    own, ours = passwd_home().rstrip("/"), home().rstrip("/")
    if own != ours and own and path.startswith(own + "/"):
        return ours + path[len(own):]
    return path


def user_config_path() -> str:
    return os.path.join(home(), ".ssh", "config")


def ssh_client() -> str | None:
    return shutil.which("ssh")


# --- ssh -G -----------------------------------------------------------------------------------

_wrapper_lock = threading.Lock()
_wrappers: dict[str, str] = {}  # $HOME -> the wrapper config written for it


def _config_args() -> list[str]:
    """`-F FILE` when $HOME is not the passwd home (ssh would read the passwd home's config):
    a wrapper including $HOME/.ssh/config then the system file, in ssh's own order. Each
    Include restores the Host/Match state after it, so the two read as they would alone."""
    ours = home()
    if os.path.realpath(ours) == os.path.realpath(passwd_home()):
        return []
    with _wrapper_lock:
        path = _wrappers.get(ours)
        if path is None:
            fd, path = tempfile.mkstemp(prefix="handoff-ssh-config-", suffix=".conf")
            with os.fdopen(fd, "w") as fh:
                fh.write(f'Include "{user_config_path()}"\n')
                if os.path.exists(SYSTEM_CONFIG):
                    fh.write(f'Include "{SYSTEM_CONFIG}"\n')
            atexit.register(_remove_wrapper, path)
            _wrappers[ours] = path
        return ["-F", path]


def _remove_wrapper(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _run_ssh_g(client: str, name: str, port: int | None, user: str | None,
               identity: str | None) -> dict[str, list[str]]:
    argv = [client, "-G", *_config_args()]
    if port:
        argv += ["-p", str(port)]
    if user:
        argv += ["-l", user]
    if identity:
        argv += ["-i", expand(identity)]
    argv += ["--", name]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TargetError(f"{name}: `ssh -G` failed ({exc}); check ~/.ssh/config") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines()
                 if "Pseudo-terminal will not be allocated" not in ln]
        detail = " / ".join(lines[-3:]) or f"exit {proc.returncode}"
        raise TargetError(f"{name}: ssh_config cannot be read as ssh reads it: {detail} "
                          f"(check with `ssh -G {name}`)")
    values: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key:
            values.setdefault(key.lower(), []).append(value.strip())
    return values


def _split_hops(value: str | None) -> tuple[str, ...]:
    if not value or value.lower() == "none":
        return ()
    return tuple(h.strip() for h in value.split(",") if h.strip())


def _timeout(value: str | None) -> float:
    if not value or value == "none":
        return DEFAULT_CONNECT_TIMEOUT
    try:
        return float(value)
    except ValueError:
        return DEFAULT_CONNECT_TIMEOUT


def _files(values: Iterable[str]) -> tuple[str, ...]:
    found: list[str] = []
    for value in values:
        for item in value.split():
            if item.lower() != "none":
                found.append(expand(item))
    return tuple(found)


def _from_ssh_g(name: str, values: dict[str, list[str]]) -> HostConfig:
    def one(key: str) -> str | None:
        got = values.get(key)
        return got[0] if got else None

    agent = one("identityagent")
    command = one("proxycommand")
    return HostConfig(
        name=name,
        hostname=one("hostname") or name,
        port=int(one("port") or 22),
        user=one("user") or _local_user(),
        identity_files=tuple(expand(p) for p in values.get("identityfile", [])),
        identities_only=(one("identitiesonly") or "no") == "yes",
        identity_agent=None if agent in (None, "SSH_AUTH_SOCK") else expand(agent or ""),
        user_known_hosts=_files(values.get("userknownhostsfile", [])),
        global_known_hosts=_files(values.get("globalknownhostsfile", [])),
        host_key_alias=one("hostkeyalias"),
        proxy_jump=_split_hops(one("proxyjump")),
        proxy_command=None if command in (None, "none") else command,
        connect_timeout=_timeout(one("connecttimeout")),
    )


def _local_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return os.environ.get("USER", "root")


# --- the fallback: paramiko's parser ------------------------------------------------------------

_warned = threading.Event()


def _warn_fallback() -> None:
    if not _warned.is_set():
        _warned.set()
        console.warn("the OpenSSH client (`ssh`) is not installed: reading ~/.ssh/config with "
                     "paramiko's parser, which ignores Include and most Match rules; install "
                     "openssh-client for ssh's exact settings")


# What OpenSSH (valid_hostname, valid_ruser) refuses in a host or user name it would put
# into a ProxyCommand or Match exec (`%h`, `%r`): a shell metacharacter, a space or control
# character, a leading '-'. Such a name would run as a command (`i-0a1b;id>/tmp/x;#`).
_SHELL_META = frozenset("'`\"$\\;&<>|(){},")


def shell_unsafe(value: str) -> str | None:
    """Why `value` may not stand for a host or user name in a command ssh runs (None: it
    may): a name from an inventory or a command line is a colleague's word too."""
    if value.startswith("-"):
        return "starts with '-'"
    bad = sorted({c for c in value if c in _SHELL_META or c.isspace() or not c.isprintable()})
    if bad:
        return f"holds {', '.join(repr(c) for c in bad)} (a shell would run what follows)"
    return None


def _refuse_unsafe(name: str, user: str | None) -> None:
    """The paramiko fallback substitutes `%h`/`%r` into ProxyCommand unquoted, as OpenSSH
    does; OpenSSH refuses such names first, and so does this."""
    for what, value in (("host name", name), ("user name", user)):
        why = shell_unsafe(value) if value else None
        if why:
            raise TargetError(f"{what} {value!r} {why}; refused before anything runs (OpenSSH "
                              f"refuses it too). Fix the address or user in the inventory or "
                              f"--host")


def _from_paramiko(name: str, port: int | None, user: str | None,
                   identity: str | None) -> HostConfig:
    import paramiko

    _refuse_unsafe(name, user)

    parsed = paramiko.SSHConfig()
    try:
        parsed = paramiko.SSHConfig.from_path(user_config_path())
    except FileNotFoundError:
        pass
    except Exception as exc:  # paramiko's parser raises assorted errors on odd files
        raise TargetError(f"{user_config_path()}: cannot be read: {exc}") from None
    looked = parsed.lookup(name)
    identities = list(looked.get("identityfile", [])) or list(DEFAULT_IDENTITIES)
    if identity:
        identities.insert(0, identity)
    known = looked.get("userknownhostsfile")
    glob = looked.get("globalknownhostsfile")
    agent = looked.get("identityagent")
    command = looked.get("proxycommand")
    return HostConfig(
        name=name,
        hostname=looked.get("hostname", name),
        port=port or int(looked.get("port", 22)),
        user=user or looked.get("user") or _local_user(),
        identity_files=tuple(expand(p) for p in identities),
        identities_only=str(looked.get("identitiesonly", "no")).lower() == "yes",
        identity_agent=None if agent in (None, "SSH_AUTH_SOCK") else expand(agent),
        user_known_hosts=_files([known] if known else DEFAULT_USER_KNOWN_HOSTS),
        global_known_hosts=_files([glob] if glob else DEFAULT_GLOBAL_KNOWN_HOSTS),
        host_key_alias=looked.get("hostkeyalias"),
        proxy_jump=_split_hops(looked.get("proxyjump")),
        proxy_command=None if command in (None, "none") else command,
        connect_timeout=_timeout(looked.get("connecttimeout")),
        source="paramiko",
    )


# --- lookups -----------------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def _lookup(name: str, port: int | None, user: str | None, identity: str | None,
            home_dir: str) -> HostConfig:
    client = ssh_client()
    if client is None:
        _warn_fallback()
        return _from_paramiko(name, port, user, identity)
    shared = _shared(client, identity, home_dir)
    if shared is not None:
        values = shared.answer(name, port, user)
        if values is not None:
            return _from_ssh_g(name, values)
    return _from_ssh_g(name, _run_ssh_g(client, name, port, user, identity))


# --- one `ssh -G` for the names no Host pattern singles out -------------------------------------

_OTHER = "handoff-unmatched-other.invalid"  # a second reference name, for the token check
# Names answered from the shared reference: plain lowercase host names and addresses (ssh
# lowercases the name it prints as hostname; anything else asks ssh, which may refuse it).
_PLAIN_NAME = re.compile(r"[a-z0-9][a-z0-9._:-]*")
_PLAIN_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*")
# What the name and the -p/-l options set in `ssh -G`'s answer; every other key must be the
# same for both reference names, else some setting depends on them (a %h, %p or %r token).
_PER_NAME_KEYS = {"host", "hostname", "port", "user"}


@dataclass(frozen=True)
class _Shared:
    """`ssh -G`'s answer for a name no Host line singles out (with the inventory's identity
    as `-i`), which every such name gets with its own hostname, port and user."""

    scan: config_scan.Scan
    values: dict[str, list[str]]

    def answer(self, name: str, port: int | None, user: str | None) -> dict[str, list[str]] | None:
        """What `ssh -G [-p port] [-l user] name` prints, or None when only ssh can say."""
        if not _PLAIN_NAME.fullmatch(name) or (user and not _PLAIN_USER.fullmatch(user)):
            return None
        if not self.scan.same(name, _UNMATCHED):
            return None
        values = dict(self.values)
        values["host"] = values["hostname"] = [name]
        if port:
            values["port"] = [str(port)]
        if user:
            values["user"] = [user]
        return values


_shared_lock = threading.Lock()
_shared_cache: dict[tuple[str | None, str], _Shared | None] = {}


def _shared(client: str, identity: str | None, home_dir: str) -> _Shared | None:
    """The shared answer for this identity, or None when the config files could tell names
    apart in ways only ssh follows (handoff.ssh.config_scan). Computed once per process and
    identity: targets are resolved from 8 threads at once, and one asks while the others wait."""
    key = (identity, home_dir)
    with _shared_lock:
        if key not in _shared_cache:
            _shared_cache[key] = _compute_shared(client, identity)
        return _shared_cache[key]


def _config_files() -> list[str]:
    """The files `ssh -G` reads, as _run_ssh_g calls it."""
    args = _config_args()
    if args:
        return [args[1]]  # the wrapper: $HOME/.ssh/config, then the system file
    return [os.path.join(passwd_home(), ".ssh", "config"), SYSTEM_CONFIG]


def _compute_shared(client: str, identity: str | None) -> _Shared | None:
    scan = config_scan.scan(_config_files(), list(dict.fromkeys([home(), passwd_home()])))
    if scan is None or not scan.same(_UNMATCHED, _OTHER):
        return None
    try:
        base = _run_ssh_g(client, _UNMATCHED, None, None, identity)
        # The second reference differs in name, port and user: any setting that follows one
        # of them (a token) shows as a difference, and every name then asks ssh itself.
        port = int((base.get("port") or ["22"])[0]) % 65535 + 1
        user = "handoff-probe-" + ("b" if base.get("user") == ["handoff-probe-a"] else "a")
        other = _run_ssh_g(client, _OTHER, port, user, identity)
    except (TargetError, ValueError):
        return None  # a broken config: each name's own `ssh -G` says what is wrong
    if (base.get("hostname") != [_UNMATCHED] or other.get("hostname") != [_OTHER]
            or other.get("port") != [str(port)] or other.get("user") != [user]
            or base.get("canonicalizehostname") != ["false"]):
        return None
    if ({k: v for k, v in base.items() if k not in _PER_NAME_KEYS}
            != {k: v for k, v in other.items() if k not in _PER_NAME_KEYS}):
        return None
    return _Shared(scan, base)


def lookup(name: str, port: int | None = None, user: str | None = None,
           identity: str | None = None) -> HostConfig:
    """ssh's settings for `name`, with the inventory's values as command-line options."""
    return _lookup(name, port or None, user or None, identity or None, home())


def is_alias(name: str) -> bool:
    """True when ssh_config says something particular about `name` (a Host or Match block
    rewrites its address or sets its port, user, key, proxy...): ssh treats it as an alias."""
    looked = lookup(name)
    if looked.hostname != name:
        return True
    baseline = lookup(_UNMATCHED)
    return looked.settings() != replace(baseline, name=name).settings()


def clear_cache() -> None:
    """Forget every lookup (tests that rewrite ssh_config within one process)."""
    _lookup.cache_clear()
    with _shared_lock:
        _shared_cache.clear()
    with _wrapper_lock:
        for path in _wrappers.values():
            _remove_wrapper(path)
        _wrappers.clear()
