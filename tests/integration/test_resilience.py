"""§13 resilience proofs against real sshd containers: a host down, a connection dropped in
the middle of an upload, cleanup of hosts that left the inventory."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from tests.integration.conftest import explain, key_file, remote_dir, run_as, wait_until

OK_CELL = re.compile(r"[│|]\s*ok\s*[│|]")  # a table cell saying just "ok"


def summary_lines(text: str, host: str) -> list[str]:
    """The lines naming `host` in the summary table that ends a multi-host task."""
    tail = text[text.lower().rfind("summary"):] if "summary" in text.lower() else ""
    return [line for line in tail.splitlines() if re.search(rf"\b{re.escape(host)}\b", line)]


def drop_from_inventory(sbx: Any, name: str) -> None:
    data = yaml.safe_load(sbx.inventory.read_text())
    del data["hosts"][name]
    sbx.inventory.write_text(yaml.safe_dump(data, sort_keys=False))


def drop_from_ssh_config(sbx: Any, name: str) -> None:
    blocks = sbx.ssh_config.read_text().split("\n\n")
    sbx.ssh_config.write_text("\n\n".join(b for b in blocks if not b.startswith(f"Host {name}\n")))


# -- one host down -------------------------------------------------------------------------------

def test_one_host_down_the_others_deploy_and_the_summary_names_it(make_sandbox, fab) -> None:
    sbx = make_sandbox(hosts=3, api=False)
    sbx.stop_container("sbx-2")

    started = time.monotonic()
    result = fab.on(sbx, "deploy")   # no --host: the inventory's three hosts
    elapsed = time.monotonic() - started

    assert result.rc != 0, explain(result)
    dead = summary_lines(result.text, "sbx-2")
    assert dead, f"the summary does not name sbx-2:\n{explain(result)}"
    assert any(re.search(r"fail|refused|unreachable|error|down", line, re.I) for line in dead)
    assert not any(OK_CELL.search(line) for line in dead), dead
    for name in ("sbx-1", "sbx-3"):
        c = sbx.container(name)
        assert key_file(c).stat().st_mode & 0o777 == 0o600
        assert (remote_dir(c) / "current" / "payload.pyz").is_file()
        assert any(OK_CELL.search(line) for line in summary_lines(result.text, name))
    assert not remote_dir(sbx.container("sbx-2")).exists()
    assert elapsed < 30, "a refused connection must not wait for the connect timeout"


def test_a_silent_host_times_out_without_holding_up_the_others(make_sandbox, fab) -> None:
    """A host whose port accepts but never answers (a black hole, not a refusal) costs the
    connect timeout (about 10 s) and is reported; the other host deploys meanwhile."""
    sbx = make_sandbox(hosts=2, api=False, keyring="file")
    silent = socket.create_server((sbx.container("sbx-2").address, 0))  # never accept()ed
    try:
        data = yaml.safe_load(sbx.inventory.read_text())
        data["hosts"]["sbx-2"]["port"] = silent.getsockname()[1]
        sbx.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
        started = time.monotonic()
        result = fab.on(sbx, "deploy", timeout=90)
        elapsed = time.monotonic() - started
    finally:
        silent.close()
    assert result.rc != 0, explain(result)
    assert key_file(sbx.container("sbx-1")).exists()
    assert summary_lines(result.text, "sbx-2"), explain(result)
    assert not any(OK_CELL.search(line) for line in summary_lines(result.text, "sbx-2"))
    assert 5 < elapsed < 40, f"took {elapsed:.1f} s: the connect timeout should be about 10 s"


# -- a connection dropped mid-upload ---------------------------------------------------------------

class ThrottledProxy:
    """A TCP proxy on loopback in front of one sshd. Client→server bytes are paced at `rate`
    bytes/s (None: unpaced) so an upload takes long enough to be cut in its middle; `cut()`
    resets every connection at once, as a network drop would."""

    def __init__(self, address: str, target: tuple[str, int], rate: float | None) -> None:
        self.rate = rate
        self.target = target
        self.listener = socket.create_server((address, 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, paced: bool) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = src.recv(4096)
                if not data:
                    break
                dst.sendall(data)
                if paced and self.rate:
                    time.sleep(len(data) / self.rate)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        with self._lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    # linger 0: close() sends RST, like a dropped link, not a polite FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.close()
            self.sockets.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def _partial_uploads(releases: Path, old: str) -> list[tuple[Path, int]]:
    found = []
    for folder in releases.glob("*"):
        if folder.name == old:
            continue
        for entry in folder.iterdir() if folder.is_dir() else []:
            with contextlib.suppress(FileNotFoundError):
                if entry.name != "payload.pyz":
                    found.append((entry, entry.stat().st_size))
    return found


def test_connection_dropped_mid_upload_leaves_current_intact(make_sandbox, fab) -> None:
    from handoff.ops.releases import build

    sbx = make_sandbox(hosts=1, api=False, keyring="file")
    c = sbx.container("sbx-1")
    rd, old = remote_dir(c), "0ldrelease00"
    # The host runs an earlier release: `current` → releases/0ldrelease00.
    run_as(c, "mkdir", "-p", str(rd / "releases" / old))
    run_as(c, "sh", "-c", f"printf old > {rd}/releases/{old}/payload.pyz && "
                          f"ln -s releases/{old} {rd}/current")
    size = build().size
    # fab reaches the host through the proxy: the inventory's port wins over ssh_config, and
    # the proxy's [address]:port is given the host's real key (it is the same sshd behind it).
    proxy = ThrottledProxy(c.address, (c.address, c.port), rate=size / 2.5)
    try:
        data = yaml.safe_load(sbx.inventory.read_text())
        data["hosts"]["sbx-1"]["port"] = proxy.port
        sbx.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
        with sbx.known_hosts.open("a") as fh:
            fh.write(sbx.known_hosts_line("sbx-1", port=proxy.port) + "\n")

        proc = fab.popen(sbx, "push-script", "--host", "sbx-1")
        caught = wait_until(lambda: bool(_partial_uploads(rd / "releases", old)), 60, 0.01)
        # The temp file exists; its bytes are on their way through the paced link (2.5 s for
        # all of them). They may land as one SFTP write (handoff.ssh.sftp sends up to 255 KiB
        # per request), so the file can still be empty when the link drops.
        time.sleep(0.8)
        partial = _partial_uploads(rd / "releases", old)
        proxy.cut()  # the link drops while the release is half uploaded
        out, err = proc.communicate(timeout=60)
        assert caught and partial, f"never saw the upload in progress:\n{out}\n{err}"
        assert all(n < size for _, n in partial), (partial, size)
        assert proc.returncode != 0, f"{out}\n{err}"

        # `current` still points at the old, complete release; no half release is published.
        assert os.readlink(rd / "current") == f"releases/{old}"
        assert (rd / "current" / "payload.pyz").read_text() == "old"
        assert [p for p in (rd / "releases").glob("*/payload.pyz") if p.parent.name != old] == []

        # The next push (link back up, unpaced) completes the job and switches `current`.
        proxy.rate = None
        again = fab.on(sbx, "push-script", "--host", "sbx-1")
        assert again.rc == 0, explain(again)
        target = os.readlink(rd / "current")
        assert target != f"releases/{old}"
        published = (rd / target / "payload.pyz").read_bytes()
        assert hashlib.sha256(published).hexdigest().startswith(Path(target).name)
    finally:
        proxy.close()


# -- cleanup driven by the ledger ----------------------------------------------------------------

def test_cleanup_reaches_hosts_that_left_the_inventory(make_sandbox, fab) -> None:
    sbx = make_sandbox(hosts=2, api=False)
    deployed = fab.on(sbx, "deploy")
    assert deployed.rc == 0, explain(deployed)
    one, two = sbx.container("sbx-1"), sbx.container("sbx-2")
    assert key_file(one).exists() and key_file(two).exists()

    # sbx-2 leaves the inventory and ssh_config; only the ledger remembers where its key lies.
    drop_from_inventory(sbx, "sbx-2")
    drop_from_ssh_config(sbx, "sbx-2")
    # ... and sbx-1 is down at cleanup time.
    sbx.stop_container("sbx-1")
    first = fab.on(sbx, "cleanup-secrets")
    assert first.rc != 0, explain(first)
    assert "sbx-1" in first.text, explain(first)
    assert not key_file(two).exists(), "the departed host's key was not removed"
    assert key_file(one).exists()

    # sbx-1 comes back: the ledger still lists its key, and the next cleanup removes it.
    sbx.start_container("sbx-1")
    second = fab.on(sbx, "cleanup-secrets")
    assert second.rc == 0, explain(second)
    assert not key_file(one).exists()

    third = fab.on(sbx, "cleanup-secrets")   # idempotent
    assert third.rc == 0, explain(third)
    assert "absent" in third.text.lower(), explain(third)
