"""ssh_config as `ssh -G` resolves it (Include, Match, wildcards, first value wins, the
command-line options the inventory stands for), `~` as $HOME, and the paramiko fallback
when the OpenSSH client is missing (said once)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from handoff import console
from handoff.config.inventory import load_inventory
from handoff.host.targets import resolve
from handoff.ssh import ssh_config

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HANDOFF_STATE_DIR", str(tmp_path / "state"))
    ssh_config.clear_cache()
    yield home
    ssh_config.clear_cache()


def write_config(home: Path, text: str, **included: str) -> None:
    (home / ".ssh" / "config").write_text(text)
    (home / ".ssh" / "config").chmod(0o600)
    for name, body in included.items():
        (home / ".ssh" / "conf.d" / name).write_text(body)


def test_included_alias_resolves(home: Path) -> None:
    write_config(home, "Include conf.d/*.conf\n",
                 **{"team.conf": "Host gpu-box\n  HostName 127.0.0.61\n  Port 2261\n  User trainer\n"})
    cfg = ssh_config.lookup("gpu-box")
    assert (cfg.hostname, cfg.port, cfg.user) == ("127.0.0.61", 2261, "trainer")
    assert ssh_config.is_alias("gpu-box") and not ssh_config.is_alias("not-configured")


def test_included_block_rewriting_an_address_like_name(home: Path) -> None:
    """`ssh 127.0.0.99` goes where the included block says; so does fab."""
    write_config(home, "Include ~/.ssh/conf.d/nat.conf\n",
                 **{"nat.conf": "Host 127.0.0.99\n  HostName 127.0.0.62\n  Port 2262\n"})
    cfg = ssh_config.lookup("127.0.0.99")
    assert (cfg.hostname, cfg.port) == ("127.0.0.62", 2262)


def test_match_wildcards_and_first_value_wins(home: Path) -> None:
    write_config(home, "Host web-*\n  User first\n  IdentitiesOnly yes\n"
                       "Host web-1\n  User second\n  HostName 127.0.0.63\n"
                       "Match host 127.0.0.63\n  Port 2263\n")
    cfg = ssh_config.lookup("web-1")
    assert (cfg.hostname, cfg.port, cfg.user, cfg.identities_only) == ("127.0.0.63", 2263, "first", True)


def test_inventory_values_override_as_command_line_options(home: Path) -> None:
    write_config(home, "Host box\n  HostName 127.0.0.64\n  Port 2264\n  User cfg\n"
                       "  IdentityFile ~/.ssh/id_cfg\n")
    (home / ".ssh" / "id_inv").write_text("")  # ssh drops an -i file that does not exist
    cfg = ssh_config.lookup("box", 2299, "inv", "~/.ssh/id_inv")
    assert (cfg.port, cfg.user) == (2299, "inv")
    assert cfg.identity_files == (str(home / ".ssh" / "id_inv"), str(home / ".ssh" / "id_cfg"))


def test_known_hosts_files_and_proxy_settings(home: Path) -> None:
    write_config(home, "Host jumpy\n  ProxyJump a@127.0.0.1:22,b\n"
                       "  UserKnownHostsFile ~/.ssh/kh1 ~/.ssh/kh2\n"
                       "  GlobalKnownHostsFile /tmp/handoff-global-kh\n"
                       "Host proxied\n  ProxyCommand nc %h %p\n")
    cfg = ssh_config.lookup("jumpy")
    assert cfg.proxy_jump == ("a@127.0.0.1:22", "b")
    assert cfg.user_known_hosts == (str(home / ".ssh" / "kh1"), str(home / ".ssh" / "kh2"))
    assert cfg.global_known_hosts == ("/tmp/handoff-global-kh",)
    assert ssh_config.lookup("proxied").proxy_command == "nc %h %p"
    # ssh's defaults when nothing is set: the user's files under $HOME, the global ones
    plain = ssh_config.lookup("plain")
    assert plain.user_known_hosts[0] == str(home / ".ssh" / "known_hosts")
    assert "/etc/ssh/ssh_known_hosts" in plain.global_known_hosts


def test_a_broken_config_is_reported_like_ssh_does(home: Path) -> None:
    write_config(home, "Host x\n  NoSuchOption yes\n")
    from handoff.errors import TargetError

    with pytest.raises(TargetError, match=r"NoSuchOption|Bad configuration option"):
        ssh_config.lookup("x")


def test_fallback_to_paramiko_without_the_client(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    write_config(home, "Host box\n  HostName 127.0.0.65\n  Port 2265\n")
    monkeypatch.setattr(ssh_config, "ssh_client", lambda: None)
    monkeypatch.setattr(ssh_config, "_warned", type(ssh_config._warned)())
    console._err_console = None
    first = ssh_config.lookup("box")
    ssh_config.lookup("other")
    assert (first.hostname, first.port, first.source) == ("127.0.0.65", 2265, "paramiko")
    err = capfd.readouterr().err
    assert err.count("OpenSSH client (`ssh`) is not installed") == 1


def test_targets_resolve_many_names_in_one_batch(home: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(home, "".join(f"Host h{i}\n  HostName 127.0.1.{i}\n" for i in range(1, 9)))
    inv = tmp_path / "hosts.yml"
    inv.write_text("hosts: {}\n")
    monkeypatch.setenv("HANDOFF_INVENTORY", str(inv))
    targets = resolve(",".join(f"h{i}" for i in range(1, 9)), load_inventory())
    assert [t.endpoint.hostname for t in targets] == [f"127.0.1.{i}" for i in range(1, 9)]
    assert targets.source == "flag" and "named with --host/-H" in targets.describe()
