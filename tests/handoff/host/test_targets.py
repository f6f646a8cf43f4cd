"""Target resolution: inventory names, ssh_config aliases, [user@]address[:port], the saved
targets of the last deploy, and ssh_config merged under the inventory's values."""

from __future__ import annotations

from pathlib import Path

import pytest

from handoff.config import state
from handoff.config.inventory import load_inventory
from handoff.errors import TargetError
from handoff.host.targets import resolve
from handoff.ssh.endpoint import endpoint, parse_spec


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Host jump-alias\n  HostName 127.0.0.9\n  Port 2200\n  User alice\n"
        "  IdentityFile ~/.ssh/id_test\n  UserKnownHostsFile ~/.ssh/kh_extra /dev/null2\n"
        "Host via-jump\n  HostName 127.0.0.10\n  ProxyJump bob@127.0.0.9:2200\n"
        "Host gen-alias\n  HostName 127.0.0.20\n  User carol\n  Port 2222\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "hosts:\n"
        "  gen-1: {address: 127.0.0.5, user: root, port: 2022, roles: [generator], vars: {model: m1}}\n"
        "  gen-2: {address: gen-alias, user: dave, roles: [generator]}\n"
        "  gpu-1: {address: 127.0.0.6, roles: [extractor], vars: {gpus: 2}}\n"
    )
    monkeypatch.setenv("HANDOFF_INVENTORY", str(inv))
    return home


def test_parse_spec() -> None:
    assert parse_spec("root@127.0.0.9:2222") == ("root", "127.0.0.9", 2222)
    assert parse_spec("127.0.0.9") == (None, "127.0.0.9", None)
    assert parse_spec("u@[::1]:22") == ("u", "::1", 22)
    assert parse_spec("host.example") == (None, "host.example", None)


def test_ssh_config_applies_with_tilde_from_home(env: Path) -> None:
    ep = endpoint("jump-alias")
    assert (ep.hostname, ep.port, ep.user) == ("127.0.0.9", 2200, "alice")
    assert ep.identity == (str(env / ".ssh" / "id_test"),)
    # ~ is $HOME (not the passwd home ssh itself would use); "/dev/null2" is kept as written
    assert ep.known_hosts == (str(env / ".ssh" / "kh_extra"), "/dev/null2")
    # as ssh -G writes it back (a port makes the address bracketed)
    assert endpoint("via-jump").proxy_jump == ("bob@[127.0.0.9]:2200",)
    assert parse_spec("bob@[127.0.0.9]:2200") == ("bob", "127.0.0.9", 2200)
    assert parse_spec("ssh://bob@h.example:2201") == ("bob", "h.example", 2201)


def test_inventory_overrides_ssh_config(env: Path) -> None:
    inv = load_inventory()
    [t] = resolve("gen-2", inv)
    # address is an ssh_config alias: HostName/Port from there, User from the inventory
    assert (t.endpoint.hostname, t.endpoint.port, t.endpoint.user) == ("127.0.0.20", 2222, "dave")


def test_inventory_name_address_and_alias(env: Path) -> None:
    inv = load_inventory()
    ts = resolve("gen-1,root@127.0.0.5:2022,jump-alias,u@127.0.0.77", inv)
    labels = [t.label for t in ts]
    # the address of gen-1 is gen-1 (deduplicated, same vars); the alias and the raw address are new
    assert labels == ["gen-1", "jump-alias", "u@127.0.0.77"]
    assert ts[0].vars["model"] == "m1" and ts[0].role is not None and ts[0].role.name == "generator"
    assert ts[2].endpoint.port == 22 and ts[2].endpoint.user == "u"


def test_unknown_bare_name_lists_known(env: Path) -> None:
    with pytest.raises(TargetError, match=r"unknown host 'gen-3'.*known hosts: gen-1, gen-2, gpu-1"):
        resolve("gen-3", load_inventory())


def test_a_host_name_a_letter_off_gets_did_you_mean(env: Path) -> None:
    with pytest.raises(TargetError, match=r"unknown host 'gen1'.*; did you mean 'gen-1'\?$"):
        resolve("gen1", load_inventory())


def test_role_flag_selects_inventory_hosts(env: Path) -> None:
    ts = resolve(None, load_inventory(), "extractor")
    assert [t.label for t in ts] == ["gpu-1"] and ts[0].vars["gpus"] == 2


def test_saved_targets_win_over_inventory(env: Path) -> None:
    inv = load_inventory()
    assert [t.label for t in resolve(None, inv)] == ["gen-1", "gen-2", "gpu-1"]
    state.save_targets({"generator": ["gen-2"]})
    assert [t.label for t in resolve(None, inv)] == ["gen-2"]
    assert (state.state_dir().stat().st_mode & 0o777) == 0o700
    assert ((state.state_dir() / "targets.json").stat().st_mode & 0o777) == 0o600


def test_a_deploy_of_one_role_keeps_the_other_roles_remembered(env: Path) -> None:
    """`deploy --host gpu-1` replaced the remembered targets, so a later bare `fab status`
    hid the generator fleet (issue 32 #11): each role keeps its last deploy's hosts, a bare
    command acts on all of them (each as the role it was deployed as), `--role` on its own."""
    inv = load_inventory()
    state.save_targets({"generator": ["gen-1", "gen-2"]})
    state.save_targets({"extractor": ["gpu-1"]})
    both = resolve(None, inv)
    assert [(t.label, t.role.name if t.role else None) for t in both] == [
        ("gpu-1", "extractor"), ("gen-1", "generator"), ("gen-2", "generator")]
    assert "each role (extractor on " in both.describe() and ", generator on " in both.describe()
    assert [t.label for t in resolve(None, inv, "generator")] == ["gen-1", "gen-2"]
    state.save_targets({"generator": ["gen-2"]})  # a role's next deploy replaces its own hosts
    assert [t.label for t in resolve(None, inv)] == ["gpu-1", "gen-2"]
    assert state.load_targets() == ["gpu-1", "gen-2"]


def test_targets_remembered_by_an_older_handoff_still_count(env: Path) -> None:
    (state.ensure_state_dir() / "targets.json").write_text(
        '{"hosts": ["gen-2"], "role": null, "time": 1}')
    assert [t.label for t in resolve(None, load_inventory())] == ["gen-2"]
