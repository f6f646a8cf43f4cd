"""`fab demo`: the whole checklist against a throwaway local sandbox.

The demo ends by writing the report of the run it fetched (`fab report`: DIR/report.html
and a page per job) and printing its path.

Two sshd "containers" on 127.0.0.x (throwaway users, client key, known_hosts, all in
a temp dir), the fake OpenRouter on loopback and throwaway keyring entries (an API key and
a management key, so each container gets its own minted, capped child key) come from
`handoff.testing.sandbox.Sandbox`. For the demo's duration this process's HOME, XDG dirs,
keyring selection, inventory and state dir point into the sandbox (and
SSH_AUTH_SOCK is unset), so the user's real ~/.ssh and keyring are never read or
written; everything is restored afterwards. The sandbox is torn down on success,
failure and Ctrl-C alike; the fetched results are kept in `--results`.

This is the one module of the control plane that imports handoff.testing (test support):
the demo IS a run against the test sandbox.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from handoff import console
from handoff.config import paths

PROMPTS = paths.demo_prompts()
DEMO_KEY_LIMIT = 0.5  # USD per container's child key; the demo spends a few hundredths
_SCRUB = ("SSH_AUTH_SOCK", "PYTHON_KEYRING_BACKEND", "DBUS_SESSION_BUS_ADDRESS",
          "HANDOFF_INVENTORY", "HANDOFF_STATE_DIR", "XDG_RUNTIME_DIR")


@contextlib.contextmanager
def sandbox_env(env: dict[str, str]) -> Iterator[None]:
    """Point this process at the sandbox (HOME, XDG, keyring, inventory, state), then restore."""
    saved = {k: os.environ.get(k) for k in {*env, *_SCRUB}}
    for key in _SCRUB:
        os.environ.pop(key, None)
    os.environ.update(env)
    _reset_keyring()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _reset_keyring()


def _reset_keyring() -> None:
    """keyring caches its backend on first use; make it choose again from the current env."""
    try:
        import keyring.core

        keyring.core.init_backend()
    except Exception:
        pass


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _step(title: str) -> None:
    console.say(f"\n[bold magenta]▶ {title}[/]")


def run(hosts: int = 2, results: str = "demo-results", keep: bool = False) -> int:
    from handoff.cli import commands
    from handoff.testing.sandbox import Sandbox, SandboxError

    results_dir = Path(results).expanduser().resolve()
    aside = fresh_results(results_dir)
    if aside is not None:
        console.note(f"the last demo's results moved to {aside}: this run's sandbox is new")
    root = Path(tempfile.mkdtemp(prefix="handoff-demo-"))
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    # Started in the background by a script, SIGINT may arrive ignored; the demo must still
    # tear down on Ctrl-C, so it takes the default (KeyboardInterrupt) handler explicitly.
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    console.install()
    started = time.monotonic()
    try:
        console.say(f"[bold]handoff demo[/]: {hosts} sshd containers + fake OpenRouter on loopback, in {root}")
        # A management key in the sandbox's keyring: each container gets its own child key,
        # capped at DEMO_KEY_LIMIT and expiring, revoked again by cleanup-secrets.
        with Sandbox(root / "sandbox", hosts=int(hosts), api_latency_s=0.4, management=True,
                     key_limit=DEMO_KEY_LIMIT) as sbx:
            console.say(console.r(sbx.describe()))
            names = ",".join(c.name for c in sbx.containers)
            with sandbox_env(sbx.env()):
                steps = [
                    ("deploy: verify → push-script → push-key (a child key minted per "
                     "container)", lambda: commands.deploy(names)),
                    ("smoke-test: one real request per container", lambda: commands.smoke_test(None, None)),
                    (f"launch: {PROMPTS.name} sharded over {hosts} hosts",
                     lambda: commands.launch(None, None, local_input=str(PROMPTS), remote_input=None,
                                        flags={"concurrency": 4})),
                    ("status --wait: until every shard is done",
                     lambda: commands.status(None, None, wait=True, interval=1.0)),
                    (f"fetch → {results_dir}", lambda: commands.fetch(None, None, dest=str(results_dir))),
                    ("cleanup-secrets: remove every placed key and revoke the child keys, verify",
                     lambda: commands.cleanup_secrets()),
                    (f"report → {results_dir / 'report.html'}: the run's pages, with plots",
                     lambda: commands.report(None, None, dest=str(results_dir))),
                ]
                for title, step in steps:
                    _step(title)
                    rc = step()
                    if rc == 130:
                        raise KeyboardInterrupt
                    if rc != 0:
                        console.error(f"demo stopped: step '{title.split(':')[0]}' failed (exit {rc}); "
                                      f"the sandbox is torn down now")
                        return rc
        _summary(results_dir, time.monotonic() - started)
        return 0
    except SandboxError as exc:
        console.error(f"cannot start the sandbox: {exc}")
        return 1
    except KeyboardInterrupt:
        console.error("interrupted: the sandbox was torn down")
        return 130
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
        if not keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        else:
            console.say(f"kept {root}")


def fresh_results(results_dir: Path) -> Path | None:
    """A second demo fetched into the first one's results and called its new sandbox's
    files "unchanged since the last fetch": the old results go to `<dir>.previous` (the
    one before is dropped), so each demo's results are its own. Returns where they went."""
    import shutil

    if not results_dir.is_dir() or not any(results_dir.iterdir()):
        return None
    aside = results_dir.with_name(results_dir.name + ".previous")
    shutil.rmtree(aside, ignore_errors=True)
    results_dir.rename(aside)
    return aside


def _summary(results_dir: Path, seconds: float) -> None:
    rows = []
    # Per host (DIR/<host>/<job>/), then each job merged from its shards (DIR/<job>/).
    shards = sorted(results_dir.glob("*/*/output.jsonl"))
    merged = sorted(results_dir.glob("*/output.jsonl"))
    for out in shards + merged:
        errors = out.with_name("output.errors.jsonl")
        n_err = sum(1 for _ in errors.open()) if errors.exists() else 0
        host = console.r(out.parent.parent.name) if out in shards else "[bold]merged[/]"
        rows.append([host, str(sum(1 for _ in out.open())), str(n_err), console.r(out.parent)])
    console.say(console.table("demo results", ["host", "responses", "errors", "folder"], rows))
    console.say(f"[bold green]demo done[/] in {seconds:.1f} s; results are in {console.r(results_dir)} "
                f"(sandbox removed, child keys revoked)")
    console.say(f"the report: {console.r(results_dir / 'report.html')} (open it in a browser; "
                f"`fab report --dest {console.r(results_dir)}` rebuilds it)")
