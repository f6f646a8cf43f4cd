"""The `place-key` step of deploy and push-key: the plan's key (plain) or a child key minted
for the host (minted), placed at the host's key_path (handoff.ops.secrets.place, .minted).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from handoff.config.layout import key_record, parents
from handoff.config.os_keyring import fingerprint
from handoff.errors import HandoffError
from handoff.host.targets import Target
from handoff.host.transfer import temp_prefix
from handoff.ops import keyapi
from handoff.ops.secrets.minted import place_minted
from handoff.ops.secrets.place import place
from handoff.ops.secrets.settings import (
    Credentials,
    KeyHandle,
    KeySettings,
    api_mismatch,
    as_credentials,
    key_settings,
    management_api,
)
from handoff.run.plan import HostContext, Step


def key_folders(target: Target) -> list[str]:
    """The folders placing the key may create (the probe reports which exist)."""
    return parents(str(target.vars["key_path"]).rsplit("/", 1)[0])


def place_step(target: Target, key: Any, unavailable: str | None = None,
               settings: KeySettings | None = None) -> Step:
    """Place the host's key at its key_path, 0600 from birth: the plan's API key (plain) or
    a child key minted for this host (minted). `key` is the plan's private value (Credentials,
    an API key, or a Future of either) or None for a dry run whose key is `unavailable`."""
    path = str(target.vars["key_path"])
    folder, name = path.rsplit("/", 1)
    settings = settings or key_settings(target)  # checked once per command when given
    known = key if isinstance(key, (str, Credentials)) else None
    mode = as_credentials(known).mode_for(settings) if known is not None else settings.mode
    write = (f"sftp mkdir {folder} (0700); create {folder}/{temp_prefix(name)}* O_EXCL mode "
             f"0600; write; fsync; rename; stat")
    if mode == "minted":
        try:
            api = management_api(target)
            mismatch = api_mismatch(target)
        except HandoffError as exc:
            api, mismatch = "<no management API>", str(exc)
        what = (f"mint a child key for {target.label} (limit {keyapi.money(settings.limit)}, "
                f"expires {settings.ttl_hours:g} h after minting) and place it at {path} (0600)")
        detail = (f"GET {api}/keys/<hash> (the live key named in {key_record(path)}); unless "
                  f"live: DELETE every earlier key of the host (the ledger's, the record's, "
                  f"GET {api}/keys named {keyapi.NAME_PREFIX}<ws>:{target.label}), then POST "
                  f"{api}/keys, then {write}; write {key_record(path)} (0600)")
        if mismatch:
            what += f"; REFUSED: {mismatch.removeprefix(f'{target.label}: ')}"
        when = ("unless the host holds a live child key (reused; replaced when it expires "
                "within the hour)")
    else:
        fp = f" {fingerprint(as_credentials(known).api_key or '')}" if mode == "plain" and known else ""
        what = f"place API key{fp} at {path} (0600)"
        if mode == "auto":
            what = (f"place a key at {path} (0600): a child key minted for this host when a "
                    f"management key is stored, else the API key")
        detail, when = write, "unless the host already holds the same key (sha256 compared on the host)"
    if key is None:
        what += f"; NOTE: {unavailable}"
    return Step("place-key", what, detail, when, PlaceKey(settings), run=_place_key)


@dataclass(frozen=True)
class PlaceKey:
    """The host's key settings, checked when the plan was built."""

    settings: KeySettings


@dataclass
class KeyCarrier:
    """What the place-key step reads of its plan's private values (handoff.ops.deploy): the
    key material handle, as the keyring gave it or still on its way."""

    key: KeyHandle = None


def _place_key(ctx: HostContext, step: Step) -> str:
    handle = ctx.private_as(KeyCarrier).key
    creds = as_credentials(ctx.arrived("key", handle) if isinstance(handle, Future) else handle)
    settings = step.args(PlaceKey).settings
    s, facts = ctx.session, ctx.need_facts()
    if creds.mode_for(settings) == "minted":
        return place_minted(s, facts, creds, settings)
    if not creds.api_key:
        raise RuntimeError("the plan carries no API key for a plain host")
    return place(s, facts, creds.api_key)


__all__ = ["key_folders", "place_step"]
