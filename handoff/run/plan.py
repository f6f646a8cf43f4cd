"""Operations as data: every command that changes a host is a Plan, built without a host,
then executed by the one executor here.

A Plan holds, per host, the Steps to run in order. A Step is data for people (what it
does, what it runs, when it acts: `--dry-run` prints exactly that and connects to no host)
plus the function that performs it on a Session. Building a plan needs only the inventory,
the role, the local release, the key's fingerprint and the command's flags, so a dry run
cannot change anything and plans are unit-tested without a host.

Execution connects to every host in parallel (handoff.run.parallel) and runs each host's
steps in order; a step whose work is already done (same release, same key, job not
running) returns `Skipped` instead of acting. A failing step ends that host's plan; other
hosts go on. Values the steps need but the plan must never print (the API key) ride in
`Plan.private`; one still being fetched (the keyring read, a Future) is awaited before
the host's first step that changes it, so a failed read changes nothing anywhere.

An all-or-nothing plan (`Plan.all_or_nothing`, e.g. launch) also holds every host's first
changing step until every host has passed its read-only checks: when one host fails them
(a job whose input changed, a host that cannot be reached), no host changes anything.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

from handoff import console
from handoff.errors import HandoffError, Interrupted
from handoff.host.facts import Facts
from handoff.host.session import Connector, Session
from handoff.host.ssh_session import SSHSession
from handoff.host.targets import Target
from handoff.run.parallel import MAX_WORKERS, HostReport, HostsInterrupted, run_parallel


class Skipped(str):
    """A step's outcome meaning "already so, nothing done" (a plain str means it acted)."""


Handler = Callable[["HostContext", "Step"], str]
T = TypeVar("T")


def _as(kind: type[T], value: object, what: str) -> T:
    """`value` as the dataclass its reader expects (a plan built wrong is a bug, said so)."""
    if not isinstance(value, kind):
        raise RuntimeError(f"{what} is {type(value).__name__}, not {kind.__name__}")
    return value


def _unset(ctx: HostContext, step: Step) -> str:
    raise RuntimeError(f"step {step.action!r} has no function to run")


@dataclass(frozen=True)
class Step:
    action: str  # what kind of step: probe, upload-release, place-key, start-job, ...
    description: str  # one line for humans
    detail: str = ""  # the commands/transfers it performs, for --dry-run
    when: str = "always"  # the condition under which it acts
    # The step's own inputs: a small dataclass its function reads back with `args()`.
    params: object = field(default=None, compare=False)
    run: Handler = field(default=_unset, compare=False, repr=False)
    changes: bool = True  # may change the host: waits for the plan's pending private values
    # How to find out whether it happened, when Ctrl-C cut it mid-way ("`fab status --host
    # H --job J` tells"); default: a rerun's checks find out.
    check: str = ""

    def args(self, kind: type[T]) -> T:
        """The step's params, typed."""
        return _as(kind, self.params, f"step {self.action!r}'s params")


@dataclass
class HostPlan:
    target: Target
    steps: list[Step]


@dataclass
class Plan:
    title: str
    hosts: list[HostPlan]
    # Values the steps need but the plan must never print (the key itself): one dataclass
    # per kind of plan, whose fields the steps read by `HostContext.private_as`; a field
    # holding a Future is awaited before the first changing step. `pending` says, per field,
    # what failed if it does not arrive ("the API key could not be read from the keyring").
    private: object = field(default=None, repr=False)
    pending: dict[str, str] = field(default_factory=dict)
    # No host changes anything unless every host passed its read-only steps (see Gate).
    all_or_nothing: bool = False
    # What to do after a Ctrl-C, given how far each host got (`interrupted`); default: a
    # rerun is safe (every step checks first and skips what is done).
    next_after_interrupt: Callable[[dict[str, HostProgress]], str] | None = field(
        default=None, repr=False)

    def for_host(self, label: str) -> list[Step]:
        for hp in self.hosts:
            if hp.target.label == label:
                return hp.steps
        raise KeyError(label)


class Gate:
    """The all-or-nothing barrier: each host arrives before its first changing step (or
    leaves, failed or done); a host goes on only once every host has arrived, and none
    does when one failed. Hosts never wait on a host that is already gone."""

    def __init__(self, labels: list[str]) -> None:
        self._waiting = set(labels)
        self._failed: list[str] = []
        self._cond = threading.Condition()

    def arrive(self, label: str) -> None:
        with self._cond:
            self._waiting.discard(label)
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._waiting)
            failed = [f for f in self._failed if f != label]
        if failed:
            raise HandoffError(f"{label}: nothing changed: {', '.join(failed)} failed "
                               f"{'its' if len(failed) == 1 else 'their'} checks (see there), "
                               f"and this plan changes all hosts or none")

    def leave(self, label: str, failed: bool) -> None:
        with self._cond:
            if label in self._waiting:
                self._waiting.discard(label)
                if failed:
                    self._failed.append(label)
                self._cond.notify_all()


@dataclass
class HostProgress:
    """How far one host's plan got, for what a Ctrl-C means there (`interrupted`)."""

    connected: bool = False
    acted: list[tuple[Step, str]] = field(default_factory=list)  # changing steps done, with outcomes
    current: Step | None = None  # the step running now (or, failed, the one that raised)
    ended: bool = False  # its plan had ended (done, or failed) before the Ctrl-C
    failed: bool = False
    error: str | None = None  # why it failed (the summary that would say it is not printed)

    def started(self, action: str) -> bool:
        """Did a step of this kind act here, or may it have (cut mid-way)?"""
        return any(step.action == action for step, _ in self.acted) or (
            self.current is not None and self.current.action == action)


def interrupted(plan: Plan, progress: dict[str, HostProgress]) -> str:
    """What a Ctrl-C during `plan` means, per host: what was done, what was in progress (not
    known whether it happened, and how to find out), or that nothing changed; then what to
    do next (the plan's own `next_after_interrupt`, else: a rerun is safe)."""
    lines = [f"interrupted (Ctrl-C) during {plan.title}; on each host:"]
    for hp in plan.hosts:
        label = hp.target.label
        pr = progress.get(label) or HostProgress()
        parts = [f"done: {'; '.join(outcome for _, outcome in pr.acted)}"] if pr.acted else []
        step = None if pr.ended else pr.current  # an ended host's last step ran to its end
        if step is not None and step.changes:
            parts.append(f"cut while it ran `{step.description}`: not known whether that "
                         f"happened; {step.check or 'a rerun checks first and finds out'}")
        if pr.ended and pr.failed:
            parts.append(("then " if pr.acted else "nothing changed: ")
                         + f"it failed before the Ctrl-C: {pr.error or 'see above'}")
        if not parts:
            parts.append("nothing changed" + ("" if pr.connected else " (not connected yet)"))
        lines.append(f"  {label}: " + "; ".join(parts))
    advice = plan.next_after_interrupt(progress) if plan.next_after_interrupt else (
        "rerunning the command is safe: each step checks what is already done and skips it")
    return "\n".join([*lines, advice])


@dataclass
class HostContext:
    """What a step gets besides its own Step: the host, its report, the whole plan, and
    what earlier steps learnt (the probe's facts)."""

    session: Session
    report: HostReport
    plan: Plan
    facts: Facts | None = None
    results: dict[str, str] = field(default_factory=dict)
    gate: Gate | None = None  # an all-or-nothing plan's barrier

    def need_facts(self) -> Facts:
        if self.facts is None:
            raise RuntimeError(f"{self.session.label}: a step needs the probe's facts first")
        return self.facts

    def private_as(self, kind: type[T]) -> T:
        """The plan's private values, typed (`kind`: the dataclass, or a base of it, that
        this step's module defines for what it reads)."""
        return _as(kind, self.plan.private, f"plan {self.plan.title!r}'s private values")

    def arrived(self, name: str, value: Future[T]) -> T:
        """A private value still being fetched (the private field `name`), once it is there;
        one that failed to arrive stops this host: nothing changed."""
        try:
            return value.result()
        except HandoffError:
            # The message (how to fix it) is printed once by the command, not per host.
            what = self.plan.pending.get(name, f"{name} is unavailable")
            raise HandoffError(f"{self.session.label}: nothing changed: {what} "
                               f"(see below)") from None

    def ready(self) -> None:
        """Wait for every pending private value: nothing changes on a host before all are
        known to be there."""
        if dataclasses.is_dataclass(self.plan.private):
            for f in dataclasses.fields(self.plan.private):
                value = getattr(self.plan.private, f.name)
                if isinstance(value, Future):
                    self.arrived(f.name, value)
        if self.gate is not None:
            gate, self.gate = self.gate, None
            gate.arrive(self.session.label)


def render(plan: Plan) -> None:
    """Print the plan: per host, every step with what it runs and when."""
    console.say(f"[bold]{console.r(plan.title)}[/] — dry run: nothing is changed, no host is contacted")
    if not console.console().is_terminal:
        # Piped or logged: a table as wide as its longest command (hundreds of columns) is
        # unreadable there; one step per line, what it runs and when below it.
        for hp in plan.hosts:
            console.say(f"{console.r(hp.target.label)} ({console.r(hp.target.endpoint)})")
            for i, s in enumerate(hp.steps, 1):
                console.say(f"  {i}. {console.r(s.description)}\n     runs: {console.r(s.detail)}"
                            f"\n     when: {console.r(s.when)}")
        return
    for hp in plan.hosts:
        rows = [
            [str(i), console.r(s.description), console.r(s.detail), console.r(s.when)]
            for i, s in enumerate(hp.steps, 1)
        ]
        console.say(console.table(
            f"{hp.target.label} ({hp.target.endpoint})", ["#", "step", "runs", "when"], rows
        ))


def run_steps(ctx: HostContext, steps: list[Step], progress: HostProgress | None = None) -> None:
    """One host's steps in order; the report logs each outcome and ends with a summary.
    `progress` follows them (what a Ctrl-C means here)."""
    changed = []
    progress = progress or HostProgress()
    for step in steps:
        if step.changes:
            ctx.ready()
        progress.current = step
        outcome = step.run(ctx, step)
        if step.changes and not isinstance(outcome, Skipped):
            progress.acted.append((step, outcome))
        progress.current = None
        ctx.results[step.action] = outcome
        mark = "[dim]=[/]" if isinstance(outcome, Skipped) else "[green]✓[/]"
        ctx.report.log(f"  {mark} {console.r(outcome)}")
        if step.changes and not isinstance(outcome, Skipped):
            changed.append(step.action)
    if not ctx.report.summary:  # a step may have set a more telling one
        ctx.report.summary = ("changed: " + ", ".join(changed)) if changed else "no change needed"


def execute(plan: Plan, *, connect: Connector = SSHSession,
            title: str | None = None) -> list[HostReport]:
    """Run `plan` on its hosts in parallel, each through a session from `connect`."""
    steps_by_label = {hp.target.label: hp.steps for hp in plan.hosts}
    gate = Gate(list(steps_by_label)) if plan.all_or_nothing else None
    progress = {label: HostProgress() for label in steps_by_label}

    def run_host(target: Target, report: HostReport) -> None:
        failed = True
        mine = progress[target.label]
        try:
            with connect(target) as session:
                mine.connected = True
                run_steps(HostContext(session, report, plan, gate=gate), steps_by_label[target.label],
                          mine)
            failed = False
        finally:
            mine.failed = failed
            if gate is not None:
                gate.leave(target.label, failed)

    targets = [hp.target for hp in plan.hosts]
    # Behind a gate every host must be able to arrive at once: one thread per host.
    workers = len(targets) if gate is not None and targets else MAX_WORKERS
    try:
        return run_parallel(targets, run_host, title=title or plan.title, workers=workers)
    except HostsInterrupted as exc:
        for rep in exc.reports:
            if rep.target.label in exc.ended:  # ended before the Ctrl-C: nothing of it was cut
                progress[rep.target.label].ended = True
                progress[rep.target.label].error = rep.reason
        raise Interrupted(interrupted(plan, progress)) from None
