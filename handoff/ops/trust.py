"""`fab trust-host`: show each host key on the way to a target, pin it once confirmed.

The route is walked as a connection walks it (handoff.ssh.endpoint.route): every jump host of a
ProxyJump chain first, then the target. For each, only the key exchange runs, with the
host key algorithms ordered as for a real connection (the types already known first), so
the key shown is the one a connection would compare. A key already trusted is said so; a
revoked one is never pinned; a CHANGED warning appears only when keys of the offered type
are known and none matches (handoff.ssh.hostkeys). After a hop is trusted, trust-host logs in
to it to reach the next one. Nothing is pinned before the user confirmed.

Where the pin goes: the state dir's pinned file (handoff's own, the default), or with
`--known-hosts` the user's known_hosts (ssh's first UserKnownHostsFile, else
~/.ssh/known_hosts), where plain `ssh` and the `ssh …` commands handoff prints find it
too, and which deleting `.handoff/` does not lose. The message names the file.
"""

from __future__ import annotations

import sys

import paramiko

from handoff import console
from handoff.config import state
from handoff.errors import ChangedHostKey, HostKeyError, RevokedHostKey, UnknownHostKey
from handoff.host.targets import Target
from handoff.ssh import connect, hostkeys
from handoff.ssh.endpoint import Hop, route


def _decide(hop: Hop, key: paramiko.PKey, known: hostkeys.Knowledge, yes: bool,
            hint: str, replace: bool = False, known_hosts: bool = False) -> bool:
    """Show `key` for `hop` and pin it if the user agrees; True when it is trusted after.

    A CHANGED key (one known for the host's key type, none matching) is never pinned by
    `--yes` or a "y": a script that always passes `--yes` must not accept a man in the
    middle. Replacing it takes `--replace`, which prints the old and the new fingerprint.
    `known_hosts`: pin into the user's known_hosts (where plain ssh reads it), not the
    state dir."""
    ep = hop.endpoint
    fp = hostkeys.fingerprint(key)
    kind = hostkeys.offered_name(key)
    where = f"{console.r(hop.label)} ({console.r(ep.hostname)}:{ep.port})"
    try:
        how = known.check(hop.label, ep.hostname, key, hint)
    except RevokedHostKey as exc:
        console.error(str(exc))
        return False
    except ChangedHostKey as exc:
        console.say(f"[bold red]WARNING: the host key of {console.r(hop.label)} CHANGED[/]: "
                    f"trusted {console.r(', '.join(exc.expected))}, now offered "
                    f"{console.r(key.get_name())} {fp}")
        if not replace:
            console.error(
                f"not pinned: the host key of {hop.label} changed, and --yes never replaces a "
                f"changed key (someone may be intercepting the connection). If you know why it "
                f"changed (the host was rebuilt), compare {fp} with `ssh-keygen -lf "
                f"/etc/ssh/ssh_host_*_key.pub` run on the host itself, then replace the pin: "
                f"`{hint} --replace`")
            return False
        path = hostkeys.pin(ep.hostname, ep.port, key, known.name,
                            hostkeys.user_known_hosts(ep.known_hosts) if known_hosts else None)
        console.say(f"replaced the trusted key of {console.r(hop.label)}: old "
                    f"{console.r(', '.join(exc.expected))} -> new {console.r(kind)} {fp}, "
                    f"pinned for {console.r(known.name)} in {path}")
        return True
    except UnknownHostKey:
        if known.keys:
            types = ", ".join(known.known_types)
            console.say(f"{where}: only {console.r(types)} keys are known for it, and it did not "
                        f"offer that type")
    except HostKeyError as exc:
        console.error(str(exc))
        return False
    else:
        console.say(f"{where}: {console.r(kind)} {fp} is already trusted ({console.r(how)})")
        if known_hosts and how.startswith(str(state.pinned_keys_path())):
            # Trusted by handoff's own pin only: copied where ssh looks, as asked.
            path = hostkeys.pin(ep.hostname, ep.port, key, known.name,
                                hostkeys.user_known_hosts(ep.known_hosts))
            console.say(f"pinned {fp} for {console.r(known.name)} in {console.r(str(path))} too")
        return True
    console.say(f"{where} offers {console.r(kind)} key [bold]{fp}[/]")
    console.say("compare it with `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` run on the host itself")
    if not yes:
        if not sys.stdin.isatty():
            console.error("not pinned: confirm by re-running with --yes (stdin is not a terminal)")
            return False
        try:
            answer = input(f"Pin this key for {hop.label}? [y/N] ").strip().lower()
        except EOFError:  # Ctrl-D: a "no", never a traceback
            print(file=sys.stderr)
            answer = ""
        if answer not in ("y", "yes"):
            console.say("not pinned")
            return False
    into = hostkeys.user_known_hosts(ep.known_hosts) if known_hosts else None
    path = hostkeys.pin(ep.hostname, ep.port, key, known.name, into)
    console.say(f"pinned {fp} for {console.r(known.name)} in {console.r(str(path))}")
    if into is None:
        console.note(f"that file is handoff's own: plain ssh does not read it, and deleting the "
                     f"state dir forgets the pin; `fab trust-host --known-hosts` pins into "
                     f"{hostkeys.user_known_hosts(ep.known_hosts)} instead")
    return True


def trust(target: Target, yes: bool, replace: bool = False, known_hosts: bool = False) -> bool:
    """`fab trust-host` for one target (and every jump host on its way); True when all
    their keys are trusted afterwards. `replace`: a CHANGED key is replaced (never by
    `yes` alone)."""
    hint = connect.hint_for(target.label)
    hops = route(target.endpoint, target.label)
    through: connect.Link | None = None
    try:
        for i, hop in enumerate(hops):
            key, known = connect.fetch_host_key(hop, through)
            if not _decide(hop, key, known, yes, hint, replace, known_hosts):
                return False
            if i < len(hops) - 1:
                through = connect.connect_hop(hop, through, hint)
    finally:
        if through is not None:
            through.close()
    return True
