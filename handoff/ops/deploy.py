"""The first half of the checklist as one plan: verify → push-script → push-key (= deploy),
or any one of them alone.

The probe is always the first step: one round trip that both verifies the host and tells
the later steps what is already there, so an unchanged redeploy is connect + probe and
nothing else. The steps come from their own modules (verify.probe_step, releases.steps,
step.place_step); this module only puts them in order per host.
"""

from __future__ import annotations

from dataclasses import dataclass

from handoff.host.targets import Target
from handoff.ops import releases
from handoff.ops.releases import ReleaseCarrier
from handoff.ops.secrets import settings, step
from handoff.ops.secrets.step import KeyCarrier
from handoff.ops.verify import probe_step
from handoff.run.plan import HostPlan, Plan


@dataclass
class DeployPrivate(ReleaseCarrier, KeyCarrier):
    """A deploy's private values: the release to upload and the key material handle."""


def build(
    targets: list[Target],
    *,
    verify: bool = True,
    script: bool = True,
    key: settings.KeyHandle = None,
    key_unavailable: str | None = None,
    install: bool = False,
    title: str = "deploy",
    key_settings: dict[str, settings.KeySettings] | None = None,
) -> Plan:
    """Plan for deploy (all three) or one checklist step alone.

    `key` is what the keyring gave (settings.Credentials: the API key and/or the management
    key; a bare string is an API key) and may still be on its way (a Future, see
    settings.read_credentials_soon): hosts connect and probe meanwhile, and every step that
    changes a host waits for it first, so a keyring failure still changes nothing anywhere.
    Each host's `key_mode` then decides whether it gets the API key or a child key minted
    for it. `key_unavailable` (dry run only) is why there is no key: the plan still shows
    the step, with that note. `key_settings`: each host's, already checked by the command
    (settings.for_hosts), so they are computed once per host; computed here otherwise.
    """
    release = releases.build() if script else None
    plan = Plan(title, [], private=DeployPrivate(release=release, key=key),
                pending={"key": "the API key could not be read from the keyring"})
    # Each host's key settings, checked once (the command's, when it passes them): bad key
    # vars stop the whole command before any host is touched.
    chosen = (key_settings if key_settings is not None else settings.for_hosts(targets)
              if key is not None or key_unavailable is not None else {})
    for i, t in enumerate(targets):
        places_key = (key is not None or key_unavailable is not None) and settings.takes_key(t)
        # The folders later steps may create: the probe reports which exist, so creating
        # them costs no stat round trips.
        dirs = releases.folders(t.layout, release) if release is not None else []
        if key is not None and settings.takes_key(t):
            dirs += step.key_folders(t)
        # The shard this host would get from `fab launch` over the same targets: a role's
        # preflight (the extractor's disk estimate) then checks this host's share only. It
        # may tokenize the whole input (minutes): `fab verify` runs it, deploy does not, so
        # a no-op redeploy stays one cheap round trip; the job runs the same check at launch.
        shard = f"{i}/{len(targets)}" if len(targets) > 1 else None
        steps = [probe_step(t, check=verify, install=install, key=key is not None, shard=shard,
                            preflight=title == "verify", dirs=sorted(set(dirs)),
                            show_all=title == "verify")]
        if release is not None:
            steps += releases.steps(t, release)
        if places_key:
            steps.append(step.place_step(t, key, key_unavailable, chosen.get(t.label)))
        plan.hosts.append(HostPlan(t, steps))
    return plan
