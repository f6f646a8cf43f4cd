"""The shard layout of each job launched from this workstation: which hosts run it, in shard
order, each host's shard, how many prompts each shard owns and the input's sha256.

`fab launch` records it (`record`) in `<state dir>/jobs/<job>.json`, one small file per
job, replaced atomically: the job's launches, oldest first, the last being its layout now.
`status`, `jobs` and `fetch` judge from it (`load`): which shards exist, which host holds
which, how many ids the job must hold, the order the merge takes the hosts in, and whether
a record a host returns is one of its shard's (`ShardLayout.owner`: its id in the host's
shard in any launch of the job; an earlier launch counts, since a relaunch over other
hosts leaves each host's earlier answers in its files). A host's own `job.json` says the
same things, but it is the host's word: a hint, shown where it disagrees, never what
decides (a host could otherwise put itself first in a merge, or say the job has one shard).

A job this workstation has no layout for (launched from another clone, or before layouts
were recorded) is judged from the hosts' hints, bounded, and never called complete.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from handoff.config import state
from payload import atomic
from payload.records import shard_hash

__all__ = ["Launch", "ShardLayout", "layout_path", "load", "new_launch", "record"]

_FOLDER = "jobs"
_MAX_BYTES = 4 << 20  # a layout of 4096 hosts is ~200 KB
MAX_LAUNCHES = 32  # launches of one job kept (the oldest forgotten first)


@dataclass(frozen=True)
class Launch:
    """One launch of a job: its hosts in order (host i runs shard i when sharded)."""

    hosts: tuple[str, ...]  # the hosts' labels, in launch order
    shards: int  # shard count: len(hosts) when sharded, 1 when every host runs the whole input
    input_sha256: str | None  # None: a --remote-input job (the file was never on this workstation)
    launched: float  # unix time
    prompts: int | None = None  # distinct prompts of the whole input, when read here
    per_shard: tuple[int, ...] = ()  # distinct prompts each shard owns, when read here

    def shard(self, host: str) -> int | None:
        """The shard `host` was given; None: not a host of this launch."""
        try:
            return self.hosts.index(host) if self.shards > 1 else (0 if host in self.hosts else None)
        except ValueError:
            return None

    @classmethod
    def from_json(cls, raw: Any) -> Launch | None:
        if not isinstance(raw, dict):
            return None
        try:
            hosts = tuple(str(h) for h in raw["hosts"])
            launch = cls(hosts, int(raw["shards"]),
                         str(raw["input_sha256"]) if raw.get("input_sha256") else None,
                         float(raw.get("launched") or 0.0),
                         int(raw["prompts"]) if raw.get("prompts") is not None else None,
                         tuple(int(c) for c in raw.get("per_shard") or ()))
        except (KeyError, TypeError, ValueError):
            return None
        n = launch.shards
        ok = (hosts and len(set(hosts)) == len(hosts) and n in (1, len(hosts))
              and (not launch.per_shard or len(launch.per_shard) == n))
        return launch if ok else None


@dataclass(frozen=True)
class ShardLayout:
    """A job as this workstation launched it: every launch kept, the last one its layout now."""

    job: str
    launches: tuple[Launch, ...]  # oldest first; never empty

    # -- the layout now: the last launch ------------------------------------------------
    @property
    def now(self) -> Launch:
        return self.launches[-1]

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.now.hosts

    @property
    def shards(self) -> int:
        return self.now.shards

    @property
    def sharded(self) -> bool:
        return self.now.shards > 1

    @property
    def prompts(self) -> int | None:
        return self.now.prompts

    @property
    def input_sha256(self) -> str | None:
        return self.now.input_sha256

    def shard(self, host: str) -> int | None:
        """The shard `host` holds now; None: not a host of the last launch."""
        return self.now.shard(host)

    def spec(self, host: str) -> str | None:
        """`i/n` for `host` now, as the payload's `--shard` was given (None: not a host of
        the last launch, or the job is not sharded)."""
        i = self.shard(host)
        return None if i is None or not self.sharded else f"{i}/{self.shards}"

    # -- whose records are whose ------------------------------------------------------------
    def owner(self, host: str) -> Callable[[str], bool] | None:
        """A test of whether an id belongs to `host`'s shard in some launch of the job (the
        payload's id -> shard function, payload.records.shard_of); None when every id
        does (the host ran the whole input once), `lambda _: False` when none does (the
        host was never given a shard of this job)."""
        by_hash = self.hash_owner(host)
        return None if by_hash is None else (lambda key: by_hash(shard_hash(key)))

    def hash_owner(self, host: str) -> Callable[[int], bool] | None:
        """`owner`, over an id's `payload.records.shard_hash` (the merge hashes an id's raw
        bytes in place, without decoding it)."""
        held = {(launch.shards, i) for launch in self.launches
                if (i := launch.shard(host)) is not None}
        if any(n == 1 for n, _ in held):
            return None
        pairs = sorted(held)
        return lambda h: any(h % n == i for n, i in pairs)

    def to_json(self) -> str:
        return json.dumps({"job": self.job, "launches": [asdict(launch) for launch in self.launches]},
                          indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, raw: Any) -> ShardLayout | None:
        """A layout file read back; None when it is not one (torn, hand-edited wrong)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("launches"), list) \
                or not isinstance(raw.get("job"), str):
            return None
        launches = [Launch.from_json(one) for one in raw["launches"][-MAX_LAUNCHES:]]
        if not launches or any(launch is None for launch in launches):
            return None
        return cls(raw["job"], tuple(launch for launch in launches if launch is not None))


def new_launch(hosts: list[str], *, sharded: bool, input_sha256: str | None,
               prompts: int | None = None, per_shard: list[int] | None = None) -> Launch:
    """One launch over `hosts` (host i runs shard i of n when `sharded` and n > 1)."""
    n = len(hosts) if sharded and len(hosts) > 1 else 1
    per = tuple(per_shard or ()) if n > 1 else ((prompts,) if prompts is not None else ())
    return Launch(tuple(hosts), n, input_sha256, time.time(), prompts, per)


def layout_path(job: str) -> Path:
    """`<state dir>/jobs/<job>.json` (a job name is one plain folder name: the --job rule)."""
    return state.state_dir() / _FOLDER / f"{job}.json"


def record(job: str, launch: Launch) -> ShardLayout:
    """Add a launch to the job's layout (0600, replaced atomically, like every state file).
    A launch with another input than the job's last one starts the job's record over: its
    earlier launches were of other data. One over the same hosts as the last (a resume)
    replaces it."""
    before = load(job)
    earlier = before.launches if before is not None else ()
    if earlier and launch.input_sha256 and earlier[-1].input_sha256 \
            and earlier[-1].input_sha256 != launch.input_sha256:
        earlier = ()
    if earlier and (earlier[-1].hosts, earlier[-1].shards) == (launch.hosts, launch.shards):
        earlier = earlier[:-1]
    layout = ShardLayout(job, (*earlier, launch)[-MAX_LAUNCHES:])
    folder = state.ensure_state_dir() / _FOLDER
    folder.mkdir(mode=0o700, exist_ok=True)
    atomic.write_text(layout_path(job), layout.to_json(), mode=0o600)
    return layout


def load(job: str) -> ShardLayout | None:
    """The layout this workstation recorded when it launched `job`; None if it did not (or
    the file is not one)."""
    try:
        with layout_path(job).open("rb") as fh:
            raw = fh.read(_MAX_BYTES + 1)
    except (OSError, ValueError):
        return None
    if len(raw) > _MAX_BYTES:
        return None
    try:
        return ShardLayout.from_json(json.loads(raw))
    except (ValueError, RecursionError):
        return None

