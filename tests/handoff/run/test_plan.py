"""The executor's all-or-nothing gate (Plan.all_or_nothing, used by launch): no host runs a
changing step until every host has passed its read-only ones, and none does when a host
failed them, could not be reached, or fails meanwhile."""

from __future__ import annotations

from typing import Any

from handoff.errors import ConnectError, HandoffError
from handoff.run import plan
from handoff.run.plan import HostContext, HostPlan, Plan, Skipped, Step
from tests.support.workstation import Workstation


class Host:
    """A stand-in session: the gate only needs a label and a context manager."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.label = target.label

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def build(ws: Workstation, spec: str, fail_check: set[str], changed: list[str],
          gate: bool = True) -> Plan:
    def check(ctx: HostContext, step: Step) -> str:
        if ctx.session.label in fail_check:
            raise HandoffError(f"{ctx.session.label}: refused")
        return Skipped("checked")

    def change(ctx: HostContext, step: Step) -> str:
        changed.append(ctx.session.label)
        return "changed"

    return Plan("t", [HostPlan(t, [Step("check", "c", run=check, changes=False),
                                   Step("change", "x", run=change)]) for t in ws.targets(spec)],
                all_or_nothing=gate)


def test_every_host_changes_when_every_host_passed(ws: Workstation) -> None:
    changed: list[str] = []
    reports = plan.execute(build(ws, "a,b,s,t", set(), changed), connect=Host)  # type: ignore[arg-type]
    assert all(r.ok for r in reports) and sorted(changed) == ["a", "b", "s", "t"]


def test_one_refusal_changes_nothing_anywhere(ws: Workstation) -> None:
    changed: list[str] = []
    reports = plan.execute(build(ws, "a,b,s,t", {"b"}, changed), connect=Host)  # type: ignore[arg-type]
    assert changed == [] and not any(r.ok for r in reports)
    errors = {r.target.label: r.error for r in reports}
    assert errors["b"] == "b: refused"
    assert errors["a"] is not None and errors["a"].startswith("a: nothing changed: b failed its checks")
    # Without the gate, the others go on (deploy's behaviour).
    plan.execute(build(ws, "a,b", {"b"}, changed, gate=False), connect=Host)  # type: ignore[arg-type]
    assert changed == ["a"]


def test_an_unreachable_host_holds_back_the_others(ws: Workstation) -> None:
    changed: list[str] = []

    def connect(target: Any) -> Host:
        if target.label == "t":
            raise ConnectError("t: connection refused")
        return Host(target)

    reports = plan.execute(build(ws, "a,t", set(), changed), connect=connect)  # type: ignore[arg-type]
    assert changed == [] and "nothing changed: t failed" in str(reports[0].error)


def test_ctrl_c_says_per_host_what_was_done_cut_or_not_started(ws: Workstation) -> None:
    """Ctrl-C during a plan (issue 32 #6): per host the changing steps done (their outcomes),
    the one it cut (not known whether it happened, and how to find out), nothing changed
    where nothing had; a host that failed before says why; then the plan's own advice."""
    import signal
    import threading

    import pytest

    from handoff.errors import Interrupted

    release = threading.Event()

    def act(ctx: HostContext, step: Step) -> str:
        if ctx.session.label == "b":
            raise HandoffError("b: refused: no room")
        return f"started x on {ctx.session.label}"

    def slow(ctx: HostContext, step: Step) -> str:
        release.wait(10)
        return "done slowly"

    def check(ctx: HostContext, step: Step) -> str:
        if ctx.session.label == "s":
            release.wait(10)
        return Skipped("checked")

    p = Plan("t", [HostPlan(t, [Step("check", "check it", run=check, changes=False),
                                Step("act", "act", run=act),
                                Step("slow", "the slow step", run=slow, check="`probe` tells")])
                   for t in ws.targets("a,b,s")],
             next_after_interrupt=lambda progress: f"next: {sorted(progress)}")
    timer = threading.Timer(0.5, signal.raise_signal, args=(signal.SIGINT,))
    timer.start()
    try:
        with pytest.raises(Interrupted) as caught:
            plan.execute(p, connect=Host)  # type: ignore[arg-type]
    finally:
        release.set()
    lines = caught.value.message.splitlines()
    assert lines[0] == "interrupted (Ctrl-C) during t; on each host:"
    assert lines[1] == ("  a: done: started x on a; cut while it ran `the slow step`: not known "
                        "whether that happened; `probe` tells")
    assert lines[2] == "  b: nothing changed: it failed before the Ctrl-C: refused: no room"
    assert lines[3] == "  s: nothing changed"
    assert lines[4] == "next: ['a', 'b', 's']"
