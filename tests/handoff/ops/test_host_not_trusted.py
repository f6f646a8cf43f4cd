"""The host is not trusted (issue 18), piece by piece without sshd: a plaintext keyring is
refused unless asked for; what a host says can only lower a key's limit; the management
key goes only to the workstation's own URL, and a hash a host names is used only when it
is that host's key; fetch's listing is checked entry by entry. (The attacks end to end, on
real sshd: tests/integration/test_hostile_container.py.)"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keyring
import pytest
from keyrings.alt.file import PlaintextKeyring

from handoff.config import os_keyring, state
from handoff.errors import KeyAPIUnreachable, RemoteError
from handoff.errors import PlaintextKeyring as PlaintextRefused
from handoff.host.targets import Target
from handoff.ops import fetch
from handoff.ops.jobs import budget
from handoff.ops.keyapi import ChildKey
from handoff.ops.secrets import settings
from handoff.ssh.endpoint import Endpoint
from tests.support.workstation import Workstation

# -- the keyring ----------------------------------------------------------------------------------


@pytest.fixture
def plaintext(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PlaintextKeyring]:
    monkeypatch.delenv(os_keyring.PLAINTEXT_OPT_IN, raising=False)
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring_pass.cfg")  # type: ignore[misc]
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)


def test_a_plaintext_keyring_is_refused_for_reads_and_writes(plaintext: PlaintextKeyring) -> None:
    key = "sk-or-v1-" + "cd" * 32
    with pytest.raises(PlaintextRefused) as stored:
        os_keyring.store_key(key)
    text = str(stored.value)
    assert "PlaintextKeyring" in text and plaintext.file_path in text
    assert "D-Bus" in text and "HANDOFF_ALLOW_PLAINTEXT_KEYRING=1" in text
    assert "DBUS_SESSION_BUS_ADDRESS is unset" in text
    assert not Path(plaintext.file_path).exists()
    with pytest.raises(PlaintextRefused):
        os_keyring.read_key()


def test_the_opt_in_accepts_it_and_says_plaintext(plaintext: PlaintextKeyring,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(os_keyring.PLAINTEXT_OPT_IN, "1")
    key = "sk-or-v1-" + "ef" * 32
    where = os_keyring.store_key(key)
    assert "PLAINTEXT" in where and plaintext.file_path in where
    assert os_keyring.read_key() == key


# -- limits: the host can only lower them ----------------------------------------------------------


@pytest.mark.parametrize(("cost", "spent"), [(-1000, 0.0), ("5", 0.0), (None, 0.0), (True, 0.0),
                                             (float("nan"), 0.0), (float("inf"), 0.0), (0.25, 0.25)])
def test_what_a_job_says_it_spent(cost: Any, spent: float) -> None:
    assert budget.spent_of({"cost": cost}) == spent


def test_a_limit_is_never_more_than_the_share_above_the_usage() -> None:
    for spent in (-1000.0, 0.0, 0.3, 5.0):
        assert budget.new_limit(usage=2.0, share=1.0, spent=spent) <= 3.0
    assert budget.new_limit(usage=2.0, share=1.0, spent=0.25) == 2.75


# -- the management key's URL; whose key a hash is -------------------------------------------------


def target(label: str = "gen-1", *, in_inventory: bool = True, base_url: str = "",
           management_api: str = "") -> Target:
    ep = Endpoint(hostname="127.0.0.5", port=2222, user="u")
    host: Any = object() if in_inventory else None
    return Target(label, label, ep, host, None, {"base_url": base_url, "key_path": "~/k"},
                  management_api)


def minted_event(key_hash: str, api: str) -> state.LedgerEntry:
    return state.LedgerEntry(host="gen-1", hostname="127.0.0.5", port=2222, user="u",
                             identity=[], path="/h/k", fingerprint="", time=time.time(),
                             event="minted", key_hash=key_hash, api=api, service="openrouter",
                             name="handoff gen-1 x")


def test_the_management_api_is_the_inventorys_or_the_ledgers_never_the_default(
        ws: Workstation) -> None:
    # The inventory's (resolved with the target), never the host's own base_url.
    assert settings.management_api(target(base_url="http://127.0.0.1:7/api/v1/",
                                          management_api="http://127.0.0.1:6/api/v1/")) == \
        "http://127.0.0.1:6/api/v1"
    with pytest.raises(KeyAPIUnreachable):
        settings.management_api(target(base_url="http://127.0.0.1:7/api/v1/"))
    gone = target(in_inventory=False, base_url="")
    with pytest.raises(KeyAPIUnreachable, match="never to the built-in default"):
        settings.management_api(gone)
    builtin = target(in_inventory=False, base_url="https://openrouter.ai/api/v1")
    with pytest.raises(KeyAPIUnreachable):
        settings.management_api(builtin)
    state.record(minted_event("h1", "http://127.0.0.1:8/api/v1"))
    assert settings.management_api(gone) == "http://127.0.0.1:8/api/v1"


class OneKey:
    """A management client that knows one key."""

    def __init__(self, info: ChildKey | None) -> None:
        self.info = info

    def get(self, key_hash: str) -> ChildKey | None:
        return self.info


def child(name: str) -> ChildKey:
    return ChildKey("h2", name, 1.0, 1.0, 0.0, None, False)


def test_a_hash_a_host_names_is_used_only_when_it_is_that_hosts_key(ws: Workstation) -> None:
    t = target()
    for name in ("handoff gen-1 generator u@127.0.0.5:2222 20261201T1000Z #abcdef",  # older form
                 "handoff:0123456789ab:gen-1", "handoff:another-ws:gen-1:B3"):
        ours = child(name)
        assert settings.vouch(OneKey(ours), t, "h2") is ours  # type: ignore[arg-type]
    assert settings.vouch(OneKey(None), t, "h2") is None  # type: ignore[arg-type]
    for name in ("handoff gen-2 generator u@127.0.0.5:2222 x #1", "my laptop key",
                 "handoff gen-1 generator other@127.0.0.5:2222 x #1", "handoff:ws:gen-2",
                 "handoff:ws:gen-10", "handoff:ws", "handoff:ws:gen-1:B3:extra"):
        with pytest.raises(RemoteError, match="did not mint for this host"):
            settings.vouch(OneKey(child(name)), t, "h2")  # type: ignore[arg-type]
    state.record(minted_event("h2", "http://127.0.0.1:8/api/v1"))
    theirs = child("renamed by hand")
    assert settings.vouch(OneKey(theirs), t, "h2") is theirs  # type: ignore[arg-type]


# -- fetch's listing -------------------------------------------------------------------------------


def test_a_listing_is_checked_entry_by_entry(tmp_path: Path) -> None:
    local = tmp_path / "dest" / "host" / "job"
    local.mkdir(parents=True)
    (local / "link").symlink_to(tmp_path)
    listing = {"files": [
        {"rel": "output.jsonl", "size": 10, "mtime": 1.0},
        {"rel": "/etc/passwd", "size": 1, "mtime": 1.0},
        {"rel": "../../../x", "size": 1, "mtime": 1.0},
        {"rel": "a/\x1b]52;c;eA==\x07", "size": 1, "mtime": 1.0},
        {"rel": "link/inside", "size": 1, "mtime": 1.0},
        {"rel": "big", "size": -5, "mtime": 1.0},
        "not an entry",
    ], "skipped": [{"rel": "leak", "kind": "symlink"}]}
    entries, refused = fetch.checked_entries(listing, local, "job")
    assert [e.rel for e in entries] == ["output.jsonl"]
    assert entries[0].local == local / "output.jsonl"
    text = "\n".join(refused)
    assert "absolute" in text and "'..'" in text and "symlink on the workstation" in text
    assert "leak: a symlink on the host" in text and "no valid size" in text
    assert "\x1b" not in text and "\\x1b" in text
    assert len(refused) == 7


@pytest.mark.parametrize("file_id", ["64768:1234", "x:1", "1:2:3", "1:2\n", "9" * 30 + ":1", 12, None,
                                     ["1", "2"]])
def test_a_host_file_id_is_used_only_in_its_own_shape(tmp_path: Path, file_id: Any) -> None:
    """The listing's file_id (device:inode) only decides whether a prefix written here from
    that file may resume on its probe alone; anything but two short numbers is no id."""
    listing = {"files": [{"rel": "output.jsonl", "size": 10, "mtime": 1.0, "file_id": file_id}]}
    [entry], _ = fetch.checked_entries(listing, tmp_path, "job")
    assert entry.file_id == (file_id if file_id == "64768:1234" else None)


def test_the_room_of_a_folder_not_made_yet(tmp_path: Path) -> None:
    room = fetch.Room(tmp_path / "a" / "b", keep=0)
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert abs(room.free - free) < 100 << 20 and room.left == room.free  # others write too
