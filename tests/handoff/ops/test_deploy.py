"""The ledger (never the key, 0600, placed/removed folding); deploy plans built without a
host; deploy executed on fake hosts (handoff.testing.local), the key gate included."""

from __future__ import annotations

import json
import secrets as pysecrets
from pathlib import Path

import pytest

from handoff import console
from handoff.cli import commands
from handoff.config import state
from handoff.config.inventory import load_inventory
from handoff.host.targets import Target, resolve
from handoff.ops import deploy
from handoff.run import plan
from payload.redact import REDACTOR
from tests.support.workstation import Workstation


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "hosts:\n"
        "  a: {address: 127.0.0.2, port: 2201, user: u1, roles: [generator]}\n"
        "  b: {address: 127.0.0.3, port: 2202, user: u2, roles: [generator], vars: {remote_dir: /srv/h}}\n"
        "  g: {address: 127.0.0.4, roles: [extractor]}\n"
    )
    monkeypatch.setenv("HANDOFF_INVENTORY", str(inv))
    return tmp_path


def entry(host: str, event: str = "placed", path: str = "/h/.handoff/secrets/k") -> state.LedgerEntry:
    return state.LedgerEntry(host=host, hostname="127.0.0.2", port=22, user=host, identity=[],
                             path=path, fingerprint="abcd1234", time=1.0, event=event)


def test_ledger_folds_events_and_is_private(env: Path) -> None:
    state.record(entry("x"))
    state.record(entry("y"))
    state.record(entry("x", "removed"))
    state.record(entry("y", path="/other"))
    assert sorted((e.host, e.path) for e in state.placed()) == [("y", "/h/.handoff/secrets/k"), ("y", "/other")]
    path = state.ledger_path()
    assert (path.stat().st_mode & 0o777) == 0o600
    with path.open("a") as f:
        f.write('{"torn": ')  # a crash mid-write must not lose the earlier events
    assert len(state.placed()) == 2
    for line in path.read_text().splitlines()[:-1]:
        assert set(json.loads(line)) == {"host", "hostname", "port", "user", "identity", "path",
                                         "fingerprint", "time", "event"}


def fake_key() -> str:
    return "sk-or-v1-" + pysecrets.token_hex(32)


def test_deploy_plan_is_data_without_a_host(env: Path) -> None:
    targets = resolve("a,b,g", load_inventory())
    key = fake_key()
    p = deploy.build(targets, key=key)
    actions = {hp.target.label: [s.action for s in hp.steps] for hp in p.hosts}
    assert actions["a"] == ["probe", "upload-release", "switch-current", "prune-releases", "place-key"]
    assert actions["g"] == ["probe", "upload-release", "switch-current", "prune-releases"]  # no secret role
    place = p.for_host("b")[-1]
    assert "/srv/h/secrets/openrouter.key" in place.description  # key_path follows remote_dir
    assert key not in repr(p.hosts) and p.private.key == key


def test_single_step_plans(env: Path) -> None:
    targets = resolve("a", load_inventory())
    assert [s.action for s in deploy.build(targets, verify=False, key=None).hosts[0].steps] == \
        ["probe", "upload-release", "switch-current", "prune-releases"]
    only_key = deploy.build(targets, verify=False, script=False, key=fake_key())
    assert [s.action for s in only_key.hosts[0].steps] == ["probe", "place-key"]
    assert only_key.hosts[0].steps[0].params.check is False


def test_dry_run_render_shows_fingerprint_never_key(env: Path, capfd: pytest.CaptureFixture[str]) -> None:
    key = fake_key()
    REDACTOR.add(key)
    p = deploy.build(resolve("a,b", load_inventory()), key=key)
    console._console = None  # a fresh console bound to the captured stdout
    plan.render(p)
    out = capfd.readouterr().out
    console._console = None
    assert "dry run" in out and "a (u1@127.0.0.2:2201)" in out and "b (u2@127.0.0.3:2202)" in out
    assert key[:20] not in out and key[-20:] not in out
    assert key[9:17] not in out
    assert "place API key" in out


def test_dry_run_without_a_stored_key_still_plans(env: Path, capfd: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import keyring
    from keyring.backends import null

    from handoff.cli import commands

    previous = keyring.get_keyring()
    keyring.set_keyring(null.Keyring())
    console._console = None
    monkeypatch.setenv("COLUMNS", "300")  # one line per table row: nothing wrapped mid-phrase
    try:
        assert commands.deploy("a", dry_run=True) == 0  # contacts no host, needs no key
        assert commands.deploy("a") == 1  # the real run refuses, naming the fix
    finally:
        keyring.set_keyring(previous)
        console._console = None
        console._err_console = None
    captured = capfd.readouterr()
    assert "NOTE: no API key" in captured.out.replace("\n", " ")  # the missing key is a note
    assert "keyring set openrouter api-key" in captured.err.replace("\n", " ")


def test_deploy_on_fake_hosts_places_release_and_key_then_is_a_no_op(ws: Workstation) -> None:
    """The deploy plan's steps on two fake hosts: the real payload.pyz lands under
    releases/<sha12>, `current` points at it, the key is 0600 in a 0700 folder and in the
    ledger; a second run changes nothing."""
    from handoff.ops import releases

    key = fake_key()
    targets = ws.targets("a,b")
    reports = plan.execute(deploy.build(targets, key=key), connect=ws.connect)
    assert all(r.ok for r in reports), [r.error for r in reports]
    release = releases.build()
    for label in ("a", "b"):
        rd = ws.remote_dir(label)
        assert (rd / "current").readlink() == Path(f"releases/{release.sha12}")
        assert (rd / "current" / "payload.pyz").read_bytes() == release.data
        keyfile = rd / "secrets" / "openrouter.key"
        assert keyfile.read_text() == key and keyfile.stat().st_mode & 0o777 == 0o600
        assert keyfile.parent.stat().st_mode & 0o777 == 0o700
        assert not [p for p in keyfile.parent.iterdir() if p.name != "openrouter.key"]
    assert {e.host for e in state.placed()} == {"a", "b"}
    again = plan.execute(deploy.build(targets, key=key), connect=ws.connect)
    assert [r.summary for r in again] == ["no change needed"] * 2
    assert any("nothing written" in str(line) for line in again[0].lines)


def test_a_key_still_being_read_holds_back_every_change(ws: Workstation) -> None:
    """deploy reads the keyring on a thread while hosts connect and probe; a failed read
    must stop each host before its first change (nothing uploaded, switched, placed)."""
    from concurrent.futures import Future

    from handoff.errors import KeyringEntryMissing

    targets = ws.targets("a")
    pending: Future[str] = Future()
    p = deploy.build(targets, key=pending)
    steps = p.hosts[0].steps
    assert [s.action for s in steps] == ["probe", "upload-release", "switch-current",
                                         "prune-releases", "place-key"]
    assert steps[0].params.key is True  # the probe still hashes the remote key file
    assert [s.changes for s in steps] == [False, True, True, True, True]
    pending.set_exception(KeyringEntryMissing("openrouter", "api-key"))
    [report] = plan.execute(p, connect=ws.connect)
    assert not report.ok and "nothing changed: the API key could not be read" in str(report.error)
    rd = ws.remote_dir("a")
    assert not (rd / "releases").exists() and not (rd / "current").exists()
    assert not (rd / "secrets").exists() and state.placed() == []

    ready: Future[str] = Future()
    ready.set_result(key := fake_key())
    [report] = plan.execute(deploy.build(targets, key=ready), connect=ws.connect)
    assert report.ok and (rd / "secrets" / "openrouter.key").read_text() == key


def test_key_settings_are_computed_once_per_host(ws: Workstation,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The command checks each host's key vars once; the plan's place-key steps reuse them."""
    from handoff.ops.secrets import settings
    from handoff.ops.secrets import step as key_step

    calls: list[str] = []
    real = settings.key_settings

    def counted(target: Target) -> settings.KeySettings:
        calls.append(target.label)
        return real(target)

    monkeypatch.setattr(settings, "key_settings", counted)
    monkeypatch.setattr(key_step, "key_settings", counted)
    targets = ws.targets("a,b")
    chosen = settings.for_hosts(targets)
    p = deploy.build(targets, key="sk-or-v1-x", key_settings=chosen)
    assert calls == ["a", "b"]
    placed = [s.args(key_step.PlaceKey).settings for hp in p.hosts for s in hp.steps
              if s.action == "place-key"]
    assert placed == [chosen["a"], chosen["b"]]


def test_deploying_one_role_keeps_the_other_roles_hosts_for_bare_commands(
        ws, capfd: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """`deploy --host gpu-1` (another role) replaced the remembered targets: a later plain
    `fab status` hid the generator fleet (issue 32 #11). Each role keeps its own."""
    from handoff.cli.commands import targets_for

    assert commands.deploy("a,b", None, key=False) == 0
    assert commands.deploy("s", None, key=False) == 0  # the sleeper role's host, alone
    capfd.readouterr()
    bare = targets_for(None, None)
    assert [t.label for t in bare] == ["a", "b", "s"] and bare.source == "remembered"
    assert "last successful deploy of each role (generator on " in capfd.readouterr().err
    assert [t.label for t in targets_for(None, "sleeper")] == ["s"]
