"""The report as one self-contained HTML page: the summary block first (and its figures as
`<script type="application/json" id="handoff-summary">`), the plots as inline SVG, the
hosts, and the answers browser; no external resource of any kind.

Everything a host wrote (names, prompts, answers, error messages) is escaped here, once,
as text: a record cannot add markup or script to the page. The page's Content Security
Policy forbids every fetch (`default-src 'none'`; inline styles and the two inline
scripts only, images only as `data:`), so even a bug in the escaping could not make it
reach the network. The scripts are small and optional: the answers browser's filters, and
on the live page a reload every few seconds that keeps the reader's place. The JSON block
escapes `<`, `>` and `&`, so no string in it can end the script element.
"""

from __future__ import annotations

import html
import json
import time
from typing import Any

from handoff.ops.report.plots import Plot
from handoff.ops.report.records import Answer, quantiles
from handoff.ops.report.runs import JobData
from payload import units

CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "img-src data:; base-uri 'none'; form-action 'none'")

STYLE = """
:root { --ink: #1d2430; --muted: #5b6575; --line: #d9dee6; --card: #f5f7fa; --warn: #9a5b00;
        --bad: #b42318; --ok: #1a7f37; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1180px; padding: 20px 24px 60px; color: var(--ink);
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; }
h1 { font-size: 22px; margin: 0 0 2px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.sub { color: var(--muted); margin: 0 0 14px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(165px, 1fr)); gap: 8px;
         margin: 0; }
.cards div { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
             padding: 8px 10px; }
.cards dt { color: var(--muted); font-size: 12px; } .cards dd { margin: 2px 0 0; font-size: 18px;
             font-weight: 600; font-variant-numeric: tabular-nums; }
.cards dd small { font-size: 12px; font-weight: 400; color: var(--muted); }
table { border-collapse: collapse; margin: 6px 0; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 10px 4px 0; text-align: left;
         vertical-align: top; }
th { color: var(--muted); font-weight: 500; font-size: 12px; }
td.n { text-align: right; }
figure { margin: 14px 0 22px; } figure h3 { font-size: 15px; margin: 0 0 4px; }
figcaption, .note { color: var(--muted); font-size: 12px; }
svg.plot { width: 100%; height: auto; display: block; }
.missing { color: var(--warn); }
.state-running, .state-starting { color: var(--ok); } .state-stopped, .state-dead,
.state-aborted, .state-unreachable { color: var(--bad); }
#answers .filters { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin: 6px 0; }
details.answer { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0;
                 padding: 6px 10px; background: #fff; }
details.answer summary { cursor: pointer; font-variant-numeric: tabular-nums; }
details.answer .why { display: inline-block; min-width: 52px; font-weight: 600; }
.why-cut { color: var(--warn); } .why-error { color: var(--bad); }
pre { white-space: pre-wrap; word-break: break-word; background: var(--card); padding: 8px;
      border-radius: 4px; margin: 4px 0 8px; max-height: 340px; overflow: auto;
      font: 12.5px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; }
.label { color: var(--muted); font-size: 12px; margin-top: 6px; }
a { color: #0b5cad; }
"""

FILTER_JS = """
(function () {
  var root = document.getElementById("answers");
  if (!root) { return; }
  var items = Array.prototype.slice.call(root.querySelectorAll("details.answer"));
  var selects = Array.prototype.slice.call(root.querySelectorAll("select[data-f]"));
  var search = root.querySelector("input[type=search]");
  var shown = document.getElementById("answers-shown");
  var key = "handoff-filters:" + location.pathname;
  function apply() {
    var text = (search.value || "").toLowerCase();
    var n = 0;
    items.forEach(function (el) {
      var ok = selects.every(function (s) { return !s.value || el.dataset[s.dataset.f] === s.value; })
        && (!text || el.textContent.toLowerCase().indexOf(text) >= 0);
      el.hidden = !ok;
      if (ok) { n += 1; }
    });
    shown.textContent = String(n);
    try {
      sessionStorage.setItem(key, JSON.stringify(selects.map(function (s) { return s.value; })
        .concat([search.value])));
    } catch (e) { /* storage off: filters are not kept across reloads */ }
  }
  try {
    var kept = JSON.parse(sessionStorage.getItem(key) || "null");
    if (kept) {
      selects.forEach(function (s, i) { s.value = kept[i] || ""; });
      search.value = kept[selects.length] || "";
    }
  } catch (e) { /* nothing kept */ }
  selects.forEach(function (s) { s.addEventListener("change", apply); });
  search.addEventListener("input", apply);
  apply();
})();
"""

LIVE_JS = """
(function () {
  var live = document.querySelector("meta[name=handoff-live]");
  if (!live) { return; }
  var key = "handoff-scroll:" + location.pathname;
  var y = Number(sessionStorage.getItem(key) || "0");
  if (y) { window.scrollTo(0, y); }
  setTimeout(function () {
    sessionStorage.setItem(key, String(window.scrollY));
    location.reload();
  }, 1000 * Number(live.content));
})();
"""


def e(value: Any) -> str:
    """Text for the page: escaped, quotes included (safe in attributes too)."""
    return html.escape("" if value is None else str(value), quote=True)


def summary_json(figures: dict[str, Any]) -> str:
    text = json.dumps(figures, ensure_ascii=False, sort_keys=True, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def money(v: Any) -> str:
    if not isinstance(v, (int, float)):
        return "-"
    return f"${v:,.4f}" if abs(v) < 100 else f"${v:,.2f}"


def count(v: Any) -> str:
    return f"{v:,.0f}" if isinstance(v, (int, float)) else "-"


def seconds(v: Any) -> str:
    return f"{v:.2f} s" if isinstance(v, (int, float)) else "-"


def when(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _names(counts: dict[str, int] | None, limit: int = 4) -> str:
    if not counts:
        return "-"
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    shown = ", ".join(f"{k} ({v:,})" for k, v in ranked[:limit])
    return shown + (f", +{len(ranked) - limit} more" if len(ranked) > limit else "")


def cards(s: dict[str, Any]) -> str:
    """The summary block's cards; each figure's element carries `data-k` (its JSON key)."""
    lat = s.get("latency_s") or {}
    rows = [("samples answered", "samples", count(s.get("samples")),
             f"of {count(s.get('total'))} ids" if s.get("total") else ""),
            ("failed", "failed", count(s.get("failed")), "")]
    if s.get("kind") == "extractor":
        rows += [("tokens", "tokens", count(s.get("tokens")), ""),
                 ("supervised tokens", "supervised_tokens", count(s.get("supervised_tokens")), ""),
                 ("written", "bytes_written", units.size(s.get("bytes_written")), ""),
                 ("re-tokenized mismatches", "mismatches", count(s.get("mismatches")), ""),
                 ("dropped by policy", "dropped", count(s.get("dropped")), "")]
    else:
        rows += [("cut by max_tokens", "cut", count(s.get("cut")), ""),
                 ("cancelled in flight", "cancelled", count(s.get("cancelled")),
                  "by a stop or a budget; asked again on resume"),
                 ("spent", "cost_usd", money(s.get("cost_usd")),
                  f"budget {money(s.get('budget_usd'))}" if s.get("budget_usd") else ""),
                 ("$ per M tokens", "usd_per_mtok", money(s.get("usd_per_mtok")), ""),
                 ("prompt tokens", "prompt_tokens", count(s.get("prompt_tokens")), ""),
                 ("reasoning tokens", "reasoning_tokens", count(s.get("reasoning_tokens")), ""),
                 ("content tokens", "content_tokens", count(s.get("content_tokens")), ""),
                 ("completion tokens", "completion_tokens", count(s.get("completion_tokens")), ""),
                 ("latency p50", "latency_p50", seconds(lat.get("p50")), ""),
                 ("latency p90", "latency_p90", seconds(lat.get("p90")), ""),
                 ("latency p99", "latency_p99", seconds(lat.get("p99")), "")]
    rows += [("wall time", "wall_s", units.duration(s.get("wall_s")), ""),
             ("throughput", "answers_per_s",
              f"{s['answers_per_s']:.2f}/s" if s.get("answers_per_s") is not None else "-",
              f"{count(s.get('tokens_per_s'))} tokens/s" if s.get("tokens_per_s") else "")]
    out = []
    for label, key, shown, small in rows:
        out.append(f'<div><dt>{e(label)}</dt><dd data-k="{e(key)}">{e(shown)}'
                   + (f" <small>{e(small)}</small>" if small else "") + "</dd></div>")
    return '<dl class="cards">' + "".join(out) + "</dl>"


def facts(s: dict[str, Any], data: JobData | None) -> str:
    """Hosts, providers, models and the sampling settings, as a small table."""
    rows = [("hosts", ", ".join(s.get("hosts") or []) or "-"),
            ("started", when(s.get("started"))),
            ("figures from", f"{s.get('source')}; timeline from {s.get('timeline', '-')}")]
    if s.get("providers"):
        rows.append(("providers", _names(s.get("providers"))))
    if s.get("models"):
        rows.append(("model", _names(s.get("models"), 2)))
    if s.get("finish_reasons"):
        rows.append(("finish reasons", _names(s.get("finish_reasons"))))
    if s.get("errors_by_kind"):
        rows.append(("failures by kind", _names(s.get("errors_by_kind"))))
    if s.get("settings"):
        rows.append(("asked (job.json)", " · ".join(f"{k} {v}" for k, v in s["settings"].items())))
    if s.get("budget_usd"):
        rows.append(("budget", money(s.get("budget_usd"))))
    if s.get("meta"):
        rows.append(("features (meta.json)", " · ".join(f"{k} {v}" for k, v in s["meta"].items())))
    if data is not None:
        meta = data.meta
        if meta.get("input"):
            rows.append(("input", f"{meta.get('input')} ({count(meta.get('prompts'))} prompts)"))
    if s.get("unreadable") or s.get("torn"):
        rows.append(("left out", f"{s.get('unreadable') or 0} unreadable lines, "
                                 f"{s.get('torn') or 0} lines still being written"))
    return "<table class=\"facts\">" + "".join(
        f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows) + "</table>"


def hosts_table(data: JobData, summary: dict[str, Any]) -> str:
    rec = data.records
    head = ["host", "shard", "state", "done", "failed", "total", "cost", "updated"]
    if rec is not None:
        head += ["answers in the records", "p50 latency"]
    rows = []
    for c in data.copies:
        st = c.status
        cells = [e(c.host), e(c.meta.get("shard") or "-"),
                 f'<span class="state-{e(c.state)}">{e(c.state)}</span>',
                 count(st.get("done")), count(st.get("failed")), count(st.get("total")),
                 money(st.get("cost")), e(st.get("updated") if isinstance(st.get("updated"), str)
                                          else when(st.get("updated")))]
        if rec is not None:
            mine = rec.host_answers(c.host)
            q = quantiles(rec.latency[i] for i in mine) or {}
            cells += [count(len(mine)), seconds(q.get("p50"))]
        if c.problems:
            cells[2] += f' <span class="missing">({e("; ".join(c.problems[:3]))})</span>'
        rows.append("<tr>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>")
    return ("<table class=\"hosts\"><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
            + "".join(rows) + "</table>")


def figures(plots: list[Plot], missing: list[str]) -> str:
    out = []
    for p in plots:
        out.append(f'<figure id="fig-{e(p.key)}"><h3>{e(p.title)}</h3>{p.svg}'
                   f"<figcaption>{e(p.note)}</figcaption></figure>")
    for why in missing:
        out.append(f'<p class="missing note">{e(why)}</p>')
    return "".join(out)


def _answer(a: Answer) -> str:
    tokens = (f"{count(a.prompt_tokens)} → {count(a.completion_tokens)} tokens"
              + (f" ({count(a.reasoning_tokens)} reasoning)" if a.reasoning_tokens is not None else ""))
    head = (f'<span class="why why-{e(a.why)}">{e(a.why)}</span> <b>{e(a.id)}</b> · {e(a.host)}'
            + (f" · {e(a.provider)} · {e(a.finish_reason)} · {seconds(a.latency_s)} · {e(tokens)}"
               f" · {money(a.cost)}" if a.why != "error" else f" · {e(a.error)}"))
    body = []
    for label, text in (("prompt (last user turn)", a.prompt), ("reasoning", a.reasoning),
                        ("answer", a.response), ("error", a.error if a.why == "error" else None)):
        if text:
            body.append(f'<div class="label">{e(label)}</div><pre>{e(text)}</pre>')
    attrs = (f'data-why="{e(a.why)}" data-finish="{e(a.finish_reason)}" '
             f'data-provider="{e(a.provider)}" data-host="{e(a.host)}"')
    return f'<details class="answer" {attrs}><summary>{head}</summary>{"".join(body)}</details>'


def answers_browser(sampled: list[Answer], total: int, size: int) -> str:
    if not sampled:
        return ""

    def choice(label: str, attr: str, values: list[str]) -> str:
        options = "".join(f'<option value="{e(v)}">{e(v)}</option>' for v in sorted(set(values)))
        return (f'<label>{e(label)} <select data-f="{e(attr)}"><option value="">all</option>'
                f"{options}</select></label>")

    filters = "".join([
        choice("kind", "why", [a.why for a in sampled]),
        choice("finish reason", "finish", [a.finish_reason for a in sampled]),
        choice("provider", "provider", [a.provider for a in sampled]),
        choice("host", "host", [a.host for a in sampled]),
        '<label>text <input type="search" placeholder="find in the shown text"></label>',
        f'<span class="note"><span id="answers-shown">{len(sampled)}</span> of {len(sampled)} shown</span>',
    ])
    return (f'<section id="answers"><h2>Answers</h2><p class="note">A bounded sample of the '
            f"{count(total)} records: {size} random answers, and up to {size} of the cut ones "
            f"and {size} of the failures (texts cut to a few thousand characters; "
            f"`fab report --answers N` changes the size).</p>"
            f'<div class="filters">{filters}</div>'
            + "".join(_answer(a) for a in sampled) + "</section>")


def document(title: str, subtitle: str, body: str, figures_json: dict[str, Any],
             live_every: float | None) -> str:
    live = (f'<meta name="handoff-live" content="{live_every:g}">'
            f'<noscript><meta http-equiv="refresh" content="{live_every:g}"></noscript>'
            if live_every else "")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"{live}<title>{e(title)}</title><style>{STYLE}</style></head><body>"
            f"<header><h1>{e(title)}</h1><p class=\"sub\">{e(subtitle)}</p></header>"
            f'<script type="application/json" id="handoff-summary">{summary_json(figures_json)}</script>'
            f"{body}<script>{FILTER_JS}</script><script>{LIVE_JS}</script></body></html>\n")


def job_page(data: JobData, s: dict[str, Any], plots: list[Plot], missing: list[str], *,
             answers: list[Answer], sample_size: int, live_every: float | None,
             run_link: str | None) -> str:
    what = "extractor job" if data.kind == "extractor" else "job"
    sub = (f"{'live from the hosts, refreshed every ' + format(live_every, 'g') + ' s' if live_every else 'built from the fetched files'}"
           f" · {when(time.time())}")
    nav = f'<p><a href="{e(run_link)}">← the whole run</a></p>' if run_link else ""
    body = [nav, '<section id="summary"><h2>Summary</h2>', cards(s), facts(s, data), "</section>",
            '<section id="plots"><h2>Plots</h2>', figures(plots, missing), "</section>",
            '<section id="hosts"><h2>Hosts</h2>', hosts_table(data, s), "</section>"]
    feat = data.features
    if feat is not None and feat.mismatch_samples:
        rows = "".join(f"<tr><td>{e(m['host'])}</td><td>{e(m['id'])}</td><td>{count(m['turn'])}</td>"
                       f"<td>{count(m['supervised'])}</td><td>{count(m['completion_tokens'])}</td>"
                       f"<td>{e(m['action'])}</td></tr>" for m in feat.mismatch_samples)
        body.append(f'<section id="mismatches"><h2>Re-tokenization mismatches</h2>'
                    f'<p class="note">{count(feat.mismatches)} in all; the first '
                    f"{len(feat.mismatch_samples)}:</p><table><tr><th>host</th><th>id</th>"
                    f"<th>turn</th><th>supervised</th><th>server's count</th><th>kept?</th></tr>"
                    f"{rows}</table></section>")
    if data.records is not None:
        body.append(answers_browser(answers, data.records.answers + data.records.failures,
                                    sample_size))
    elif data.live and data.kind != "extractor":
        body.append('<p class="note">The answers browser and the distributions come from the '
                    "records: `fab fetch` then `fab report` when you want them.</p>")
    return document(f"handoff report: {what} {data.job}", sub, "".join(body), s, live_every)


def run_page(jobs: list[tuple[JobData, dict[str, Any]]], s: dict[str, Any], plots: list[Plot],
             missing: list[str], *, live_every: float | None, links: dict[str, str]) -> str:
    head = ["job", "kind", "hosts", "state", "samples", "failed", "cut", "cost", "p50 latency",
            "wall time"]
    rows = []
    for data, js in jobs:
        states = sorted(set((js.get("states") or {}).values()))
        link = links.get(data.job)
        name = f'<a href="{e(link)}">{e(data.job)}</a>' if link else e(data.job)
        lat = js.get("latency_s") or {}
        rows.append("<tr>" + "".join(f"<td>{x}</td>" for x in [
            name, e(data.kind), e(", ".join(data.hosts)),
            " ".join(f'<span class="state-{e(st)}">{e(st)}</span>' for st in states),
            count(js.get("samples")), count(js.get("failed")), count(js.get("cut")),
            money(js.get("cost_usd")), seconds(lat.get("p50")), e(units.duration(js.get("wall_s")))])
            + "</tr>")
    table = ("<table class=\"jobs\"><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
             + "".join(rows) + "</table>")
    sub = (f"{len(jobs)} job(s) on {len(s.get('hosts') or [])} host(s) · "
           + ("live from the hosts, refreshed every " + format(live_every, "g") + " s"
              if live_every else "built from the fetched files") + f" · {when(time.time())}")
    body = ['<section id="summary"><h2>Summary</h2>', cards({**s, "kind": "generator"}),
            "</section>", '<section id="jobs"><h2>Jobs</h2>', table, "</section>",
            '<section id="plots"><h2>Plots</h2>', figures(plots, missing), "</section>"]
    return document("handoff report: the run", sub, "".join(body), s, live_every)
