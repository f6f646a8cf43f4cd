"""Issue 8 on real sshd: exactly the hosts asked for, and SSH as OpenSSH users know it.

Each numbered case of the issue is reproduced against the loopback sandbox and shown fixed:
Fabric's -H/--hosts (1), a failed deploy and the remembered hosts (2), known_hosts lines
ssh can and cannot use (4), the RSA-only entry (5), ProxyJump with two hops and ProxyCommand
(6), Include and GlobalKnownHostsFile (7), the trust-host hint for a jump host (8), a
stalled SFTP server (9), failures without tracebacks and Ctrl-C (10), bad flag and var values
(11), output through a pipe (12). Where ssh itself decides (host keys, ssh_config), the test
runs the real `ssh` client next to fab and expects the same verdict.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import REPO, clean_env, explain, key_file
from tests.support.fab import FAB
from tests.support.listener import Listener, write_relay

AUTH_EVIDENCE = re.compile(r"publickey|Accepted|authenticating user|Failed|Postponed", re.I)


def ssh_ok(sbx: Any, name: str, *extra: str) -> bool:
    """Does the real OpenSSH client log in to `name` with the sandbox's ssh_config?"""
    proc = subprocess.run(["ssh", "-F", str(sbx.ssh_config), "-o", "BatchMode=yes",
                           "-o", "ConnectTimeout=5", *extra, name, "true"],
                          capture_output=True, text=True, timeout=30, check=False,
                          env=clean_env(sbx))
    return proc.returncode == 0


def reach(sbx: Any, fab: Any, name: str) -> dict[str, Any]:
    """`fab status --host NAME --json` for a name outside the inventory: its record says
    whether fab logged in and read the host (state "none": no job yet) or not."""
    result = fab.on(sbx, "status", "--host", name, "--json")
    records = [json.loads(line) for line in result.out.splitlines() if line.startswith("{")]
    assert len(records) == 1 and "Traceback" not in result.text, explain(result)
    return {**records[0], "result": result}


def set_vars(sbx: Any, name: str, **values: Any) -> None:
    data = yaml.safe_load(sbx.inventory.read_text())
    data["hosts"][name].setdefault("vars", {}).update(values)
    sbx.inventory.write_text(yaml.safe_dump(data, sort_keys=False))


def add_ssh_config(sbx: Any, text: str, *, first: bool = False) -> None:
    current = sbx.ssh_config.read_text()
    sbx.ssh_config.write_text(text + "\n" + current if first else current + "\n" + text + "\n")


# -- 1. Fabric's own host flags --------------------------------------------------------------------

def test_dash_h_acts_on_exactly_the_named_hosts(make_sandbox, fab) -> None:
    sbx = make_sandbox(hosts=3, api=False)
    placed = fab.on(sbx, "-H", "sbx-2", "push-key")
    assert placed.rc == 0, explain(placed)
    assert [key_file(c).exists() for c in sbx.containers] == [False, True, False]
    assert "hosts: sbx-2 (named with --host/-H)" in placed.err

    planned = fab.on(sbx, "--hosts", "sbx-1,sbx-3", "deploy", "--dry-run")
    assert planned.rc == 0, explain(planned)
    assert "sbx-1 (" in planned.out and "sbx-3 (" in planned.out and "sbx-2" not in planned.out

    # addresses nobody listens on (no connection is made by a dry run): two plans, for them
    raw = fab.on(sbx, "-H", "127.0.0.201,127.0.0.202", "push-script", "--dry-run")
    assert raw.rc == 0, explain(raw)
    assert "127.0.0.201" in raw.out and "127.0.0.202" in raw.out and "sbx-" not in raw.out

    status = fab.on(sbx, "status", "--hosts", "sbx-1", "--json")
    records = [json.loads(line) for line in status.out.splitlines()]
    assert [r["host"] for r in records] == ["sbx-1"], explain(status)

    both = fab.on(sbx, "-H", "sbx-1", "status", "--host", "sbx-3", "--json")
    assert [json.loads(line)["host"] for line in both.out.splitlines()] == ["sbx-3", "sbx-1"]

    for args in (["-H", "sbx-1", "set-key"], ["-H", "sbx-1", "demo"], ["-i", "x", "status"]):
        refused = fab.on(sbx, *args)
        assert refused.rc == 2 and "Traceback" not in refused.text, explain(refused)


# -- 2. a failed deploy keeps the remembered hosts --------------------------------------------------

def test_a_failed_deploy_keeps_the_remembered_targets(make_sandbox, fab) -> None:
    sbx = make_sandbox(hosts=2, api=False)
    assert fab.on(sbx, "deploy", "--host", "sbx-1").rc == 0
    failed = fab.on(sbx, "deploy", "--host", "root@127.0.0.77:2222")
    assert failed.rc != 0 and "remembered hosts are unchanged" in failed.err, explain(failed)
    after = fab.on(sbx, "status", "--json")
    assert [json.loads(line)["host"] for line in after.out.splitlines()] == ["sbx-1"], explain(after)
    assert "remembered from the last successful deploy" in after.err
    # a deploy that fails on one host of two remembers nothing either
    sbx.stop_container("sbx-2")
    assert fab.on(sbx, "deploy", "--host", "sbx-1,sbx-2").rc != 0
    again = fab.on(sbx, "status", "--json")
    assert [json.loads(line)["host"] for line in again.out.splitlines()] == ["sbx-1"]


# -- 4 and 5. known_hosts as OpenSSH reads it -------------------------------------------------------

def test_known_hosts_verdicts_match_the_ssh_client(make_sandbox, fab) -> None:
    """sshd offers ed25519 + ecdsa + rsa host keys and certificates from the sandbox CA. One
    known_hosts holds: a truncated line and an unknown marker (skipped, once warned), an RSA-only
    entry for sbx-1, sbx-2's ed25519 key both listed and marked @revoked, and the CA for sbx-3
    (no plain key).
    ssh connects to sbx-1 and sbx-3 and refuses sbx-2; so does fab, and sbx-2's sshd never
    sees an authentication attempt."""
    sbx = make_sandbox(hosts=3, api=False, host_key_types=("ed25519", "ecdsa", "rsa"), host_ca=True)
    one, _, three = sbx.containers
    truncated = sbx.known_hosts_line("sbx-1", key_type="rsa").replace(f"[{one.address}]", "other.example")[:90]
    sbx.known_hosts.write_text("\n".join([
        truncated,
        "@bogus-marker example.org ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA",
        sbx.known_hosts_line("sbx-1", key_type="rsa"),
        sbx.known_hosts_line("sbx-2", key_type="ed25519"),
        "@revoked * " + sbx.known_hosts_line("sbx-2", key_type="ed25519").split(" ", 1)[1],
        sbx.host_ca_line(f"[{three.address}]:*"),
        "",
    ]))
    log_before = sbx.sshd_log("sbx-2")

    verdicts = {}
    for c in sbx.containers:
        result = fab.on(sbx, "verify", "--host", c.name)
        verdicts[c.name] = (ssh_ok(sbx, c.name), result.rc == 0)
        if c.name == "sbx-2":
            assert "REVOKED" in result.text and "known_hosts:5" in result.text, explain(result)
            assert "CHANGED" not in result.text
        assert "Traceback" not in result.text, explain(result)
        assert result.err.count("skipped 2 line(s)") == 1, explain(result)
    assert verdicts == {"sbx-1": (True, True), "sbx-2": (False, False), "sbx-3": (True, True)}
    new_log = sbx.sshd_log("sbx-2")[len(log_before):]
    assert not AUTH_EVIDENCE.search(new_log.replace("Connection closed by", "")), new_log

    # trust-host agrees: sbx-1 is trusted by its RSA key (no false CHANGED, nothing to re-pin)
    trusted = fab.on(sbx, "trust-host", "--host", "sbx-1")
    assert trusted.rc == 0 and "already trusted" in trusted.out and "CHANGED" not in trusted.text, \
        explain(trusted)
    assert "ssh-rsa" in trusted.out
    # ... and never pins a revoked key
    refused = fab.on(sbx, "trust-host", "--host", "sbx-2", "--yes")
    assert refused.rc != 0 and "REVOKED" in refused.text, explain(refused)


def test_changed_and_unknown_keys_are_refused_before_authentication(make_sandbox, fab) -> None:
    sbx = make_sandbox(hosts=2, api=False, host_key_types=("ed25519", "rsa"))
    sbx.forget_host_key("sbx-2")
    sbx.rotate_host_key("sbx-1")  # known_hosts keeps the old keys
    logs = {c.name: sbx.sshd_log(c.name) for c in sbx.containers}
    result = fab.on(sbx, "verify", "--host", "sbx-1,sbx-2")
    assert result.rc != 0
    assert "HOST KEY CHANGED" in result.text and "ssh-ed25519 SHA256:" in result.text, explain(result)
    assert "unknown host key" in result.text
    for c in sbx.containers:
        new = sbx.sshd_log(c.name)[len(logs[c.name]):]
        assert not AUTH_EVIDENCE.search(new.replace("Connection closed by", "")), (c.name, new)
    assert not ssh_ok(sbx, "sbx-1") and not ssh_ok(sbx, "sbx-2")


# -- 6 and 8. ProxyJump through every hop, ProxyCommand, the jump host's trust-host hint -----------

@pytest.fixture
def relay(tmp_path: Path) -> Path:
    """A ProxyCommand: relays stdin/stdout to HOST PORT and notes that it ran."""
    return write_relay(tmp_path)


def test_two_hop_proxyjump_goes_through_both_bastions(make_sandbox, fab, relay: Path) -> None:
    sbx = make_sandbox(hosts=3, api=False)
    one, _, three = sbx.containers
    add_ssh_config(sbx, "\n".join([
        "Host deep",
        f"    HostName {three.address}", f"    Port {three.port}", f"    User {three.user}",
        f"    IdentityFile {sbx.identity}", "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {sbx.known_hosts}", "    ProxyJump sbx-1,sbx-2",
        "Host viacmd",
        f"    HostName {one.address}", f"    Port {one.port}", f"    User {one.user}",
        f"    IdentityFile {sbx.identity}", f"    UserKnownHostsFile {sbx.known_hosts}",
        f"    ProxyCommand {sys.executable} {relay} %h %p",
    ]))
    before = {c.name: sbx.sshd_log(c.name) for c in sbx.containers}
    deep = reach(sbx, fab, "deep")
    assert deep["state"] == "none", explain(deep["result"])  # logged in, read the host
    assert ssh_ok(sbx, "deep")
    for c in sbx.containers:  # both bastions and the target logged a login
        new = sbx.sshd_log(c.name)[len(before[c.name]):]
        assert f"Accepted publickey for {c.user}" in new, (c.name, new)

    proxied = reach(sbx, fab, "viacmd")
    assert proxied["state"] == "none", explain(proxied["result"])
    assert f"{one.address}:{one.port}" in (relay.parent / "relayed").read_text()

    # An unknown key on the outer bastion: refused, and the hint is a command that works.
    sbx.forget_host_key("sbx-1")
    refused = reach(sbx, fab, "deep")["result"]
    assert "unreachable" in refused.out and "jump host for deep" in refused.text, explain(refused)
    hint = re.search(r"fab (trust-host --host [^\s\"]+)", refused.text)
    assert hint is not None and hint.group(1) == "trust-host --host deep", explain(refused)
    pinned = fab.on(sbx, *hint.group(1).split(), "--yes")
    assert pinned.rc == 0, explain(pinned)
    assert "already trusted" in pinned.out  # sbx-2 and the target were known all along
    assert reach(sbx, fab, "deep")["state"] == "none"


# -- 7. Include, an address-like Host block, GlobalKnownHostsFile -----------------------------------

def test_included_aliases_resolve_as_ssh_resolves_them(make_sandbox, fab, tmp_path: Path) -> None:
    sbx = make_sandbox(hosts=2, api=False)
    one, two = sbx.containers
    conf_d = sbx.ssh_dir / "conf.d"
    conf_d.mkdir()
    global_kh = tmp_path / "ssh_known_hosts"
    global_kh.write_text(sbx.known_hosts_line("sbx-1") + "\n")
    (conf_d / "team.conf").write_text("\n".join([
        "Host inc-box",
        f"    HostName {one.address}", f"    Port {one.port}", f"    User {one.user}",
        f"    IdentityFile {sbx.identity}", "    UserKnownHostsFile /dev/null",
        f"    GlobalKnownHostsFile {global_kh}",
        # an address-like name rewritten to another machine: `ssh 127.0.0.250` goes to sbx-2
        "Host 127.0.0.250",
        f"    HostName {two.address}", f"    Port {two.port}", f"    User {two.user}",
        f"    IdentityFile {sbx.identity}", f"    UserKnownHostsFile {sbx.known_hosts}", ""]))
    add_ssh_config(sbx, "Include ~/.ssh/conf.d/*.conf\n", first=True)

    alias = reach(sbx, fab, "inc-box")
    assert alias["state"] == "none", explain(alias["result"])
    before = sbx.sshd_log("sbx-2")
    rewritten = reach(sbx, fab, "127.0.0.250")
    assert rewritten["state"] == "none", explain(rewritten["result"])
    assert f"Accepted publickey for {two.user}" in sbx.sshd_log("sbx-2")[len(before):]
    assert ssh_ok(sbx, "inc-box") and ssh_ok(sbx, "127.0.0.250")


# -- 9. a stalled SFTP server -----------------------------------------------------------------------

def test_a_stalled_sftp_host_fails_within_the_timeout_while_the_other_finishes(make_sandbox, fab) -> None:
    sbx = make_sandbox(hosts=2, api=False)
    sbx.stall_sftp("sbx-1", 120)
    set_vars(sbx, "sbx-1", io_timeout=3)
    started = time.monotonic()
    result = fab.on(sbx, "push-script", "--host", "sbx-1,sbx-2", timeout=60)
    elapsed = time.monotonic() - started
    assert result.rc != 0, explain(result)
    assert "SFTP" in result.text and "within 3 s" in result.text and "stalled" in result.text, explain(result)
    assert (sbx.container("sbx-2").home / ".handoff" / "current" / "payload.pyz").is_file()
    assert "1/2 hosts ok; failed: sbx-1" in result.out, explain(result)
    assert elapsed < 15, f"took {elapsed:.1f} s"


# -- 10. failures without tracebacks; Ctrl-C ---------------------------------------------------------

@pytest.fixture
def listener(request: pytest.FixtureRequest) -> Iterator[Listener]:
    server = Listener(request.param)
    yield server
    server.close()


@pytest.mark.parametrize("listener, expected", [
    ("silent", "no SSH answer from"),
    ("http", "answered but is not an SSH server (it said 'HTTP/1.1 400 Bad Request')"),
    ("banner", "sent its SSH banner (SSH-2.0-OpenSSH_9.2) and then stopped answering"),
], indirect=["listener"])
def test_a_host_that_is_not_a_working_sshd_gets_one_clear_line(sandbox, fab, listener: Listener,
                                                                expected: str) -> None:
    add_ssh_config(sandbox, f"Host odd-{listener.port}\n    HostName 127.0.0.1\n"
                            f"    Port {listener.port}\n    ConnectTimeout 2\n")
    result = fab("verify", "--host", f"odd-{listener.port}", timeout=30)
    assert result.rc == 1 and expected in result.text, explain(result)
    assert "within 2 s" in result.text or listener.behaviour == "http"
    assert "Traceback" not in result.text and "Exception (client)" not in result.text
    assert "No existing session" not in result.text


@pytest.mark.serial  # Ctrl-C answered < 1 s: run alone (scripts/test's serial pass)
def test_ctrl_c_answers_within_a_second(sandbox, tmp_path: Path) -> None:
    server = Listener("silent")
    try:
        proc = subprocess.Popen([str(FAB), "deploy", "--host",
                                 f"tester@127.0.0.1:{server.port},sbx-1"], cwd=REPO,
                                env=clean_env(sandbox), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)  # connecting: sbx-1 answers, the silent port holds its thread
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        took = time.monotonic() - sent
    finally:
        server.close()
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert took < 1.0, f"Ctrl-C took {took:.2f} s"
    assert "Traceback" not in out + err and "interrupted" in err


def test_an_encrypted_key_without_agent_says_ssh_add(make_sandbox, fab) -> None:
    """The inventory names an encrypted key and nothing else (no ssh_config block adds one;
    with -i, ssh uses no default key either): no key can be offered, and the message says so."""
    sbx = make_sandbox(hosts=1, api=False)
    locked = sbx.ssh_dir / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "not typed here", "-f", str(locked)],
                   check=True)
    data = yaml.safe_load(sbx.inventory.read_text())
    data["hosts"]["sbx-1"]["identity"] = str(locked)
    sbx.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    sbx.ssh_config.write_text("# no blocks: the inventory says everything\n")
    result = fab.on(sbx, "verify", "--host", "sbx-1")
    assert result.rc == 1, explain(result)
    assert f"encrypted key {locked} and no agent: add it with `ssh-add {locked}`" in result.text, \
        explain(result)


# -- 11. flags and vars -------------------------------------------------------------------------------

@pytest.mark.parametrize("args, flag", [
    (["launch", "--concurrency", "abc", "--dry-run"], "--concurrency"),
    (["launch", "--max-cost", "ten", "--dry-run"], "--max-cost"),
    (["logs", "--lines", "ten"], "--lines"),
    (["status", "--interval", "fast"], "--interval"),
    (["stop", "--timeout", "x", "--dry-run"], "--timeout"),
    (["demo", "--hosts", "many"], "--hosts"),
])
def test_bad_flag_values_exit_2_naming_the_flag(sandbox, fab, args: list[str], flag: str) -> None:
    result = fab(*args)
    assert result.rc == 2, explain(result)
    assert flag in result.err and "expected" in result.err and "Traceback" not in result.text


def test_a_bad_inventory_var_stops_before_any_host_is_contacted(make_sandbox, fab) -> None:
    sbx = make_sandbox(hosts=1, api=False)
    set_vars(sbx, "sbx-1", concurrency="lots")
    before = sbx.sshd_log("sbx-1")
    result = fab.on(sbx, "launch", "--input", str(REPO / "examples" / "prompts.jsonl"))
    assert result.rc == 2, explain(result)
    line = next(i for i, text in enumerate(sbx.inventory.read_text().splitlines(), 1) if "concurrency" in text)
    assert f"{sbx.inventory}:{line}: var concurrency: expected a whole number >= 1, got 'lots'" in result.err
    assert sbx.sshd_log("sbx-1") == before and "Traceback" not in result.text


# -- 12. output through a pipe -----------------------------------------------------------------------

def test_piped_output_is_never_cut(sandbox, fab) -> None:
    result = fab("launch", "--host", "sbx-1", "--input", str(REPO / "examples" / "prompts.jsonl"),
                 "--job", "a-rather-long-job-name-for-the-table", "--dry-run",
                 env={"COLUMNS": "40"})
    assert result.rc == 0, explain(result)
    assert "…" not in result.out
    command = next(line for line in result.out.splitlines() if "setsid nohup" in line)
    assert "--concurrency" in command and "a-rather-long-job-name-for-the-table" in command
