"""Operations as data: a Plan is built without touching a host, then executed.

Building a plan needs only the inventory, the role, the local release and the key's
fingerprint; no connection. `--dry-run` prints it and stops, so a dry run cannot
change anything (it does not even connect). Execution connects to every host in
parallel and runs each host's steps in order; a step whose work is already done
(same release, same key) reports "skipped" instead of acting. A failing step ends
that host's plan; other hosts go on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handoff import console
from handoff.errors import HandoffError
from handoff.parallel import HostReport, run_parallel
from handoff.remote import Session
from handoff.targets import Target
from handoff.verify import Facts


@dataclass(frozen=True)
class Step:
    action: str  # handler name: probe, upload-release, switch-current, ...
    description: str  # one line for humans
    detail: str = ""  # the commands/transfers it performs, for --dry-run
    when: str = "always"  # the condition under which it acts
    params: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class HostPlan:
    target: Target
    steps: list[Step]


@dataclass
class Plan:
    title: str
    hosts: list[HostPlan]
    # Values the handlers need but the plan must never print (the key itself).
    private: dict[str, Any] = field(default_factory=dict, repr=False)

    def for_host(self, label: str) -> list[Step]:
        for hp in self.hosts:
            if hp.target.label == label:
                return hp.steps
        raise KeyError(label)


@dataclass
class HostContext:
    session: Session
    report: HostReport
    plan: Plan
    facts: Facts | None = None
    results: dict[str, str] = field(default_factory=dict)

    def need_facts(self) -> Facts:
        if self.facts is None:
            raise HandoffError(f"{self.session.label}: internal: step needs the probe first")
        return self.facts


class Skipped(str):
    """A handler outcome meaning "already so, nothing done" (plain str means it acted)."""


Handler = Callable[[HostContext, Step], str]


def render(plan: Plan) -> None:
    """Print the plan: per host, every step with what it runs and when."""
    console.say(f"[bold]{console.r(plan.title)}[/] — dry run: nothing is changed, no host is contacted")
    for hp in plan.hosts:
        rows = [
            [str(i), console.r(s.description), console.r(s.detail), console.r(s.when)]
            for i, s in enumerate(hp.steps, 1)
        ]
        console.say(console.table(
            f"{hp.target.label} ({hp.target.endpoint})", ["#", "step", "runs", "when"], rows
        ))


def execute(plan: Plan, handlers: dict[str, Handler], *, title: str | None = None) -> list[HostReport]:
    steps_by_label = {hp.target.label: hp.steps for hp in plan.hosts}

    def run_host(target: Target, report: HostReport) -> None:
        with Session(target) as session:
            ctx = HostContext(session, report, plan)
            changed = []
            for step in steps_by_label[target.label]:
                outcome = handlers[step.action](ctx, step)
                ctx.results[step.action] = outcome
                mark = "[dim]=[/]" if isinstance(outcome, Skipped) else "[green]✓[/]"
                report.log(f"  {mark} {console.r(outcome)}")
                if not isinstance(outcome, Skipped) and step.action != "probe":
                    changed.append(step.action)
            report.summary = ("changed: " + ", ".join(changed)) if changed else "no change needed"

    return run_parallel([hp.target for hp in plan.hosts], run_host, title=title or plan.title)
