"""What each `fab` task does, as plain functions returning an exit code.

fabfile.py only parses flags and calls these; tests and `fab demo` call them
directly. Every function catches HandoffError at the top and prints its message
(which names the fix), so no traceback is ever the user interface.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from handoff import console
from handoff.errors import HandoffError, SecretError, UsageError
from handoff.inventory import load_inventory
from handoff.parallel import HostReport
from handoff.targets import Target, resolve


def guarded(fn: Callable[..., int]) -> Callable[..., int]:
    """Turn expected failures into a message and an exit code."""

    def wrapper(*args: Any, **kwargs: Any) -> int:
        console.install()
        try:
            return fn(*args, **kwargs)
        except HandoffError as exc:
            console.error(str(exc))
            return exc.exit_code
        except KeyboardInterrupt:
            console.error("interrupted")
            return 130

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def targets_for(host: str | None, role: str | None, flags: dict[str, Any] | None = None) -> list[Target]:
    inv = load_inventory()
    return resolve(host, inv, role, flags)


def exit_code(reports: list[HostReport]) -> int:
    return 0 if all(r.ok for r in reports) else 1


def _key_entry(targets: list[Target], required: bool) -> tuple[str, str] | None:
    """The keyring (service, username) for the targets whose role takes the key; None when
    none does (extractor-only)."""
    services = {(str(t.vars["secret_service"]), str(t.vars["secret_username"])) for t in targets
                if t.role is None or t.role.secret}
    if not services:
        if required:
            raise UsageError("none of these hosts' roles takes the API key (role `secret:` is none)")
        return None
    if len(services) > 1:
        raise UsageError(f"these hosts use different keyring entries {sorted(services)}; deploy them separately")
    return services.pop()


@guarded
def deploy(
    host: str | None = None,
    role: str | None = None,
    *,
    verify: bool = True,
    script: bool = True,
    key: bool = True,
    install: bool = False,
    dry_run: bool = False,
    title: str = "deploy",
    remember: bool = True,
) -> int:
    """verify → push-script → push-key; each flag set selects one checklist step alone."""
    from handoff import checklist, secrets, state
    from handoff import plan as planmod

    targets = targets_for(host, role)
    entry = _key_entry(targets, required=title == "push-key") if key else None
    if dry_run:
        unavailable = None
        try:
            secret = None if entry is None else secrets.read_key(*entry)
        except SecretError as exc:
            # A dry run still shows the whole plan; the missing key becomes a note in it.
            secret, unavailable = None, str(exc)
        planmod.render(checklist.build(targets, verify=verify, script=script, key=secret,
                                       install=install, title=title, key_unavailable=unavailable))
        return 0
    # Read on a thread while the hosts connect and probe; the plan's changing steps wait.
    pending = None if entry is None else secrets.read_key_soon(*entry)
    plan = checklist.build(targets, verify=verify, script=script, key=pending, install=install,
                           title=title)
    reports = checklist.run(plan)
    failure = None if pending is None else pending.exception()
    if isinstance(failure, SecretError):
        raise failure  # how to store the key: printed once, after the hosts' "nothing changed"
    if remember and host:
        state.save_targets([t.spec for t in targets], role)
    return exit_code(reports)


def verify(host: str | None = None, role: str | None = None, install: bool = False) -> int:
    return deploy(host, role, verify=True, script=False, key=False, install=install,
                  title="verify", remember=False)


def push_script(host: str | None = None, role: str | None = None, dry_run: bool = False) -> int:
    return deploy(host, role, verify=False, script=True, key=False, dry_run=dry_run,
                  title="push-script", remember=False)


def push_key(host: str | None = None, role: str | None = None, dry_run: bool = False) -> int:
    return deploy(host, role, verify=False, script=False, key=True, dry_run=dry_run,
                  title="push-key", remember=False)


@guarded
def set_key(service: str = "openrouter", username: str = "api-key") -> int:
    """Store the key in the OS keyring from a hidden prompt (or stdin when piped)."""
    import getpass

    from handoff import secrets

    if sys.stdin.isatty():
        key = getpass.getpass(f"API key for {service}/{username} (hidden): ")
    else:
        key = sys.stdin.readline()
    key = key.strip()
    if not key:
        raise UsageError("empty key; nothing stored")
    if not key.startswith("sk-"):
        console.warn("that does not look like an OpenRouter key (sk-or-…); storing it anyway")
    secrets.store_key(key, service, username)
    console.say(f"stored key {secrets.fingerprint(key)} in the OS keyring as {service}/{username}")
    return 0


@guarded
def trust_host(host: str | None = None, role: str | None = None, yes: bool = False) -> int:
    """Show each target's host key fingerprint and pin it after confirmation."""
    from handoff import hostkeys
    from handoff.trust import fetch_key

    targets = targets_for(host, role)
    failed = 0
    for t in targets:
        ep = t.endpoint
        try:
            key = fetch_key(t)
        except HandoffError as exc:
            console.error(str(exc))
            failed += 1
            continue
        fp = hostkeys.fingerprint(key)
        known = hostkeys.lookup(ep.hostname, ep.port, ep.known_hosts)
        if any(k == key for k in known):
            console.say(f"{console.r(t.label)} ({console.r(ep.hostname)}:{ep.port}): {key.get_name()} {fp} is already trusted")
            continue
        if known:
            old = ", ".join(f"{k.get_name()} {hostkeys.fingerprint(k)}" for k in known)
            console.say(f"[bold red]WARNING: the host key of {console.r(t.label)} CHANGED[/]: trusted {old}, now offered {key.get_name()} {fp}")
        console.say(f"{console.r(t.label)} ({console.r(ep.hostname)}:{ep.port}) offers {key.get_name()} key [bold]{fp}[/]")
        console.say("compare it with `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` run on the host itself")
        if not yes:
            if not sys.stdin.isatty():
                console.error("not pinned: confirm by re-running with --yes (stdin is not a terminal)")
                failed += 1
                continue
            answer = input(f"Pin this key for {t.label}? [y/N] ").strip().lower()
            if answer not in ("y", "yes"):
                console.say("not pinned")
                failed += 1
                continue
        path = hostkeys.pin(ep.hostname, ep.port, key)
        console.say(f"pinned {fp} for {console.r(ep.hostname)}:{ep.port} in {path}")
    return 1 if failed else 0
