"""handoff.ops.keyapi against the fake's management API over real HTTP: the calls, the proof of
revocation, the search by name across pages, and errors that name their fix and never the
key; the record beside a key on a host."""

from __future__ import annotations

import socket
from datetime import datetime, timedelta, timezone

import pytest

from handoff.errors import (
    KeyAPIFailed,
    KeyAPIRateLimited,
    KeyAPIUnreachable,
    ManagementKeyRefused,
    NotAManagementKey,
)
from handoff.host import keyrecord
from handoff.ops import keyapi
from handoff.testing.fakekeys import MgmtFault
from handoff.testing.local import LocalSession
from tests.support.workstation import KeyedAPI, Workstation

ENTRY = "openrouter/management-key"


def client(api: KeyedAPI, key: str | None = None) -> keyapi.Client:
    return keyapi.Client(api.url, key or api.management_key, ENTRY, timeout=5)


def test_create_get_patch_revoke(keyed_api: KeyedAPI) -> None:
    c = client(keyed_api)
    expires = keyapi.expiry(24)
    assert expires.endswith("Z") and "+" not in expires
    minted = c.create("handoff a generator", 5.0, expires)
    assert minted.key.startswith("sk-or-v1-") and minted.key not in repr(minted)
    info = minted.info
    assert (info.limit, info.usage, info.disabled) == (5.0, 0.0, False)
    assert info.expires_at is not None and keyapi.utc_iso(info.expires_at) == expires
    assert info.live() and not info.live(margin_s=25 * 3600)
    assert "used $0.0000 of $5.0000, expires in 23h 59m" in info.describe() or \
        "expires in 24h 0m" in info.describe()
    assert c.get(info.hash) == info
    assert c.patch(info.hash, limit=1.25).limit == 1.25
    assert c.revoke(info.hash) is True  # deleted, and GET proved the 404
    assert c.get(info.hash) is None and c.revoke(info.hash) is False  # already gone
    with pytest.raises(KeyAPIFailed, match="no longer exists"):
        c.patch(info.hash, limit=1)


def test_find_by_name_reads_every_page(keyed_api: KeyedAPI) -> None:
    keyed_api.keys.page_size = 2
    c = client(keyed_api)
    made = [c.create(f"k{i}", None, None) for i in range(5)]
    c.create("k4", None, None)  # a second key of that name
    c.patch(made[4].info.hash, disabled=True)  # disabled ones are found too
    assert sorted(k.hash for k in c.find("k4")) == sorted(
        [made[4].info.hash, *(k.hash for k in keyed_api.keys.keys.values()
                              if k.name == "k4" and k.hash != made[4].info.hash)])
    assert keyed_api.keys.calls["list"] == 4  # 6 keys, 2 a page, then an empty page


def test_errors_name_the_fix_and_never_the_key(keyed_api: KeyedAPI) -> None:
    wrong = "sk-or-v1-" + "ab" * 32
    with pytest.raises(ManagementKeyRefused) as refused:
        client(keyed_api, wrong).create("x", 1, None)
    assert "fab set-key --username management-key" in str(refused.value)
    # A 401 may mean a wrong URL as well as a wrong key: it names the URL and both ways out.
    assert keyed_api.url in str(refused.value) and "management_api" in str(refused.value)
    with pytest.raises(NotAManagementKey) as plain:
        client(keyed_api, keyed_api.api_key).create("x", 1, None)
    assert "not a management key" in str(plain.value) and "key_mode: plain" in str(plain.value)
    keyed_api.keys.inject(MgmtFault("get", 429))
    with pytest.raises(KeyAPIRateLimited, match="wait"):
        client(keyed_api).get("h")
    keyed_api.keys.inject(MgmtFault("delete", 503))
    with pytest.raises(KeyAPIFailed, match="503"):
        client(keyed_api).delete("h")
    keyed_api.keys.inject(MgmtFault("list", 0))  # the connection cut mid-call
    with pytest.raises(KeyAPIUnreachable, match="check `management_api`"):
        client(keyed_api).find("x")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(KeyAPIUnreachable) as down:
        keyapi.Client(f"http://127.0.0.1:{port}/api/v1", keyed_api.management_key, ENTRY).get("h")
    for exc in (refused.value, plain.value, down.value):
        text = str(exc)
        assert keyed_api.management_key not in text and wrong not in text
        assert (keyed_api.management_key[9:] not in text and ENTRY in text) or exc is down.value


def test_time_helpers() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    assert keyapi.expiry(1.5, now) == "2026-01-01T13:30:00Z"
    assert keyapi.parse_time("2026-01-01T13:30:00Z") == now + timedelta(hours=1.5)
    assert keyapi.parse_time("2026-01-01T13:30:00") == now + timedelta(hours=1.5)  # naive: UTC
    assert keyapi.parse_time("soon") is None and keyapi.parse_time(None) is None
    assert keyapi.until(now + timedelta(hours=2, minutes=5), now) == "in 2h 5m"
    assert keyapi.until(now - timedelta(minutes=7), now) == "EXPIRED 7m ago"
    assert keyapi.until(None) == "never"



def test_child_key_names_say_workstation_host_and_job_and_read_back() -> None:
    """`handoff:<ws>:<host>[:<job>]`: what the API's own list is searched by (a cleanup with
    an empty state dir); a label with `:` (an address spec) reads back whole."""
    assert keyapi.child_name("0a1b2c3d4e5f", "sbx-1") == "handoff:0a1b2c3d4e5f:sbx-1"
    assert keyapi.child_name("ws", "sbx-1", "B3") == "handoff:ws:sbx-1:B3"
    for host, job in (("sbx-1", None), ("u@10.0.0.5:2222", "B:3"), ("a%3Ab", "j")):
        parsed = keyapi.ChildName.parse(keyapi.child_name("ws", host, job))
        assert parsed == keyapi.ChildName("ws", host, job)
    older = keyapi.ChildName.parse("handoff sbx-1 generator u@127.0.0.2:22 20260101T1200Z #a1b2c3")
    assert older == keyapi.ChildName("", "sbx-1", None, "u@127.0.0.2:22")
    for other in ("my laptop", "handoff:", "handoff:ws", "handoff:ws::j", "handoff:a:b:c:d",
                  "handoff sbx-1 x"):
        assert keyapi.ChildName.parse(other) is None


def test_the_record_beside_the_key(ws: Workstation) -> None:
    [target] = ws.targets("a")
    record = keyrecord.KeyRecord("h" * 64, "n", "http://127.0.0.1:9/api/v1", "openrouter",
                              "abcd1234", "2099-01-01T00:00:00Z", 5.0, 1.0)
    with LocalSession(target, ws.home("a")) as session:
        session.files.mkdir(".handoff")
        assert keyrecord.read_record(session, ".handoff/k.minted.json") is None
        keyrecord.write_record(session, ".handoff/k.minted.json", record)
        assert keyrecord.read_record(session, ".handoff/k.minted.json") == record
        assert (ws.home("a") / ".handoff/k.minted.json").stat().st_mode & 0o777 == 0o600
        (ws.home("a") / ".handoff/torn.minted.json").write_text('{"hash": ')
        assert keyrecord.read_record(session, ".handoff/torn.minted.json") is None
