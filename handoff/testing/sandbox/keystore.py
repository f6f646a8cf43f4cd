"""A throwaway OS keyring for the sandbox, so the real user's keyring is never touched.

Preferred: the real Secret Service (gnome-keyring on a private D-Bus session bus), which
is what a desktop user has. Fallback: keyrings.alt's PlaintextKeyring in a throwaway
XDG_DATA_HOME. Either way the key is stored through the `keyring` library in a child
process whose environment is exactly what `fab` will get, and it travels on stdin.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from handoff.testing.sandbox._system import SandboxError

SECRET_SERVICE = "SecretService"
PLAINTEXT = "PlaintextKeyring"
_FILE_BACKEND = "keyrings.alt.file.PlaintextKeyring"
_SS_BACKEND = "keyring.backends.SecretService.Keyring"

# Runs in a child with the sandbox environment. Reads the key from stdin (never argv),
# stores it with the backend named in argv[1] (or the default one), reads it back through
# keyring's *default* resolution - the one `fab` will use - and prints that backend's name.
_STORE = r"""
import sys, keyring
from keyring.core import load_keyring
service, username, backend = sys.argv[1], sys.argv[2], sys.argv[3]
secret = sys.stdin.read()
store = load_keyring(backend) if backend else keyring.get_keyring()
store.set_password(service, username, secret)
default = keyring.get_keyring()
if default.get_password(service, username) != secret:
    sys.exit("the default keyring backend (%s) does not return the stored entry" % default)
chain = getattr(default, "backends", [default])
found = [b for b in chain if b.get_password(service, username) == secret]
kind = type(found[0] if found else default)
print(kind.__module__ + "." + kind.__qualname__)
"""


@dataclass
class ThrowawayKeyring:
    """Owns the keyring daemons (if any) and knows the environment that selects them."""

    folder: Path                       # HOME-like folder: XDG dirs and the bus socket live here
    mode: str = "auto"                 # auto | secretservice | file
    backend: str = ""                  # SecretService or PlaintextKeyring, once started
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def base_env(self) -> dict[str, str]:
        return {
            "HOME": str(self.folder),
            "XDG_DATA_HOME": str(self.folder / ".local" / "share"),
            "XDG_CONFIG_HOME": str(self.folder / ".config"),
            "XDG_CACHE_HOME": str(self.folder / ".cache"),
            "XDG_RUNTIME_DIR": str(self.folder / ".run"),
        }

    def start(self) -> None:
        for key in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR"):
            Path(self.base_env()[key]).mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.mode not in ("auto", "secretservice", "file"):
            raise SandboxError(f"keyring={self.mode!r}: use 'auto', 'secretservice' or 'file'")
        if self.mode in ("auto", "secretservice"):
            missing = [t for t in ("dbus-daemon", "gnome-keyring-daemon") if not shutil.which(t)]
            if not missing:
                try:
                    self._start_secret_service()
                    return
                except SandboxError as exc:
                    self.stop()
                    if self.mode == "secretservice":
                        raise
                    self.notes.append(f"Secret Service unavailable ({exc}); using a file keyring")
            elif self.mode == "secretservice":
                raise SandboxError(f"keyring='secretservice' needs {', '.join(missing)}: "
                                   "`apt-get install -y dbus gnome-keyring`")
            else:
                self.notes.append(f"no {', '.join(missing)}: using a file keyring")
        # A throwaway plaintext file on purpose: handoff refuses one unless told so.
        self.env = {**self.base_env(), "PYTHON_KEYRING_BACKEND": _FILE_BACKEND,
                    "HANDOFF_ALLOW_PLAINTEXT_KEYRING": "1"}
        self.backend = PLAINTEXT

    def _start_secret_service(self) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.base_env()}
        bus = self.folder / ".run" / "bus"
        # --nofork: the daemon stays our child, so we reap it (a forked one would be left as
        # a zombie of an init that may not reap, e.g. in a container).
        dbus = subprocess.Popen(
            ["dbus-daemon", "--session", "--nofork", "--nopidfile", "--print-address=1",
             f"--address=unix:path={bus}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True)
        self._procs.append(dbus)
        assert dbus.stdout is not None
        address = dbus.stdout.readline().decode().strip()
        if not address:
            raise SandboxError("dbus-daemon printed no address")
        env["DBUS_SESSION_BUS_ADDRESS"] = address
        keyring_daemon = subprocess.Popen(
            ["gnome-keyring-daemon", "--foreground", "--unlock", "--components=secrets"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True)
        self._procs.append(keyring_daemon)
        assert keyring_daemon.stdin is not None
        # The password of the throwaway login keyring: random, used once, never stored.
        keyring_daemon.stdin.write(os.urandom(16).hex().encode())
        keyring_daemon.stdin.close()
        self.env = {**self.base_env(), "DBUS_SESSION_BUS_ADDRESS": address}
        self.backend = SECRET_SERVICE
        self._wait_for_secrets_name(env)

    def _wait_for_secrets_name(self, env: dict[str, str]) -> None:
        deadline = time.monotonic() + 10
        probe = ("import secretstorage, sys; c = secretstorage.dbus_init(); "
                 "sys.exit(0 if secretstorage.check_service_availability(c) else 1)")
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self._procs):
                raise SandboxError("gnome-keyring-daemon or dbus-daemon exited at start")
            ok = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                                check=False, timeout=10)
            if ok.returncode == 0:
                return
            time.sleep(0.05)
        raise SandboxError("the Secret Service did not appear on the private bus within 10 s")

    def store(self, service: str, username: str, secret: str) -> None:
        """Store `secret` and check that keyring's default resolution finds it there."""
        backend = _SS_BACKEND if self.backend == SECRET_SERVICE else _FILE_BACKEND
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.env}
        proc = subprocess.run([sys.executable, "-c", _STORE, service, username, backend],
                              input=secret, capture_output=True, text=True, env=env, check=False,
                              timeout=30)
        if proc.returncode != 0:
            detail = (proc.stderr.strip().splitlines() or ["no output"])[-1].replace(secret, "***")
            raise SandboxError(f"storing the sandbox key in the {self.backend} keyring failed: "
                               f"{detail}")
        found = proc.stdout.strip()
        expected = _SS_BACKEND if self.backend == SECRET_SERVICE else _FILE_BACKEND
        if found != expected:
            raise SandboxError(f"keyring resolves the sandbox entry through {found}, not "
                               f"{expected}: a keyringrc or PYTHON_KEYRING_BACKEND interferes")

    def stop(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(3)
            if proc.stdout:
                proc.stdout.close()
        self._procs.clear()
