"""`fab smoke-test`: one real request from each host with the placed key (the role's
`smoke` command, `payload smoke`), and a table of provider, latency, tokens, cost and the
key's credit left. What it measured (latency, tokens, cost, the endpoint prices) is kept in
the state dir per API and model (`measured`, state.save_smoke): `fab launch` estimates a
run's cost and time from it."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any

from handoff import console
from handoff.config import state
from handoff.config.templates import render_command
from handoff.errors import RemoteError, UsageError
from handoff.host.facts import KEY_FILE, gather
from handoff.host.session import Connector, Session
from handoff.host.targets import Target
from handoff.ops.jobs.state import job_vars, require_deployed
from handoff.run.parallel import HostReport, run_on_hosts

FIELDS = ("model", "served by", "latency", "tokens", "cost", "prices", "key", "smoke", "finish")
# What the table of several hosts shows: their blocks leave these lines out (said once).
IN_TABLE = ("model", "served by", "latency", "tokens", "cost", "key", "smoke")
_NUMBER = r"([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"


def parse(text: str) -> dict[str, str]:
    """`payload smoke` prints `label: value` lines; keep the ones the table shows."""
    fields = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in FIELDS:
            fields[name.strip()] = value.strip()
    return fields


def credit(key_line: str) -> str:
    """`usage $x, limit $y, left $z, expires T` -> `$z left of $y (used $x), expires T`: what
    the key placed on the host may still spend (a minted child key: its own limit)."""
    parts = dict(p.strip().split(" ", 1) for p in key_line.split(",") if " " in p.strip())
    if "left" not in parts:
        return key_line
    limit = f" of {parts['limit']}" if parts.get("limit", "none") != "none" else ""
    expires = f", expires {parts['expires']}" if parts.get("expires", "never") != "never" else ""
    return f"{parts['left']} left{limit} (used {parts.get('usage', '?')}){expires}"


def _number(pattern: str, text: str | None) -> float | None:
    m = re.search(pattern.replace("N", _NUMBER), text or "")
    return float(m.group(1)) if m else None


def _whole(value: float) -> int | float:
    """A token count as an int; one too large for any int (`1e999` is infinity) stays a
    float, which the figures' check then refuses (state.smoke_problem)."""
    return int(value) if math.isfinite(value) else value


def measured(fields: dict[str, str]) -> dict[str, Any] | None:
    """The figures launch's estimate needs, from `payload smoke`'s lines: latency (s),
    prompt and completion tokens, cost (USD) and the endpoint prices (USD per token, per
    request); None when the answer carried no token counts."""
    latency = _number(r"^N s", fields.get("latency"))
    prompt = _number(r"prompt N", fields.get("tokens"))
    completion = _number(r"completion N", fields.get("tokens"))
    if latency is None or prompt is None or completion is None:
        return None
    out: dict[str, Any] = {"latency_s": latency, "prompt_tokens": _whole(prompt),
                           "completion_tokens": _whole(completion),
                           "cost": _number(r"^\$N", fields.get("cost"))}
    # `completion C (reasoning R, content K)`: a thinking model's split, for the estimate
    reasoning = _number(r"reasoning N", fields.get("tokens"))
    content = _number(r"content N", fields.get("tokens"))
    if reasoning is not None and content is not None:
        out["reasoning_tokens"], out["content_tokens"] = _whole(reasoning), _whole(content)
    if "finish" in fields:
        out["cut"] = "cut by" in fields["finish"]
    price_text = fields.get("prices")
    per_m = [_number(rf"{part} \$N/M", price_text) for part in ("prompt", "completion")]
    if per_m[0] is not None and per_m[1] is not None:
        out["prices"] = {"prompt": per_m[0] / 1e6, "completion": per_m[1] / 1e6,
                         "request": _number(r"request \$N", price_text) or 0.0}
    return out


def tokens_cell(text: str | None) -> str:
    """The table's tokens cell: `prompt P, reasoning R, content C` when the answer's split
    is known (a thinking model's reasoning apart from its answer), else as printed."""
    if not text:
        return "-"
    prompt, reasoning, content = (_number(rf"{w} N", text) for w in ("prompt", "reasoning", "content"))
    if prompt is None or reasoning is None or content is None:
        return text
    return f"prompt {prompt:.0f}, reasoning {reasoning:.0f}, content {content:.0f}"


def smoke(s: Session, report: HostReport, *, in_table: bool = False) -> None:
    """Run the role's smoke command on one host; its fields go to the report's `Smoked`.
    `in_table`: a table of every host follows, so the host's block leaves out what it shows."""
    role = s.target.role
    if role is None or not role.smoke:
        raise UsageError(f"{s.label}: role {role.name if role else None!r} has no smoke command")
    facts = gather(s, None, files={KEY_FILE: str(s.vars["key_path"])}, hash_files=False)
    require_deployed(s, facts, role)
    res = s.exec(render_command(role.smoke, job_vars(s, facts, "smoke", {}), "smoke"), timeout=300)
    fields = parse(res.out)
    report.data_as(Smoked).fields.update(fields, rc=res.rc)
    tail = (res.err.strip().splitlines() or res.out.strip().splitlines() or ["no output"])[-1]
    for line in (res.out + res.err).strip().splitlines():
        if res.rc == 0 or line != tail:  # the failure is said once, with its fix, below
            if in_table and res.rc == 0 and line.partition(":")[0].strip() in IN_TABLE:
                continue
            report.log(f"  {console.r(line)}")
    if res.rc != 0:
        reason = tail.removeprefix("smoke: FAILED: ")
        if "(401" in tail:
            # A rotated or revoked key: the keyring holds the new one only after set-key,
            # and the host gets it only with push-key.
            report.data_as(Smoked).fields["error"] = "API key refused (401)"
            raise RemoteError(f"{s.label}: the placed API key was refused ({reason.split('(', 1)[-1]}; "
                              f"store the current key with `fab set-key`, then place it with "
                              f"`fab push-key {s.target.flags()}`")
        report.data_as(Smoked).fields["error"] = reason
        raise RemoteError(f"{s.label}: smoke test failed (exit {res.rc}): {reason}")
    figures = measured(fields)
    problem = state.smoke_problem({**figures, "host": s.label}) if figures is not None else None
    if problem:
        # What a host measured is its word: a figure no real answer has (`latency: 1e308`)
        # is that host's failure, and never reaches the state dir or a later launch.
        report.data_as(Smoked).fields["error"] = f"figures not believable: {problem}"
        raise RemoteError(f"{s.label}: the smoke answer's figures are not believable "
                          f"({problem}); not recorded for launch's estimate")
    report.data_as(Smoked).measured = figures
    report.summary = f"{fields.get('served by', '?')}, {fields.get('latency', '?')}"


@dataclass
class Smoked:
    """A host's smoke-test result: the fields `payload smoke` printed (`served by`, `latency`,
    `tokens`, `cost`, `key`, ...) and its exit code as `rc`."""

    fields: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] | None = None  # the figures launch's estimate needs, checked


def run(targets: list[Target], connect: Connector) -> list[HostReport]:
    """Every host's smoke test; with several, their figures go to one table (`table`) and
    each host's block holds only the rest (finish reason, answer, reasoning, prices)."""
    one = functools.partial(smoke, in_table=len(targets) > 1)
    return run_on_hosts(targets, one, connect=connect, title="smoke-test", summary=False)


def table(reports: list[HostReport]) -> Any:
    rows = []
    for rep in reports:
        d = rep.data_as(Smoked).fields
        rows.append([console.r(rep.target.label), "[green]ok[/]" if rep.ok else "[red]FAILED[/]",
                     console.r(d.get("served by", "-")), console.r(d.get("latency", "-")),
                     console.r(tokens_cell(d.get("tokens"))), console.r(d.get("cost", "-")),
                     console.r(credit(d.get("key", "-"))) if rep.ok
                     else console.r(str(d.get("error") or rep.error or ""))])
    return console.table("smoke-test", ["host", "result", "provider (model)", "latency",
                                        "tokens", "cost", "key credit / error"], rows)
