"""Connection benchmark: what one SSH connection costs before its first command, with and
without handoff.ssh.connect.QuickAcks, against OpenSSH's `ssh host true`.

One loopback sandbox container (handoff.testing.sandbox: real sshd). Each repetition, in a
rotating order, times on a fresh TCP connection: paramiko's key exchange, the public-key
login, the first channel's open and `exec true` to its exit status; once on the bare socket
(TCP_NODELAY set, as handoff did before QuickAcks) and once on the socket wrapped in
QuickAcks (what handoff.ssh.connect opens now); and OpenSSH's whole `ssh host true`, for
scale. The first channel is where sshd's Nagle waited for our delayed ACK.

    sudo .venv/bin/python benchmarks/connect.py --reps 9
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import paramiko  # noqa: E402

from benchmarks import report as report_md  # noqa: E402
from handoff.ssh import connect  # noqa: E402
from handoff.testing.sandbox import Sandbox  # noqa: E402

PHASES = ("key exchange", "login", "first channel open", "exec true", "total")


def paramiko_once(cfg: dict, quick: bool) -> list[float]:
    """Milliseconds of each phase on one new connection."""
    t0 = time.monotonic()
    sock = socket.create_connection((cfg["hostname"], int(cfg["port"])))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = paramiko.Transport(connect.QuickAcks(sock) if quick else sock)
    try:
        transport.start_client()
        t1 = time.monotonic()
        key = paramiko.Ed25519Key.from_private_key_file(cfg["identityfile"][0])
        transport.auth_publickey(cfg["user"], key)
        t2 = time.monotonic()
        chan = transport.open_session()
        t3 = time.monotonic()
        chan.exec_command("true")
        if chan.recv_exit_status() != 0:
            raise SystemExit("`true` failed on the sandbox")
        t4 = time.monotonic()
    finally:
        transport.close()
    return [1000 * x for x in (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args(argv)
    if not hasattr(socket, "TCP_QUICKACK"):
        raise SystemExit("TCP_QUICKACK is Linux's: nothing to compare here")
    loads = [report_md.load()]
    runs: dict[str, list[list[float]]] = {"bare socket": [], "QuickAcks": []}
    openssh: list[float] = []
    with tempfile.TemporaryDirectory(prefix="handoff-bench-") as tmp:
        with Sandbox(Path(tmp) / "sandbox", hosts=1, api=False, keyring="file") as sbx:
            name = sbx.containers[0].name
            cfg = paramiko.SSHConfig.from_path(str(sbx.ssh_config)).lookup(name)
            ssh = ["ssh", "-F", str(sbx.ssh_config), "-o", "BatchMode=yes", name, "true"]
            for rep in range(args.reps):
                order = ["bare socket", "QuickAcks", "openssh"]
                for case in order[rep % 3:] + order[:rep % 3]:
                    if case == "openssh":
                        t = time.monotonic()
                        subprocess.run(ssh, check=True)
                        openssh.append(1000 * (time.monotonic() - t))
                    else:
                        runs[case].append(paramiko_once(cfg, case == "QuickAcks"))
    loads.append(report_md.load())
    lines = [f"`sudo .venv/bin/python benchmarks/connect.py --reps {args.reps}`; load average "
             f"{loads[0]} at the start, {loads[1]} at the end. Milliseconds, medians of "
             f"{args.reps} new connections each, in a rotating order:", "",
             "| socket | " + " | ".join(PHASES) + " |", "|---|" + "---:|" * len(PHASES)]
    for case, reps in runs.items():
        cells = [f"{statistics.median(r[i] for r in reps):.1f}" for i in range(len(PHASES))]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    lines.append("| OpenSSH `ssh host true` (whole command) | | | | | "
                 f"{statistics.median(openssh):.1f} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
