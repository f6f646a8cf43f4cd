"""The sandbox itself: real sshd containers, throwaway users, keyring and teardown."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from handoff.testing.sandbox import Sandbox
from tests.integration.conftest import REPO, clean_env


def ssh(sbx: Sandbox, name: str, command: str) -> subprocess.CompletedProcess[str]:
    """OpenSSH itself, with only the sandbox's files: proves ssh_config/known_hosts are right."""
    return subprocess.run(
        ["ssh", "-F", str(sbx.ssh_config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
         name, command],
        capture_output=True, text=True, env=clean_env(sbx), timeout=30, check=False)


def test_containers_are_reachable_as_unprivileged_users_with_aiohttp(sandbox: Sandbox) -> None:
    assert len(sandbox.containers) == 3
    addresses = {c.address for c in sandbox.containers}
    assert len(addresses) == 3 and all(a.startswith("127.0.0.") for a in addresses)
    for c in sandbox.containers:
        probe = ssh(sandbox, c.name, f"id -u; pwd; {c.python} -c 'import aiohttp; print(1)'")
        assert probe.returncode == 0, probe.stderr
        uid, home, ok = probe.stdout.split()
        assert int(uid) == pwd.getpwnam(c.user).pw_uid != 0
        assert Path(home) == c.home and ok == "1"
        assert c.host_key_fingerprint.startswith("SHA256:")


def test_inventory_names_every_container_with_sandbox_vars(sandbox: Sandbox) -> None:
    import yaml

    data = yaml.safe_load(sandbox.inventory.read_text())
    assert set(data["hosts"]) == {c.name for c in sandbox.containers}
    for c in sandbox.containers:
        entry = data["hosts"][c.name]
        assert (entry["address"], entry["port"], entry["user"]) == (c.address, c.port, c.user)
        assert entry["roles"] == ["generator"]
        assert entry["vars"]["base_url"] == sandbox.api_url.rstrip("/")
        assert entry["vars"]["base_url"].startswith("http://127.0.0.1:")
        assert entry["vars"]["python"] == c.python


def test_keyring_holds_the_key_and_env_never_does(sandbox: Sandbox) -> None:
    assert sandbox.keyring_backend in ("SecretService", "PlaintextKeyring")
    env = sandbox.env()
    assert all(sandbox.api_key not in v for v in env.values())
    assert env["HOME"] == str(sandbox.home) and not env["HOME"].startswith("/root/.")
    read = subprocess.run(
        [sys.executable, "-c",
         "import keyring, hashlib; k = keyring.get_password('openrouter', 'api-key'); "
         "print(type(keyring.get_keyring()).__name__, hashlib.sha256(k.encode()).hexdigest())"],
        capture_output=True, text=True, env=clean_env(sandbox), check=True, cwd=REPO)
    import hashlib

    assert read.stdout.split()[-1] == hashlib.sha256(sandbox.api_key.encode()).hexdigest()
    if sandbox.keyring_backend == "SecretService":
        assert "DBUS_SESSION_BUS_ADDRESS" in env and "PYTHON_KEYRING_BACKEND" not in env


def test_fake_api_answers_with_the_sandbox_key(sandbox: Sandbox) -> None:
    import json
    import urllib.request

    request = urllib.request.Request(sandbox.api_url + "/key",
                                     headers={"Authorization": f"Bearer {sandbox.api_key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        assert "data" in json.loads(response.read())


def test_breaking_and_repairing_hosts(make_sandbox) -> None:
    sbx = make_sandbox(hosts=2, api=False, keyring="file")
    assert sbx.keyring_backend == "PlaintextKeyring"
    assert ssh(sbx, "sbx-1", "true").returncode == 0

    sbx.stop_container("sbx-1")
    down = ssh(sbx, "sbx-1", "true")
    assert down.returncode == 255 and "refused" in down.stderr
    assert ssh(sbx, "sbx-2", "true").returncode == 0
    sbx.start_container("sbx-1")
    assert ssh(sbx, "sbx-1", "true").returncode == 0

    before = sbx.container("sbx-1").host_key_fingerprint
    sbx.rotate_host_key("sbx-1")
    assert sbx.container("sbx-1").host_key_fingerprint != before
    changed = ssh(sbx, "sbx-1", "true")
    assert changed.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in changed.stderr
    sbx.trust_current_key("sbx-1")
    assert ssh(sbx, "sbx-1", "true").returncode == 0

    sbx.forget_host_key("sbx-2")
    assert "No ED25519 host key is known" in ssh(sbx, "sbx-2", "true").stderr

    hold = subprocess.Popen(["ssh", "-F", str(sbx.ssh_config), "sbx-1", "sleep 60"],
                            env=clean_env(sbx), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    assert sbx.drop_connections("sbx-1") >= 1
    assert hold.wait(10) == 255


def test_close_removes_users_processes_and_files(tmp_path: Path) -> None:
    root = tmp_path / "sbx"
    with Sandbox(root, hosts=2, api=False, keyring="file") as sbx:
        users = [c.user for c in sbx.containers]
        job = ssh(sbx, "sbx-1", "setsid nohup sleep 300 >/dev/null 2>&1 </dev/null & echo $!")
        assert job.returncode == 0
        pid = int(job.stdout.strip())
        assert Path(f"/proc/{pid}").exists()
    for user in users:
        with pytest.raises(KeyError):
            pwd.getpwnam(user)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert not root.exists()
    sbx.close()  # idempotent


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_on_the_cli_tears_everything_down(tmp_path: Path, inherited: str) -> None:
    """Also when SIGINT arrives ignored, as for a job started in the background of a script."""
    root = tmp_path / "cli"

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        [sys.executable, "-m", "handoff.testing.sandbox", "up", "--hosts", "1", "--no-api",
         "--keyring", "file", "--root", str(root)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=ignore_sigint if inherited == "ignored" else None)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Ctrl-C" in line:
            break
    text = "".join(lines)
    assert "export HANDOFF_INVENTORY=" in text and "sk-or-v1-" not in text
    user = next(line.split()[1].split("@")[0] for line in lines if "sbx-1:" in line)
    pwd.getpwnam(user)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    with pytest.raises(KeyError):
        pwd.getpwnam(user)
    assert not (root / "sshd").exists()


def test_not_root_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from handoff.testing.sandbox import SandboxError

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxError, match="must run as root"):
        Sandbox(tmp_path / "never").start()
    assert not (tmp_path / "never").exists()


# `sandbox clean` ends every leftover sandbox user's processes on the machine, so beside other
# workers' tests it can take (or be raced for) leftovers that are not its own: run alone.
@pytest.mark.serial
def test_leftovers_of_a_killed_sandbox_are_cleaned(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "handoff.testing.sandbox", "up", "--hosts", "1", "--no-api",
         "--keyring", "file", "--root", str(tmp_path / "crashed")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Ctrl-C" in line:
            break
    user = next(line.split()[1].split("@")[0] for line in lines if "sbx-1:" in line)
    proc.kill()  # no teardown at all: the user and its sshd stay behind
    proc.wait(10)
    pwd.getpwnam(user)
    clean = subprocess.run([sys.executable, "-m", "handoff.testing.sandbox", "clean"], cwd=REPO,
                           capture_output=True, text=True, check=True, timeout=60)
    assert f"user {user}" in clean.stdout and "sshd pid" in clean.stdout
    with pytest.raises(KeyError):
        pwd.getpwnam(user)
