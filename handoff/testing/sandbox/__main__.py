"""`python -m handoff.testing.sandbox up --hosts N [--root DIR]`: a sandbox for humans and hacking.

Prints the environment to export in another shell (then `fab deploy`, `fab status`, …
act on the sandbox), and keeps everything up until Ctrl-C or SIGTERM, then tears it down.
`python -m handoff.testing.sandbox clean` removes leftovers of crashed sandboxes.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

from handoff.testing.sandbox import Sandbox, SandboxError, _system


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m handoff.testing.sandbox",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a sandbox and wait until Ctrl-C")
    up.add_argument("--hosts", type=int, default=2, help="number of containers (default 2)")
    up.add_argument("--root", type=Path, default=None,
                    help="folder for everything (default: a new temp dir, removed at the end)")
    up.add_argument("--keyring", choices=("auto", "secretservice", "file"), default="auto")
    up.add_argument("--no-api", action="store_true", help="do not start the fake OpenRouter")
    up.add_argument("--api-latency", type=float, default=0.0, metavar="S",
                    help="seconds the fake API waits before each answer")
    up.add_argument("--management", action="store_true",
                    help="also store a management key the fake API accepts: deploys mint a "
                         "child key per container")
    up.add_argument("--key-limit", type=float, default=None, metavar="USD",
                    help="key_limit in the inventory's defaults (with --management)")
    up.add_argument("--prefix", default="sbx", help="container name prefix (default sbx)")
    up.add_argument("--first-address", type=int, default=2, metavar="N",
                    help="first container listens on 127.0.0.N (default 2)")
    sub.add_parser("clean", help="remove users and sshds left by crashed sandboxes")
    args = parser.parse_args(argv)

    try:
        _system.require_root()
        if args.command == "clean":
            removed = _system.clean_stale()
            print("\n".join(removed) if removed else "nothing to clean")
            return 0
        root = args.root or Path(tempfile.mkdtemp(prefix="handoff-sandbox-"))
        # Started in the background of a script, SIGINT arrives ignored (SIG_IGN is inherited)
        # and Python would not turn it into KeyboardInterrupt: install both handlers.
        signal.signal(signal.SIGTERM, _raise_interrupt)
        signal.signal(signal.SIGINT, _raise_interrupt)
        with Sandbox(root, hosts=args.hosts, api=not args.no_api, keyring=args.keyring,
                     name_prefix=args.prefix, first_address=args.first_address,
                     api_latency_s=args.api_latency, management=args.management,
                     key_limit=args.key_limit) as sbx:
            try:  # from here on, Ctrl-C is the normal way to end: exit 0 after teardown
                print(sbx.describe())
                print("\n# in another shell, to point fab at this sandbox:")
                print("unset SSH_AUTH_SOCK PYTHON_KEYRING_BACKEND DBUS_SESSION_BUS_ADDRESS")
                for key, value in sorted(sbx.env().items()):
                    print(f"export {key}={shlex.quote(value)}")
                print("\n# Ctrl-C tears everything down", flush=True)
                threading.Event().wait()
            except KeyboardInterrupt:
                print("\ntearing down…", file=sys.stderr)
        if args.root is None:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        return 0
    except SandboxError as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
