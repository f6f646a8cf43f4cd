"""Where each host's shard of a job comes from on a launch, and shards that move.

The shard layout this workstation recorded (handoff.config.shards) decides a relaunch: over
the hosts that run the job's shards now (in any order), each host gets the shard(s) it ran
(`placement`): nothing is cut anew, so nothing is asked twice. A launch over other hosts
cuts the job anew (host i of n runs shard i), which may ask again what a host it leaves
already answered: it is refused while such a host still runs its shard, or cannot be
reached to tell (`leaving`, `refusal`), naming the way out; otherwise said before anything
starts.

The way out for a host that died is a take-over (`fab launch --job J --take-over DEAD
--host NEW`, `take_over`): DEAD's shard moves to NEW (besides any shard NEW runs), and NEW
is sent the ids of it already in hand, those in DEAD's last fetched copy
(`DEST/DEAD/J/output.jsonl` and `output.errors.jsonl`), to leave out (`--exclude-ids`):
only what is not in hand is asked. The layout records the move (a `shards.Move`), so
status shows the moved shard, the merge takes NEW's records of DEAD's shard, and later
relaunches over the hosts that run the shards give NEW the same shards and exclusions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from handoff import threads
from handoff.config import shards
from handoff.config.shards import Launch, Move, ShardLayout
from handoff.errors import RemoteError, UsageError
from handoff.host import untrusted
from handoff.host.session import Connector
from handoff.host.targets import Target, folder_name
from handoff.host.transfer import mkdirs, upload_atomic
from handoff.ops.jobs.state import read
from handoff.run.plan import HostContext, Step
from payload.generate.journal import record_key
from payload.records import shard_of

EXCLUDE_FILE = "exclude-ids.jsonl"  # in the taker's job folder: what it leaves out
MAX_EXCLUSIONS = 256 << 20  # bytes: an exclusion list a host holds, read back (10M ids)
# The ids of a copy are read whole lines at a time, up to this many bytes each (no answer
# is that long; a host's bytes beyond it are no id).
_MAX_LINE = 16 << 20


@dataclass(frozen=True)
class Assignment:
    """One host's part of a job in a launch."""

    spec: str | None  # the payload's --shard (None: the whole input)
    runs: int  # its part of the job's budget: `runs` of the job's `of` shares ...
    of: int
    less: float = 0.0  # ... less what was spent already on the shards it took over
    exclude: bool = False  # it runs a shard taken over: --exclude-ids <job dir>/EXCLUDE_FILE


@dataclass
class Placement:
    """How one job of a launch is spread over its hosts, and what is recorded once started."""

    job: str
    hosts: dict[str, Assignment]
    launch: Launch
    reused: bool = False  # the recorded layout, each host given its shards again
    notes: list[str] = field(default_factory=list)  # said before anything starts
    take_over: TakeOver | None = None


@dataclass(frozen=True)
class TakeOver:
    """A shard moving from `source` to `taker`: the ids already in hand (one per line, as
    JSON strings) and how many of them are answers and failures."""

    job: str
    source: str
    taker: str
    exclusions: bytes = field(repr=False)
    done: int
    failed: int
    fetched: float | None
    spent: float
    copy: Path


def placement(job: str, labels: list[str], *, sharded: bool, input_sha256: str | None,
              prompts: int | None = None, per_shard: list[int] | None = None,
              recorded: bool = True) -> Placement:
    """Each host's shard of `job` over `labels`: the recorded layout's (`recorded`) when
    `labels` are the hosts that run its shards now (and the input is the same), else cut
    anew (host i of n: i/n)."""
    layout = shards.load(job) if recorded else None
    same_input = layout is not None and (input_sha256 is None or layout.input_sha256 is None
                                         or layout.input_sha256 == input_sha256)
    if layout is not None and same_input and layout.sharded and sharded \
            and set(labels) == set(layout.holders):
        now = layout.now
        hosts = {h: Assignment(now.spec(h), len(now.runs(h)), now.shards,
                               sum(m.spent for m in now.moved_to(h)), bool(now.moved_to(h)))
                 for h in labels}
        return Placement(job, hosts, replace(now, launched=time.time()), reused=True)
    n = len(labels)
    cut = sharded and n > 1
    hosts = {h: Assignment(f"{i}/{n}" if cut else None, 1, n) for i, h in enumerate(labels)}
    launch = shards.new_launch(labels, sharded=sharded, input_sha256=input_sha256,
                               prompts=prompts, per_shard=per_shard)
    return Placement(job, hosts, launch)


def leaving(p: Placement) -> list[str]:
    """The hosts that run a shard of the job now and that this launch, cutting the job
    anew, leaves out: what they answered may be asked again elsewhere."""
    layout = shards.load(p.job)
    if p.reused or p.take_over is not None or layout is None or not layout.sharded:
        return []
    if layout.input_sha256 and p.launch.input_sha256 and layout.input_sha256 != p.launch.input_sha256:
        return []  # another input: another job under the same name (the probe refuses it)
    return [h for h in layout.holders if h not in p.hosts]


def refusal(job: str, states: dict[str, str | None], targets: list[str],
            holders: tuple[str, ...] = ()) -> str | None:
    """Why a launch cutting `job` anew over `targets` may not start: a host it leaves still
    runs its shard, or cannot be reached to tell (`states`: its job's state, None when
    unreachable). None: every host it leaves has stopped or finished."""
    running = [h for h, s in states.items() if s in ("running", "starting", "stopping")]
    unknown = [h for h, s in states.items() if s is None]
    if not running and not unknown:
        return None
    why = []
    if running:
        why.append(f"{', '.join(running)} still run{'s' if len(running) == 1 else ''} "
                   f"{'its shard' if len(running) == 1 else 'their shards'}")
    if unknown:
        why.append(f"{', '.join(unknown)} cannot be reached (it may still run its shard)")
    new = targets[0] if len(targets) == 1 else "NEW"
    ways = []
    for host in unknown or running:
        ways.append(f"`fab launch --job {job} --take-over {host} --host {new}`")
    every = ",".join(dict.fromkeys([*holders, *targets])) if holders else "HOSTS"
    return (f"job {job}: a launch over {', '.join(targets)} would cut it anew and ask again "
            f"what the hosts it leaves answered, and {' and '.join(why)}. Nothing was started. "
            f"A host that is gone: move its shard with {' or '.join(ways[:2])} (fetch first: "
            f"only what its last fetched copy lacks is asked); a host still running: let it "
            f"finish, or stop it (`fab stop --job {job} --host {(running or unknown)[0]}`); to "
            f"resume the job everywhere: launch over every host that runs it (`--host {every}`)")


def reshard_note(job: str, gone: list[str], layout: ShardLayout | None) -> str:
    """Said before a launch that cuts a job anew (its hosts stopped or finished)."""
    hosts = ", ".join(layout.holders) if layout is not None else "?"
    return (f"{job}: launched over other hosts than its shards ({hosts}): the job is cut "
            f"anew, so prompts {', '.join(gone) or 'another host'} already answered may be "
            f"asked again (the merge keeps each id once). To move a host's shard without "
            f"asking again: `fab launch --job {job} --take-over HOST --host NEW`")


def take_over(job: str, source: str, taker: Target, dest: Path, *, input_sha256: str | None,
              sharded: bool = True) -> tuple[Placement, ShardLayout]:
    """The placement of a take-over of `source`'s shard(s) of `job` by `taker` (the launch's
    one host), from the layout this workstation recorded and `source`'s last fetched copy
    under `dest`; a UsageError (nothing touched) for what cannot be moved."""
    layout = shards.load(job)
    if layout is None:
        raise UsageError(f"--take-over: job {job} was not launched from this workstation (no "
                         f"shard record in its state dir): there is no shard to move")
    now = layout.now
    moving = now.runs(source)
    if not layout.sharded or not moving:
        runs = ", ".join(f"{h} ({layout.spec(h)})" for h in layout.holders) or "none"
        raise UsageError(f"--take-over {source}: it runs no shard of job {job} (its shards: "
                         f"{runs}){'; the job is not sharded' if not layout.sharded else ''}")
    if taker.label == source:
        raise UsageError(f"--take-over {source} --host {source}: a shard moves to another host")
    if not sharded:
        raise UsageError("--take-over moves a shard: drop --no-shard")
    if input_sha256 and layout.input_sha256 and input_sha256 != layout.input_sha256:
        raise UsageError(f"--take-over: this input (sha256 {input_sha256[:12]}) is not the one "
                         f"job {job} runs (sha256 {layout.input_sha256[:12]}); give the job's input")
    copy = untrusted.inside(dest, folder_name(source)) / job
    keys: dict[str, bool] = {}  # id -> answered (False: failed)
    for name, answered in (("output.errors.jsonl", False), ("output.jsonl", True)):
        for key in _ids(copy / name):
            if shard_of(key, now.shards) in moving:
                keys[key] = keys.get(key, False) or answered
    fetched = max((p.stat().st_mtime for p in (copy / "output.jsonl", copy / "status.json")
                   if p.is_file()), default=None)
    spent = _spent(copy / "status.json")
    by_shard = {i: [a for k, a in keys.items() if shard_of(k, now.shards) == i] for i in moving}
    # What the source spent is off the taker's budget once (on the first shard moved).
    moves = tuple(Move(i, source, taker.label, sum(by_shard[i]), len(by_shard[i]) - sum(by_shard[i]),
                       fetched, spent if k == 0 else 0.0)
                  for k, i in enumerate(moving))
    after_launch = replace(now, moves=now.moves + moves, launched=time.time())
    after = ShardLayout(job, (*layout.launches[:-1], after_launch))
    move = TakeOver(job, source, taker.label,
                    "".join(json.dumps(k) + "\n" for k in sorted(keys)).encode("utf-8"),
                    sum(keys.values()), len(keys) - sum(keys.values()), fetched, spent, copy)
    a = Assignment(after_launch.spec(taker.label), len(after_launch.runs(taker.label)), now.shards,
                   sum(m.spent for m in after_launch.moved_to(taker.label)), True)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(fetched)) if fetched else None
    notes = [f"{job}: shard {','.join(map(str, moving))}/{now.shards} moves from {source} to "
             f"{taker.label} (take-over): {move.done + move.failed} of its ids are in hand in "
             f"{source}'s last fetched copy ({copy}"
             + (f", from {when}" if when else ", none fetched: every id of it is asked again")
             + f"; {move.done} answered, {move.failed} failed): left out there, the rest asked; "
             f"{taker.label} runs shard {a.spec}"]
    return Placement(job, {taker.label: a}, after_launch, notes=notes, take_over=move), after


@dataclass(frozen=True)
class PushExclusions:
    job: str
    source: str


@dataclass
class ExclusionsCarrier:
    """What the exclusions step reads of the launch plan's private values: the take-over."""

    take_over: TakeOver | None = None


def exclusions_step(target: Target, move: TakeOver) -> Step:
    path = f"{target.layout.job(move.job)}/{EXCLUDE_FILE}"
    return Step("push-exclusions", f"send {target.label} the {move.done + move.failed} ids of "
                                   f"{move.source}'s shard already in hand, to leave out "
                                   f"({path}, with any it holds from an earlier take-over)",
                f"sftp read {path} if there; create a temp name O_EXCL 0600, write the union, "
                f"rename to {path}", "once every host passed its probe",
                PushExclusions(move.job, move.source), run=_push_exclusions,
                check="the take-over run again writes it again whole (renamed into place: "
                      "never half)")


def _push_exclusions(ctx: HostContext, step: Step) -> str:
    s = ctx.session
    move = ctx.private_as(ExclusionsCarrier).take_over
    if move is None:
        raise RuntimeError("the launch plan carries no take-over")
    folder = s.layout.job(move.job)
    path = f"{folder}/{EXCLUDE_FILE}"
    held: set[bytes] = set()
    try:
        size = s.files.stat(path).size
        if size > MAX_EXCLUSIONS:
            raise RemoteError(f"{s.label}: {path} is {size} bytes, more than any take-over "
                              f"writes; move it aside and rerun")
        held = {line for line in b"".join(s.files.read_chunks(path, 0, size)).splitlines() if line}
    except FileNotFoundError:
        pass
    lines = held | {line for line in move.exclusions.splitlines() if line}
    try:
        mkdirs(s.files, folder, 0o700)
        upload_atomic(s.files, b"".join(line + b"\n" for line in sorted(lines)), path, 0o600)
    except OSError as exc:
        raise RemoteError(f"{s.label}: writing {path} failed: {exc}; nothing was started") from None
    more = f" ({len(held)} from an earlier take-over)" if held else ""
    return f"{len(lines)} ids to leave out at {path}{more}"


def states(targets: list[Target], job: str, connect: Connector) -> dict[str, str | None]:
    """Each host's state of `job` (one round trip each, side by side, read only); None for a
    host that cannot be reached or read (it may still run the job)."""
    def one(target: Target) -> str | None:
        session = connect(target)
        try:
            session.connect()
            return read(session, job).state
        except Exception:  # any failure to read: it cannot be told whether it runs
            return None
        finally:
            session.close()

    found = threads.each(targets, one, workers=max(1, len(targets)), name="job-state")
    return {t.label: state for t, state in zip(targets, found, strict=True)}


def _ids(path: Path) -> Iterator[str]:
    """The ids of a fetched copy's whole lines (a torn last line is not one yet)."""
    try:
        fh = path.open("rb")
    except OSError:
        return
    with fh:
        for line in fh:
            if not line.endswith(b"\n") or len(line) > _MAX_LINE:
                continue
            key = record_key(line.rstrip(b"\n"))
            if key is not None:
                yield key


def _spent(path: Path) -> float:
    """What the status.json of a fetched copy says was spent (a host's word, read bounded:
    it only lowers what the taker may spend)."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(untrusted.SMALL_FILE.max_bytes + 1)
        parsed, _ = untrusted.status(untrusted.loads(raw, "the copy's status.json",
                                                     untrusted.SMALL_FILE))
    except (OSError, untrusted.Untrusted):
        return 0.0
    cost = untrusted.number((parsed or {}).get("cost"), minimum=0)
    return cost if cost is not None else 0.0


__all__ = ["EXCLUDE_FILE", "Assignment", "ExclusionsCarrier", "Placement", "TakeOver",
           "exclusions_step", "leaving", "placement", "refusal", "reshard_note", "states", "take_over"]
