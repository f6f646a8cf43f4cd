"""Before a launch: what it will ask, cost and take, per dataset (`fab launch` prints it;
`fab launch --dry-run` prints it with the plan and starts nothing).

- prompts: the distinct valid records of each local input (handoff.ops.jobs.datasets);
- tokens: the prompts' text at ~4 characters per token; the answers' length from the old
  answers the records carry (a trailing assistant turn is what gets regenerated), else
  `--max-tokens` as an upper bound (reasoning included: it bounds both), else unknown;
- reasoning: a thinking model writes reasoning tokens before its answer, billed as
  completion tokens, which old answers do not show. They are counted at the ratio of
  reasoning to content tokens the last smoke test measured (`payload smoke` prints
  `completion N (reasoning R, content C)`); without that ratio (no smoke test, a server
  that reports no reasoning tokens, a smoke answer that was all reasoning) the estimate
  says it cannot count them rather than quietly leaving them out;
- cost: those tokens at the endpoint's prices, or at the cost per token the last
  `fab smoke-test` measured for this API and model (state.load_smoke), else unknown;
- time: each host runs `concurrency` requests of each job at once; one request takes about
  its answer's tokens at the speed the smoke test measured (completion tokens / latency),
  so the job takes about max(1, prompts / (hosts x concurrency)) requests' time. It is a
  floor: throttling and outages only add to it.

Everything here is local: no host and no API is contacted (the smoke test did that). So
the estimate printed before a launch counts every prompt of the input; a relaunch resumes
its job, asking only the prompts not yet done or failed. Once every host has answered its
probe (`probe.Resumed`: each shard's ids already recorded), the launch prints what is left
and what that costs and takes (`already_done`, `left_lines`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handoff import console
from handoff.config import state
from handoff.host.targets import Target
from handoff.ops.jobs.datasets import Dataset
from payload import units

CHARS_PER_TOKEN = 4.0  # a common rule of thumb for English text and code; "~" in the output


@dataclass(frozen=True)
class Basis:
    """What the estimate's cost and time rest on."""

    prices: tuple[float, float, float] | None = None  # USD per prompt/completion token, per request
    per_token: float | None = None  # USD per token (prompt and answer alike), measured
    speed: float | None = None  # answer tokens per second of one request, measured
    smoke_at: float | None = None  # when the smoke test ran
    model: str = ""
    reasoning_ratio: float | None = None  # reasoning tokens per content token, measured
    reasoning_why: str = "no smoke test recorded: run `fab smoke-test`"  # why no ratio

    @staticmethod
    def ratio_of(found: dict[str, Any]) -> tuple[float | None, str]:
        """(reasoning tokens per content token, or None and why) from a smoke test's split."""
        reasoning, content = found.get("reasoning_tokens"), found.get("content_tokens")
        if not isinstance(reasoning, int) or not isinstance(content, int):
            return None, ("the smoke test recorded no reasoning/content split (the server "
                          "reports no reasoning_tokens, or the smoke test is older): rerun "
                          "`fab smoke-test`")
        if content > 0:
            return reasoning / content, ""
        if reasoning > 0:
            return None, ("the smoke answer was all reasoning (cut at its max_tokens): no "
                          "ratio to scale the old answers by; give --max-tokens for an upper "
                          "bound")
        return 0.0, ""

    @classmethod
    def of(cls, base_url: str, model: str) -> Basis:
        found = state.load_smoke(base_url, model, warn=console.warn)
        if not found:
            return cls(model=model)
        prices = found.get("prices")
        tokens = (found.get("prompt_tokens") or 0) + (found.get("completion_tokens") or 0)
        cost = found.get("cost")
        latency = found.get("latency_s")
        completion = found.get("completion_tokens") or 0
        ratio, why = cls.ratio_of(found)
        return cls(
            reasoning_ratio=ratio, reasoning_why=why,
            prices=(float(prices["prompt"]), float(prices["completion"]), float(prices.get("request", 0.0)))
            if isinstance(prices, dict) else None,
            per_token=float(cost) / tokens if isinstance(cost, (int, float)) and tokens else None,
            speed=completion / float(latency) if latency and completion else None,
            smoke_at=found.get("time"), model=model)

    def describe(self) -> str:
        if self.smoke_at is None:
            return ("cost and time unknown: run `fab smoke-test` first (it records the measured "
                    "cost per token, the endpoint's prices and the answer speed)")
        parts = []
        if self.prices:
            p, c, r = self.prices
            parts.append(f"endpoint prices ${p * 1e6:.2f}/M prompt, ${c * 1e6:.2f}/M answer tokens"
                         + (f", ${r:.6f}/request" if r else ""))
        elif self.per_token is not None:
            parts.append(f"${self.per_token * 1e6:.2f}/M tokens as measured")
        if self.speed:
            parts.append(f"{self.speed:.0f} answer tok/s per request")
        return f"from the smoke test of {self.model}: {', '.join(parts) or 'no usable figure'}"

    def reasoning_text(self) -> str:
        """How the estimate's answer tokens treat reasoning, for the caption."""
        if self.reasoning_ratio is None:
            return f"reasoning tokens NOT counted in old answers' lengths: {self.reasoning_why}"
        if self.reasoning_ratio == 0:
            return "no reasoning tokens (the smoke answer had none)"
        return (f"reasoning counted at {self.reasoning_ratio:.2f} tokens per answer token "
                f"(the smoke test's ratio)")


@dataclass(frozen=True)
class Row:
    job: str
    prompts: int
    bad: int
    prompt_tokens: float
    answer_tokens: float | None
    answer_source: str  # "old answers", "at most --max-tokens", "unknown"
    cost: float | None
    seconds: float | None


def estimate(ds: Dataset, basis: Basis, hosts: int, concurrency: int,
             max_tokens: int | None, prompts: int | None = None) -> Row:
    """The dataset's row; `prompts`: only that many of its prompts still to ask (a relaunch),
    each as long as the dataset's average one."""
    c = ds.check
    n = c.prompts if prompts is None else max(0, min(prompts, c.prompts))
    share = n / c.prompts if c.prompts else 0.0
    prompt_tokens = c.prompt_chars / CHARS_PER_TOKEN * share
    per_answer: float | None
    if c.answers:
        per_answer, source = c.answer_chars / c.answers / CHARS_PER_TOKEN, "old answers"
        if basis.reasoning_ratio:  # the reasoning a thinking model writes before them
            per_answer *= 1.0 + basis.reasoning_ratio
            source = "old answers + reasoning"
        if max_tokens:
            per_answer = min(per_answer, float(max_tokens))
    elif max_tokens:
        per_answer, source = float(max_tokens), "at most --max-tokens"
    else:
        per_answer, source = None, "unknown"
    answer_tokens = None if per_answer is None else per_answer * n
    cost = None
    if basis.prices is not None and answer_tokens is not None:
        p, a, r = basis.prices
        cost = prompt_tokens * p + answer_tokens * a + n * r
    elif basis.per_token is not None and answer_tokens is not None:
        cost = (prompt_tokens + answer_tokens) * basis.per_token
    seconds = None
    if basis.speed and per_answer is not None and concurrency > 0:
        waves = max(1.0, n / (max(1, hosts) * concurrency))
        seconds = waves * per_answer / basis.speed if n else 0.0
    return Row(ds.job, n, c.bad, prompt_tokens, answer_tokens, source, cost, seconds)


def budget_warnings(rows: list[Row], budget: float | None) -> list[str]:
    """Per job whose estimated cost exceeds its budget (`--max-cost`): that it will stop
    when the budget is spent, after about which share of its prompts and how long (the
    time the estimate gives is for all of them, which the budget does not allow)."""
    if budget is None:
        return []
    out = []
    for r in rows:
        if r.cost is None or r.cost <= budget:
            continue
        share = budget / r.cost if r.cost else 1.0
        when = f", after ~{units.duration(r.seconds * share)}" if r.seconds is not None else ""
        out.append(f"{r.job}: the estimate ~${r.cost:,.2f} exceeds the budget ${budget:g} "
                   f"(--max-cost): the job stops when it is spent, with about "
                   f"{share:.0%} of its {r.prompts} prompts answered{when}; raise --max-cost "
                   f"to answer them all")
    return out


def _tokens(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"~{n / scale:.1f}{unit}"
    return f"~{n:.0f}"


def rows_for(datasets: list[Dataset], targets: list[Target],
             left: dict[str, int] | None = None) -> tuple[list[Row], Basis]:
    """One row per dataset, at the first target's API, model, concurrency and max_tokens
    (a launch gives every host the same flags; inventory vars may differ, the first speaks);
    `left`: per job, the prompts still to ask (a relaunch), when not all of them."""
    v = targets[0].vars
    basis = Basis.of(str(v.get("base_url") or ""), str(v.get("model") or ""))
    concurrency = int(v.get("concurrency") or 1)
    max_tokens = int(v["max_tokens"]) if v.get("max_tokens") else None
    return [estimate(ds, basis, len(targets), concurrency, max_tokens, (left or {}).get(ds.job))
            for ds in datasets], basis


def already_done(recorded: list[dict[str, int | None]], sharded: bool) -> dict[str, int | None]:
    """Per job relaunched (`recorded`: each host's `probe.Resumed.recorded`), its prompts
    already done or failed on the hosts: the shards' sum; with every host running the whole
    input (`--no-shard`), the fewest any host did (a host new to the job did none). None: not
    known (a host held another shard of it before: resharded). Jobs new everywhere are not
    listed: their estimate is already right."""
    jobs = {job for r in recorded for job in r}
    out: dict[str, int | None] = {}
    for job in sorted(jobs):
        counts = [r.get(job, 0) for r in recorded]
        if any(c is None for c in counts):
            out[job] = None
        else:
            known = [c or 0 for c in counts]
            out[job] = sum(known) if sharded else min(known)
    return out


def left_lines(datasets: list[Dataset], targets: list[Target],
               done: dict[str, int | None]) -> list[str]:
    """What a relaunch has left, per job relaunched: how many prompts are already done on the
    hosts, and the estimate of the rest (cost and time as the table before it reckons them)."""
    left = {ds.job: max(0, ds.check.prompts - (done.get(ds.job) or 0)) for ds in datasets
            if done.get(ds.job) is not None}
    rows = {r.job: r for r in rows_for(datasets, targets, left)[0]}
    lines = []
    for ds in datasets:
        if ds.job not in done:
            continue
        total = ds.check.prompts
        n = done[ds.job]
        if n is None:
            lines.append(f"{ds.job}: relaunched over other shards than before: the prompts "
                         f"already done are not known here (ids another host did may be asked "
                         f"again), so the estimate above, for all {total}, is an upper bound")
            continue
        row = rows[ds.job]
        if row.prompts == 0:
            lines.append(f"{ds.job}: relaunched: every prompt is already done or failed on the "
                         f"hosts ({min(n, total)} of {total}): nothing left to ask")
            continue
        cost = f"~${row.cost:,.2f}" if row.cost is not None else "cost ?"
        time = f"~{units.duration(row.seconds)} (floor)" if row.seconds is not None else "time ?"
        lines.append(f"{ds.job}: relaunched: {min(n, total)} of {total} prompts already done or "
                     f"failed on the hosts (not asked again); what is left, {row.prompts} "
                     f"prompt{'s' if row.prompts != 1 else ''}: {cost}, {time}")
    return lines


def extractor_table(datasets: list[Dataset], hosts: int, note: str = "") -> Any:
    """An extractor's estimate: what it reads, not what it asks (no API, no dollars): per
    dataset its samples and their tokens (prompt and generated answer, ~4 characters each),
    each host's share of them, and how the features' size follows from them."""
    rows = []
    for ds in datasets:
        c = ds.check
        tokens = (c.prompt_chars + c.response_chars) / CHARS_PER_TOKEN
        rows.append([console.r(ds.job), str(c.prompts), str(c.bad) if c.bad else "-",
                     str(c.responses) if c.responses < c.prompts else "all",
                     _tokens(tokens), _tokens(tokens / max(1, hosts))])
    t = console.table(f"estimate: {len(datasets)} dataset(s) over {hosts} host(s), extractor "
                      f"(features of the target model; no API, no dollars)",
                      ["job", "samples", "bad lines", "with an answer", "tokens", "per host"], rows)
    caption = (f"tokens at ~{CHARS_PER_TOKEN:g} characters each (the model's tokenizer decides); "
               f"the features are those tokens x the target's hidden size x 4 states (3 aux "
               f"layers and the last) at the feature dtype's bytes (bf16: 2): the payload's "
               f"preflight on each host reads the model's config and refuses a disk that "
               f"cannot hold them (`fab verify --role extractor` runs it alone)")
    if note:
        caption += "; " + note
    t.caption = console.r(caption)
    return t


def table(rows: list[Row], basis: Basis, hosts: int, concurrency: int, note: str = "") -> Any:
    """The estimate table; `note` ends its caption (what a relaunch changes)."""
    def money(x: float | None) -> str:
        return f"~${x:,.2f}" if x is not None else "?"

    out = [[console.r(r.job), str(r.prompts), str(r.bad) if r.bad else "-", _tokens(r.prompt_tokens),
            f"{_tokens(r.answer_tokens)} ({r.answer_source})", money(r.cost),
            f"~{units.duration(r.seconds)}" if r.seconds is not None else "?"] for r in rows]
    if len(rows) > 1:
        known = [r.cost for r in rows if r.cost is not None]
        out.append(["[bold]all[/]", str(sum(r.prompts for r in rows)), str(sum(r.bad for r in rows)),
                    _tokens(sum(r.prompt_tokens for r in rows)),
                    _tokens(sum(r.answer_tokens for r in rows if r.answer_tokens is not None)),
                    money(sum(known)) if len(known) == len(rows) else "?",
                    "jobs run side by side"])
    t = console.table(f"estimate: {len(rows)} dataset(s) over {hosts} host(s), {concurrency} "
                      f"requests in flight per host and job",
                      ["job", "prompts", "bad lines", "prompt tokens", "answer tokens", "cost",
                       "time (floor)"], out)
    caption = basis.describe() + f"; tokens at ~{CHARS_PER_TOKEN:g} characters each"
    if any(r.answer_source.startswith("old answers") for r in rows):
        caption += "; " + basis.reasoning_text()
    if note:
        caption += "; " + note
    t.caption = console.r(caption)
    return t
