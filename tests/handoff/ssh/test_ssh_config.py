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


@pytest.mark.parametrize("name", ["i-0a1b2c;touch /tmp/x;#", "a b", "$(id)", "-oProxyCommand=x",
                                  "a`id`", "x|y", "a\nb"])
def test_the_fallback_refuses_a_name_a_shell_would_run(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path, name: str) -> None:
    """Issue 31, finding 5: paramiko substitutes `%h` into ProxyCommand unquoted; a name with a
    shell metacharacter (OpenSSH refuses those too) is refused before anything runs."""
    from handoff.errors import TargetError
    from handoff.ssh import connect
    from handoff.ssh.endpoint import Endpoint

    ran = tmp_path / "ran"
    write_config(home, f'Host *\n  ProxyCommand sh -c "touch {ran}; true %h"\n')
    monkeypatch.setattr(ssh_config, "ssh_client", lambda: None)
    with pytest.raises(TargetError, match="refused before anything runs"):
        ssh_config.lookup(name)
    with pytest.raises(TargetError, match="refused before anything runs"):
        connect._expand_proxy_command("nc %h %p", Endpoint(hostname=name, port=22, user="u"))
    with pytest.raises(TargetError, match="user name"):
        connect._expand_proxy_command("ssh -W %h:%p %r@jump", Endpoint(hostname="ok", port=22, user=name))
    assert not ran.exists()
    assert connect._expand_proxy_command("nc %h %p", Endpoint(hostname="i-0a1b2c.example", port=22,
                                                              user="u")) == "nc i-0a1b2c.example 22"


def test_targets_resolve_many_names_in_one_batch(home: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(home, "".join(f"Host h{i}\n  HostName 127.0.1.{i}\n" for i in range(1, 9)))
    inv = tmp_path / "hosts.yml"
    inv.write_text("hosts: {}\n")
    monkeypatch.setenv("HANDOFF_INVENTORY", str(inv))
    targets = resolve(",".join(f"h{i}" for i in range(1, 9)), load_inventory())
    assert [t.endpoint.hostname for t in targets] == [f"127.0.1.{i}" for i in range(1, 9)]
    assert targets.source == "flag" and "named with --host/-H" in targets.describe()


# -- one `ssh -G` for the names no Host line singles out ------------------------------------------

def counting_ssh_g(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names `ssh -G` is really run for, from now on (the real ssh still answers)."""
    asked: list[str] = []
    real = ssh_config._run_ssh_g

    def run(client: str, name: str, *args: object) -> dict[str, list[str]]:
        asked.append(name)
        return real(client, name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ssh_config, "_run_ssh_g", run)
    return asked


def ssh_itself(name: str, port: int | None = None, user: str | None = None,
               identity: str | None = None) -> ssh_config.HostConfig:
    """What a fork of `ssh -G` says for this name: the answer every lookup must equal."""
    client = ssh_config.ssh_client()
    assert client is not None
    return ssh_config._from_ssh_g(name, ssh_config._run_ssh_g(client, name, port, user, identity))


FLEET = [("127.0.0.71", 2271, "alice"), ("127.0.0.72", None, None), ("127.0.0.73", 2273, None),
         ("box.example", None, "bob"), ("127.0.0.74", 22, "carol")]


def test_a_fleet_no_host_line_names_shares_two_ssh_g(home: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Addresses that no Host line names get exactly ssh's answer, from two forks in all;
    a name a Host line does name still asks ssh for itself."""
    (home / ".ssh" / "id_fleet").write_text("")
    write_config(home, "Host *\n  User everyone\n  ConnectTimeout 7\n"
                       "Include conf.d/*.conf\nHost gpu-?\n  Port 2299\n",
                 **{"jump.conf": "Host 127.0.0.79\n  ProxyJump a@127.0.0.1:22\n"})
    asked = counting_ssh_g(monkeypatch)
    got = [ssh_config.lookup(n, p, u, "~/.ssh/id_fleet") for n, p, u in FLEET]
    named = [ssh_config.lookup(n, None, None, "~/.ssh/id_fleet") for n in ("gpu-1", "127.0.0.79")]
    assert len(asked) == 2 + 2  # the two references, then gpu-1 and 127.0.0.79 themselves
    assert asked[2:] == ["gpu-1", "127.0.0.79"]
    assert got == [ssh_itself(n, p, u, "~/.ssh/id_fleet") for n, p, u in FLEET]
    assert got[1].user == "everyone" and got[0].user == "alice" and got[1].connect_timeout == 7
    assert got[0].identity_files[0] == str(home / ".ssh" / "id_fleet")
    assert named == [ssh_itself(n, None, None, "~/.ssh/id_fleet") for n in ("gpu-1", "127.0.0.79")]
    assert named[0].port == 2299 and named[1].proxy_jump != ()


@pytest.mark.parametrize("config", [
    "Match host 127.0.0.7*\n  Port 2270\n",                       # only ssh evaluates Match
    "Host *\n  IdentityAgent /tmp/handoff-agent-%h\n",            # a setting that follows the name
    "Host *\n  UserKnownHostsFile ~/.ssh/kh_%r_%p\n",             # ... the user and the port
    "Host *\n  Hostname %h.internal\n",                           # the address itself rewritten
    "CanonicalizeHostname yes\nCanonicalDomains example\n",       # a name may become another
    "Include ${HOME}/.ssh/conf.d/*.conf\n",                       # an Include only ssh expands
])
def test_what_only_ssh_can_follow_asks_ssh_for_every_name(
        home: Path, monkeypatch: pytest.MonkeyPatch, config: str) -> None:
    write_config(home, config)
    asked = counting_ssh_g(monkeypatch)
    got = [ssh_config.lookup(n, p, u) for n, p, u in FLEET]
    own = [n for n in asked if not n.startswith("handoff-")]
    assert own == [n for n, _, _ in FLEET]
    assert got == [ssh_itself(n, p, u) for n, p, u in FLEET]


def test_a_token_ssh_leaves_for_later_reads_the_same_for_every_name(home: Path) -> None:
    """`ssh -G` prints IdentityFile's `%h` as written (ssh expands it when it connects): the
    same text for every name, so sharing the answer gives exactly what ssh gives."""
    write_config(home, "Host *\n  IdentityFile ~/.ssh/id_%h\n")
    assert [ssh_config.lookup(n, p, u) for n, p, u in FLEET] == [ssh_itself(n, p, u) for n, p, u in FLEET]


def test_a_pattern_that_may_depend_on_case_is_not_guessed(home: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`Host BOX.*`: whether ssh compares cases is ssh's business: such names ask it."""
    write_config(home, "Host BOX.*\n  Port 2280\n")
    asked = counting_ssh_g(monkeypatch)
    got = [ssh_config.lookup("box.example"), ssh_config.lookup("127.0.0.71")]
    assert "box.example" in asked and "127.0.0.71" not in asked
    assert got == [ssh_itself("box.example"), ssh_itself("127.0.0.71")]


def test_config_scan_reads_host_lines_as_ssh_matches_them(tmp_path: Path) -> None:
    from handoff.ssh import config_scan

    config = tmp_path / "config"
    config.write_text("Host *.corp !db.corp\n  User x\nHost=web? \"api,api2\"\n# Host 127.*\n")
    scan = config_scan.scan([str(config)], [str(tmp_path)])
    assert scan is not None
    assert scan.host_lines == (("*.corp", "!db.corp"), ("web?", "api", "api2"))
    assert scan.same("127.0.0.1", "other.invalid")
    assert not scan.same("app.corp", "other.invalid") and scan.same("db.corp", "other.invalid")
    assert not scan.same("web1", "web") and not scan.same("api2", "other.invalid")
    (tmp_path / "deep").write_text(f"Include {tmp_path}/deep\n")  # a loop: deeper than ssh allows
    assert config_scan.scan([str(tmp_path / "deep")], [str(tmp_path)]) is None
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "more").write_text("Host 127.0.0.*\n")  # relative: under ~/.ssh
    (tmp_path / "top").write_text("Include more\n")
    scan = config_scan.scan([str(tmp_path / "top")], [str(tmp_path)])
    assert scan is not None and not scan.same("127.0.0.5", "other.invalid")
