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

A shard moves only by a take-over (`fab launch --job J --take-over DEAD --host NEW`): the
job's next launch is its last one with a `Move` added: shard i now runs on NEW (besides any
shard NEW held), which was sent the ids of shard i already in hand (in DEAD's last fetched
copy) to leave out. DEAD keeps shard i among the shards whose records it may return (its
copy is merged), but it no longer runs it: `holders` are the hosts that run a shard now.

A job this workstation has no layout for (launched from another clone, or before layouts
were recorded) is judged from the hosts' hints, bounded, and never called complete.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from handoff.config import state
from payload import atomic
from payload.records import shard_hash

__all__ = ["Launch", "Move", "ShardLayout", "layout_path", "load", "new_launch", "record"]

_FOLDER = "jobs"
_MAX_BYTES = 4 << 20  # a layout of 4096 hosts is ~200 KB
MAX_LAUNCHES = 32  # launches of one job kept (the oldest forgotten first)


@dataclass(frozen=True)
class Move:
    """A shard taken over: shard `shard` moved from `source` to `taker`, with the ids of it
    already in hand (the source's last fetched copy: `done` answers, `failed` failures,
    fetched at `fetched`) left out of what the taker asks."""

    shard: int
    source: str
    taker: str
    done: int = 0
    failed: int = 0
    fetched: float | None = None  # when the source's copy was fetched (its files' mtime)
    spent: float = 0.0  # what the source spent on it (its last fetched status): off the budget

    @classmethod
    def from_json(cls, raw: Any) -> Move | None:
        if not isinstance(raw, dict):
            return None
        try:
            move = cls(int(raw["shard"]), str(raw["source"]), str(raw["taker"]),
                       int(raw.get("done") or 0), int(raw.get("failed") or 0),
                       float(raw["fetched"]) if raw.get("fetched") is not None else None,
                       float(raw.get("spent") or 0.0))
        except (KeyError, TypeError, ValueError):
            return None
        ok = (move.shard >= 0 and move.done >= 0 and move.failed >= 0 and move.source != move.taker
              and 0.0 <= move.spent < float("inf"))
        return move if ok else None


@dataclass(frozen=True)
class Launch:
    """One launch of a job: its hosts in order (host i runs shard i when sharded), and the
    shards moved since to other hosts (`moves`, oldest first)."""

    hosts: tuple[str, ...]  # the hosts' labels, in launch order
    shards: int  # shard count: len(hosts) when sharded, 1 when every host runs the whole input
    input_sha256: str | None  # None: a --remote-input job (the file was never on this workstation)
    launched: float  # unix time
    prompts: int | None = None  # distinct prompts of the whole input, when read here
    per_shard: tuple[int, ...] = ()  # distinct prompts each shard owns, when read here
    moves: tuple[Move, ...] = ()  # shards taken over since, oldest first

    def shard(self, host: str) -> int | None:
        """The shard `host` was given; None: not a host of this launch."""
        try:
            return self.hosts.index(host) if self.shards > 1 else (0 if host in self.hosts else None)
        except ValueError:
            return None

    def runner(self, shard: int) -> str:
        """The host that runs shard `shard` now (its own host, or the last one it moved to)."""
        host = self.hosts[shard] if self.shards > 1 else self.hosts[0]
        for move in self.moves:
            if move.shard == shard:
                host = move.taker
        return host

    def runs(self, host: str) -> tuple[int, ...]:
        """The shards `host` runs now, in order (its own unless moved away, and those moved
        to it); () when none."""
        if self.shards == 1:
            return (0,) if host in self.hosts else ()
        return tuple(i for i in range(self.shards) if self.runner(i) == host)

    def held(self, host: str) -> tuple[int, ...]:
        """Every shard whose records `host` may hold: the ones it was given and the ones
        moved to it (a host a shard moved away from keeps it: its copy is merged)."""
        own = self.shard(host)
        taken = [m.shard for m in self.moves if m.taker == host]
        return tuple(sorted({*([own] if own is not None else []), *taken}))

    @property
    def holders(self) -> tuple[str, ...]:
        """The hosts that run a shard now, in shard order (a taker after the hosts)."""
        return tuple(h for h in self.order if self.runs(h))

    @property
    def order(self) -> tuple[str, ...]:
        """Every host with records of the job, in launch order: the hosts, then the takers
        that were not among them (the merge takes the hosts in this order)."""
        return tuple(dict.fromkeys([*self.hosts, *(m.taker for m in self.moves)]))

    def moved_to(self, host: str) -> tuple[Move, ...]:
        """The moves of shards `host` runs now (what it was told to leave out)."""
        return tuple(m for m in self.moves if m.taker == host and self.runner(m.shard) == host)

    def spec(self, host: str) -> str | None:
        """`i/n` (`i,k/n` with shards taken over) for `host` now, as the payload's `--shard`
        is given; None: it runs no shard, or the job is not sharded."""
        mine = self.runs(host)
        return f"{','.join(map(str, mine))}/{self.shards}" if mine and self.shards > 1 else None

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
            moves = [Move.from_json(m) for m in raw.get("moves") or []]
        except (KeyError, TypeError, ValueError):
            return None
        if any(m is None or m.shard >= launch.shards for m in moves):
            return None
        launch = replace(launch, moves=tuple(m for m in moves if m is not None))
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
        """The hosts of the last launch, in shard order (a shard may have moved since:
        `holders`)."""
        return self.now.hosts

    @property
    def holders(self) -> tuple[str, ...]:
        """The hosts that run a shard now."""
        return self.now.holders

    @property
    def order(self) -> tuple[str, ...]:
        """Every host with records of the job now, in launch order (the merge's order)."""
        return self.now.order

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
        """`i/n` (`i,k/n` once it took a shard over) for `host` now, as the payload's
        `--shard` is given (None: it runs no shard now, or the job is not sharded)."""
        return self.now.spec(host)

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
        held = {(launch.shards, i) for launch in self.launches for i in launch.held(host)}
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
    earlier launches were of other data. One over the same hosts as the last, with its moves
    and maybe more (a resume, a take-over), replaces it."""
    before = load(job)
    earlier = before.launches if before is not None else ()
    if earlier and launch.input_sha256 and earlier[-1].input_sha256 \
            and earlier[-1].input_sha256 != launch.input_sha256:
        earlier = ()
    last = earlier[-1] if earlier else None
    if last is not None and (last.hosts, last.shards) == (launch.hosts, launch.shards) \
            and launch.moves[:len(last.moves)] == last.moves:
        earlier = earlier[:-1]  # a resume, or a take-over of it: it says all the last one did
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

