"""Host key checking against a real (in-process, loopback) paramiko SSH server offering
ed25519, ecdsa and rsa host keys, as a stock sshd does.

Proves: an unknown key is refused with its SHA256 fingerprint and the trust-host command;
a changed key is refused naming both key types and fingerprints; a host known only by its
RSA key is asked for RSA and connects (no false CHANGED); a host offering none of the known
types is "unknown", never CHANGED; an `@revoked` key is refused; lines ssh cannot parse are
skipped with one warning; hashed and negated host patterns; the global known_hosts files;
in every refusal the server never sees an authentication attempt (the check is in the
handshake); nothing is written to known_hosts."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from handoff import console
from handoff.config import state
from handoff.errors import ChangedHostKey, ConnectError, RevokedHostKey, UnknownHostKey
from handoff.ssh import hostkeys, known_hosts
from handoff.ssh.connect import open_connection
from handoff.ssh.endpoint import Endpoint
from tests.support.fakessh import FakeSSH, ed25519_key


@pytest.fixture(scope="module")
def keys() -> dict[str, paramiko.PKey]:
    """The server's host keys by type (what `ssh-keygen -A` gives a stock sshd)."""
    return {"ssh-ed25519": ed25519_key(),
            "ecdsa-sha2-nistp256": paramiko.ECDSAKey.generate(),
            "ssh-rsa": paramiko.RSAKey.generate(2048)}


@pytest.fixture(scope="module")
def other_key() -> paramiko.PKey:
    return paramiko.RSAKey.generate(2048)


@pytest.fixture(scope="module")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("client") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return str(path)


@pytest.fixture
def server(keys: dict[str, paramiko.PKey]) -> Iterator[FakeSSH]:
    srv = FakeSSH(list(keys.values()))
    yield srv
    srv.close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    console._err_console = None
    known_hosts._warned.clear()
    return home


def ep(port: int, known: tuple[str, ...] = (), identity: tuple[str, ...] = (),
       global_files: tuple[str, ...] = ()) -> Endpoint:
    """An endpoint as ssh -G gives it: ssh's default user known_hosts unless `known`."""
    files = known or (os.path.expanduser("~/.ssh/known_hosts"),)
    return Endpoint("127.0.0.1", port, "tester", identity, files, global_files, connect_timeout=5)


def line(port: int, key: paramiko.PKey, marker: str = "", name: str | None = None) -> str:
    host = name or f"[127.0.0.1]:{port}"
    return f"{marker + ' ' if marker else ''}{host} {key.get_name()} {key.get_base64()}\n"


def test_fingerprint_format(keys: dict[str, paramiko.PKey]) -> None:
    fp = hostkeys.fingerprint(keys["ssh-rsa"])
    assert fp.startswith("SHA256:") and len(fp) == 50 and not fp.endswith("=")


def test_unknown_key_refused_before_auth(server: FakeSSH, keys: dict[str, paramiko.PKey],
                                         home: Path) -> None:
    with pytest.raises(UnknownHostKey) as exc:
        open_connection(ep(server.port), "box")
    msg = str(exc.value)
    # nothing known: the default preference, ed25519, is what the host shows
    assert hostkeys.fingerprint(keys["ssh-ed25519"]) in msg and "fab trust-host --host box" in msg
    assert server.log == []  # never reached authentication
    assert not (home / ".ssh" / "known_hosts").exists()  # and nothing was written


def test_changed_key_names_both_types_and_fingerprints(server: FakeSSH, keys: dict[str, paramiko.PKey],
                                                       home: Path, other_key: paramiko.PKey) -> None:
    (home / ".ssh" / "known_hosts").write_text(line(server.port, other_key))
    with pytest.raises(ChangedHostKey) as exc:
        open_connection(ep(server.port), "box")
    msg = str(exc.value)
    assert "CHANGED" in msg
    assert f"ssh-rsa {hostkeys.fingerprint(other_key)}" in msg  # what was known, with its type
    assert f"ssh-rsa {hostkeys.fingerprint(keys['ssh-rsa'])}" in msg  # what it offered
    assert server.log == []
    assert other_key.get_base64() in (home / ".ssh" / "known_hosts").read_text()  # untouched


def test_rsa_only_entry_negotiates_rsa_and_connects(server: FakeSSH, keys: dict[str, paramiko.PKey],
                                                    home: Path, client_key: str) -> None:
    """Files written by older clients, Ansible or paramiko list only the RSA key: ssh asks the
    host for RSA (rsa-sha2-512/256) and connects; so must handoff (no false CHANGED)."""
    (home / ".ssh" / "known_hosts").write_text(line(server.port, keys["ssh-rsa"]))
    with pytest.raises(ConnectError, match="login refused"):
        open_connection(ep(server.port, identity=(client_key,)), "box")
    assert any(entry.startswith("auth") for entry in server.log)  # got past the host key


def test_rsa_listed_before_others_still_connects(server: FakeSSH, keys: dict[str, paramiko.PKey],
                                                 home: Path, client_key: str) -> None:
    (home / ".ssh" / "known_hosts").write_text(
        line(server.port, keys["ssh-rsa"]) + line(server.port, keys["ssh-ed25519"]))
    with pytest.raises(ConnectError, match="login refused"):
        open_connection(ep(server.port, identity=(client_key,)), "box")


def test_other_type_known_is_unknown_not_changed(keys: dict[str, paramiko.PKey], home: Path) -> None:
    """The host offers only RSA while only its ed25519 key is known: ssh says keys of another
    type are known and refuses; never "CHANGED" (no key of that type was known)."""
    srv = FakeSSH([keys["ssh-rsa"]])
    try:
        (home / ".ssh" / "known_hosts").write_text(line(srv.port, keys["ssh-ed25519"]))
        with pytest.raises(UnknownHostKey) as exc:
            open_connection(ep(srv.port), "box")
        assert "CHANGED" not in str(exc.value) and "only ssh-ed25519 keys are known" in str(exc.value)
        assert srv.log == []
    finally:
        srv.close()


@pytest.mark.parametrize("where", ["known_hosts", "user_known_hosts_file", "pinned", "global"])
def test_known_key_proceeds_to_login(where: str, server: FakeSSH, keys: dict[str, paramiko.PKey],
                                     home: Path, tmp_path: Path, client_key: str) -> None:
    text = line(server.port, keys["ssh-ed25519"])
    known: tuple[str, ...] = ()
    global_files: tuple[str, ...] = ()
    if where == "known_hosts":
        (home / ".ssh" / "known_hosts").write_text(text)
    elif where == "user_known_hosts_file":
        (tmp_path / "kh").write_text(text)
        known = (str(tmp_path / "kh"),)
    elif where == "global":  # GlobalKnownHostsFile (default /etc/ssh/ssh_known_hosts)
        (tmp_path / "ssh_known_hosts").write_text(text)
        global_files = (str(tmp_path / "ssh_known_hosts"),)
    else:
        hostkeys.pin("127.0.0.1", server.port, keys["ssh-ed25519"])
    with pytest.raises(ConnectError, match="login refused"):
        open_connection(ep(server.port, known, (client_key,), global_files), "box")
    assert any(entry.startswith("auth") for entry in server.log)


def test_revoked_key_is_refused_before_auth(server: FakeSSH, keys: dict[str, paramiko.PKey],
                                            home: Path) -> None:
    (home / ".ssh" / "known_hosts").write_text(
        line(server.port, keys["ssh-ed25519"]) + line(0, keys["ssh-ed25519"], "@revoked", "*"))
    with pytest.raises(RevokedHostKey) as exc:
        open_connection(ep(server.port), "box")
    assert "REVOKED" in str(exc.value) and "known_hosts:2" in str(exc.value)
    assert server.log == []


def test_unparseable_lines_are_skipped_with_one_warning(server: FakeSSH, keys: dict[str, paramiko.PKey],
                                                        home: Path, client_key: str,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    good = line(server.port, keys["ssh-ed25519"])
    truncated = line(0, keys["ssh-rsa"], name="other.example")[:120] + "\n"
    ca = line(0, keys["ecdsa-sha2-nistp256"], "@cert-authority", "*.example.com")
    (home / ".ssh" / "known_hosts").write_text(
        "# comment\n\n" + truncated + "@bogus host ssh-ed25519 AAAA\n" + ca + good)
    for _ in range(2):
        with pytest.raises(ConnectError, match="login refused"):
            open_connection(ep(server.port, identity=(client_key,)), "box")
    err = capfd.readouterr().err
    assert err.count("skipped 2 line(s)") == 1, err  # warned once, naming the lines
    assert "line 3" in err and "line 4" in err


def test_hashed_and_negated_patterns(keys: dict[str, paramiko.PKey], tmp_path: Path) -> None:
    salt = os.urandom(20)
    name = "[127.0.0.7]:2222"
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    hashed = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    key = keys["ssh-ed25519"]
    entry = hostkeys.parse_line(f"{hashed} {key.get_name()} {key.get_base64()}", "f:1")
    assert entry is not None and entry.matches([name]) and not entry.matches(["[127.0.0.7]:22"])
    negated = hostkeys.parse_line(f"*.example.com,!bad.example.com {key.get_name()} {key.get_base64()}", "f:2")
    assert negated is not None
    assert negated.matches(["good.example.com"]) and not negated.matches(["bad.example.com"])


def test_algorithm_order_follows_known_types(keys: dict[str, paramiko.PKey], home: Path) -> None:
    (home / ".ssh" / "known_hosts").write_text(line(2222, keys["ssh-rsa"]))
    known = hostkeys.knowledge("127.0.0.1", 2222, [str(home / ".ssh" / "known_hosts")])
    order = known.algorithms()
    assert order[:3] == ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")
    assert "ssh-ed25519" in order  # still offered after: a host without RSA is "unknown type"


def test_host_certificate_checks(tmp_path: Path) -> None:
    """A host certificate made by ssh-keygen: accepted for its principal within its validity,
    signed by the CA; refused for another name or when expired."""
    ca = tmp_path / "ca"
    host = tmp_path / "host"
    for path in (ca, host):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "h", "-h", "-n", "h1.example,127.0.0.71",
                    "-V", "-1h:+1h", str(host) + ".pub"], check=True)
    blob = base64.b64decode((tmp_path / "host-cert.pub").read_text().split()[1])
    cert = hostkeys.parse_certificate(blob)
    assert cert.problem("h1.example") is None and cert.problem("127.0.0.71") is None
    assert "not issued for" in (cert.problem("h2.example") or "")
    ca_blob = base64.b64decode((tmp_path / "ca.pub").read_text().split()[1])
    assert cert.signature_key == ca_blob
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "h", "-h", "-n", "h1.example",
                    "-V", "20200101:20200102", str(host) + ".pub"], check=True)
    old = hostkeys.parse_certificate(base64.b64decode((tmp_path / "host-cert.pub").read_text().split()[1]))
    assert old.problem("h1.example") == "outside its validity period"


def test_pin_replaces_previous_pin(home: Path, keys: dict[str, paramiko.PKey], other_key: paramiko.PKey) -> None:
    old = other_key
    hostkeys.pin("127.0.0.41", 22, old)
    hostkeys.pin("127.0.0.42", 2222, old)
    path = hostkeys.pin("127.0.0.41", 22, keys["ssh-rsa"])
    text = path.read_text()
    assert old.get_base64() in text and text.count("127.0.0.41 ") == 1
    assert hostkeys.lookup("127.0.0.41", 22) == [keys["ssh-rsa"]]
    assert (path.stat().st_mode & 0o777) == 0o600


@pytest.mark.serial  # wall time < 3 s: run alone (scripts/test's serial pass)
def test_refusal_is_quick(server: FakeSSH, home: Path) -> None:
    start = time.monotonic()
    with pytest.raises(UnknownHostKey):
        open_connection(ep(server.port), "box")
    assert time.monotonic() - start < 3


def test_pin_into_the_users_known_hosts(home: Path, keys: dict[str, paramiko.PKey],
                                        other_key: paramiko.PKey) -> None:
    """trust-host --known-hosts (issue 22 #5): the pin goes where plain ssh looks, replacing
    only this host's lines; other hosts, wildcards and @revoked lines stay as written."""
    kh = hostkeys.user_known_hosts()
    assert kh == home / ".ssh" / "known_hosts"
    kh.parent.mkdir(mode=0o700, exist_ok=True)
    salt = os.urandom(20)
    hashed = "|1|" + base64.b64encode(salt).decode() + "|" + base64.b64encode(
        hmac.new(salt, b"[127.0.0.51]:2222", hashlib.sha1).digest()).decode()
    kh.write_text("\n".join([
        f"[127.0.0.51]:2222,other.example {other_key.get_name()} {other_key.get_base64()}",
        f"{hashed} {other_key.get_name()} {other_key.get_base64()}",
        f"*.example {other_key.get_name()} {other_key.get_base64()}",
        f"@revoked [127.0.0.52]:2222 {other_key.get_name()} {other_key.get_base64()}",
    ]) + "\n")
    kh.chmod(0o644)
    path = hostkeys.pin("127.0.0.51", 2222, keys["ssh-rsa"], path=kh)
    assert path == kh and (kh.stat().st_mode & 0o777) == 0o644  # the user's mode kept
    text = kh.read_text()
    assert f"other.example {other_key.get_name()}" in text and "[127.0.0.51]:2222," not in text
    assert hashed not in text and "*.example" in text and "@revoked [127.0.0.52]:2222" in text
    assert hostkeys.lookup("127.0.0.51", 2222) == [keys["ssh-rsa"]]
    assert not state.pinned_keys_path().exists()  # nothing in the state dir
    assert hostkeys.user_known_hosts(["~/.ssh/team_hosts", "~/.ssh/known_hosts"]) == \
        home / ".ssh" / "team_hosts"
