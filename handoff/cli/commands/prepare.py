"""The first half of the checklist: getting hosts ready (`deploy` = `verify` →
`push-script` → `push-key`), the key in the keyring (`set-key`) and the hosts' keys pinned
(`trust-host`).
"""

from __future__ import annotations

import sys

from handoff import console
from handoff.cli.commands import common
from handoff.cli.commands.common import exit_code, guarded, run_plan, targets_for
from handoff.defaults import API_KEY_USERNAME, SECRET_SERVICE
from handoff.errors import HandoffError, Interrupted, SecretError, UsageError
from handoff.run import plan


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
    from handoff.config import state
    from handoff.ops import deploy as deploy_plan
    from handoff.ops.secrets import settings

    targets = targets_for(host, role)
    entry = settings.keyring_entry(targets, required=title == "push-key") if key else None
    # Each host's key_mode says which keyring entries are needed (checked before anything,
    # once: the plan's place-key steps reuse them).
    chosen = settings.for_hosts(targets) if entry is not None else {}
    modes = settings.key_modes(chosen)
    if dry_run:
        unavailable = None
        try:
            secret = None if entry is None else settings.read_credentials(*entry, modes)
        except SecretError as exc:
            # A dry run still shows the whole plan; the missing key becomes a note in it.
            secret, unavailable = None, str(exc)
        return run_plan(deploy_plan.build(targets, verify=verify, script=script, key=secret,
                                          install=install, title=title, key_unavailable=unavailable,
                                          key_settings=chosen or None),
                        dry_run=True)
    # Read on a thread while the hosts connect and probe; the plan's changing steps wait.
    pending = None if entry is None else settings.read_credentials_soon(*entry, modes)
    p = deploy_plan.build(targets, verify=verify, script=script, key=pending, install=install,
                          title=title, key_settings=chosen or None)
    reports = plan.execute(p, connect=common.CONNECT)
    failure = None if pending is None else pending.exception()
    if isinstance(failure, SecretError):
        raise failure  # how to store the key: printed once, after the hosts' "nothing changed"
    code = exit_code(reports)
    if remember and host:
        # Only a deploy that succeeded on every host becomes what later bare commands act on;
        # a failed one (a dead or mistyped host) leaves the remembered targets as they were.
        if code == 0:
            # Per role: the extractor's host deployed alone leaves the generators remembered.
            by_role: dict[str, list[str]] = {}
            for t in targets:
                by_role.setdefault(t.role.name if t.role else "", []).append(t.spec)
            state.save_targets(by_role)
        else:
            console.note("the remembered hosts are unchanged (deploy failed on "
                         f"{', '.join(r.target.label for r in reports if not r.ok)})")
    return code


def verify(host: str | None = None, role: str | None = None, install: bool = False,
           dry_run: bool = False) -> int:
    return deploy(host, role, verify=True, script=False, key=False, install=install,
                  dry_run=dry_run, title="verify", remember=False)


def push_script(host: str | None = None, role: str | None = None, dry_run: bool = False) -> int:
    return deploy(host, role, verify=False, script=True, key=False, dry_run=dry_run,
                  title="push-script", remember=False)


def push_key(host: str | None = None, role: str | None = None, dry_run: bool = False) -> int:
    return deploy(host, role, verify=False, script=False, key=True, dry_run=dry_run,
                  title="push-key", remember=False)


@guarded
def set_key(service: str = SECRET_SERVICE, username: str = API_KEY_USERNAME) -> int:
    """Store the key in the OS keyring from a hidden prompt (or stdin when piped)."""
    import getpass

    from handoff.config import os_keyring

    try:
        if sys.stdin.isatty():
            try:
                key = getpass.getpass(f"API key for {service}/{username} (hidden): ")
            except EOFError:  # Ctrl-D at the prompt: nothing typed, never a traceback
                print(file=sys.stderr)
                key = ""
        else:
            key = sys.stdin.readline()
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted (Ctrl-C) before a key was given: nothing was stored; "
                          f"the keyring's {service}/{username} is as it was (no host is "
                          f"touched by set-key)") from None
    key = key.strip()
    if not key:
        raise UsageError("empty key; nothing stored")
    if not key.startswith("sk-"):
        console.warn("that does not look like an OpenRouter key (sk-or-…); storing it anyway")
    try:
        where = os_keyring.store_key(key, service, username)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted (Ctrl-C) while storing the key: not known whether the "
                          f"keyring's {service}/{username} holds the new key or the old one; "
                          f"run `fab set-key` again (it replaces the entry); no host is touched "
                          f"by set-key") from None
    console.say(f"stored key {os_keyring.fingerprint(key)} in {console.r(where)} as "
                f"{console.r(service)}/{console.r(username)}")
    return 0


@guarded
def trust_host(host: str | None = None, role: str | None = None, yes: bool = False,
               replace: bool = False, known_hosts: bool = False) -> int:
    """Show each target's host key fingerprint and pin it after confirmation; a changed
    key only with `replace`."""
    from handoff.ops import trust

    failed = 0
    targets = targets_for(host, role)
    done: list[str] = []
    for i, t in enumerate(targets):
        try:
            trusted = trust.trust(t, yes, replace, known_hosts)
        except HandoffError as exc:
            console.error(str(exc))
            trusted = False
        except KeyboardInterrupt:
            rest = [x.label for x in targets[i:]]
            raise Interrupted(
                f"interrupted (Ctrl-C): nothing pinned for {', '.join(rest)}"
                + (f"; {', '.join(done)} done as said above" if done else "")
                + f"; `fab trust-host --host {','.join(rest)}` asks again") from None
        done.append(t.label)
        failed += not trusted
    return 1 if failed else 0
