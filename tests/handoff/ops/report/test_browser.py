"""The report in a real headless Chromium (tests/support/browser.py): a 3-host run's pages
load with no console error and no request besides the file itself, the figures shown equal
those computed here from output.jsonl, the plots are drawn, the answers browser filters, the
run's page links to the job's. One browser for the module; screenshots in the test's folder."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import pytest

from handoff.ops.report import build, page
from handoff.testing.fakerun import FakeRun
from tests.support.browser import CHROMIUM, Chromium

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: scripts/bootstrap "
                                "installs Debian's package")

SHOWN = ("Object.fromEntries(Array.from(document.querySelectorAll('[data-k]')).map("
         "e => [e.dataset.k, e.firstChild.textContent.trim()]))")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    with Chromium(tmp_path_factory.mktemp("chromium")) as b:
        yield b


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("run")
    FakeRun(samples=1500, failure_share=0.03, max_tokens=7000, time_scale=0.2).write(dest)
    build.build(dest)
    return dest


def loaded(browser: Chromium, path: Path) -> None:
    browser.errors.clear()
    browser.open(path.as_uri())
    assert browser.errors == []
    # nothing fetched: the document itself, and the rasterized scatter inline as data:
    assert [u for u in browser.requests if not u.startswith("data:")] == [path.as_uri()]


def test_the_job_page_shows_the_records_figures(browser: Chromium, run: Path, tmp_path: Path) -> None:
    report = run / "prompts" / "report.html"
    loaded(browser, report)
    browser.screenshot(tmp_path / "job.png")
    out = [json.loads(x) for x in (run / "prompts" / "output.jsonl").read_text().splitlines()]
    failed = len((run / "prompts" / "output.errors.jsonl").read_text().splitlines())
    q = statistics.quantiles([r["latency_s"] for r in out], n=100, method="inclusive")
    cost = sum(r["usage"]["cost"] for r in out)
    shown = browser.evaluate(SHOWN)
    assert shown["samples"] == f"{len(out):,}" and shown["failed"] == f"{failed:,}"
    assert shown["cut"] == f"{sum(r['finish_reason'] == 'length' for r in out):,}"
    assert shown["cost_usd"] == page.money(cost)
    assert shown["completion_tokens"] == f"{sum(r['usage']['completion_tokens'] for r in out):,}"
    assert (shown["latency_p50"], shown["latency_p90"], shown["latency_p99"]) == (
        f"{q[49]:.2f} s", f"{q[89]:.2f} s", f"{q[98]:.2f} s")
    figures = browser.evaluate("JSON.parse(document.getElementById('handoff-summary').textContent)")
    assert figures["samples"] == len(out) and abs(figures["cost_usd"] - cost) < 1e-6
    # every figure drawn, with a size on the page
    drawn = browser.evaluate("Array.from(document.querySelectorAll('figure svg.plot')).filter("
                             "s => s.getBoundingClientRect().height > 100).length")
    assert drawn == 7


def test_the_answers_browser_filters(browser: Chromium, run: Path) -> None:
    loaded(browser, run / "prompts" / "report.html")
    total = browser.evaluate("document.querySelectorAll('details.answer').length")
    cut = browser.evaluate("document.querySelectorAll('details.answer[data-finish=length]').length")
    assert total > cut > 0
    visible = ("Array.from(document.querySelectorAll('details.answer')).filter(e => !e.hidden)"
               ".length")
    browser.evaluate("(() => { const s = document.querySelector('select[data-f=finish]');"
                     " s.value = 'length'; s.dispatchEvent(new Event('change')); })()")
    assert browser.evaluate(visible) == cut
    assert browser.evaluate("document.getElementById('answers-shown').textContent") == str(cut)
    host = browser.evaluate("document.querySelector('details.answer[data-finish=length]')"
                            ".dataset.host")
    browser.evaluate(f"(() => {{ const s = document.querySelector('select[data-f=host]');"
                     f" s.value = {json.dumps(host)}; s.dispatchEvent(new Event('change')); }})()")
    assert 0 < browser.evaluate(visible) <= cut
    assert browser.errors == []
    # the filters are kept across a reload (the live page reloads itself)
    browser.open((run / "prompts" / "report.html").as_uri())
    assert 0 < browser.evaluate(visible) <= cut
    browser.evaluate("sessionStorage.clear()")


def test_the_run_page_links_each_job(browser: Chromium, run: Path, tmp_path: Path) -> None:
    loaded(browser, run / "report.html")
    browser.screenshot(tmp_path / "run.png", full_page=True)
    assert browser.evaluate("JSON.parse(document.getElementById('handoff-summary')"
                            ".textContent).jobs") == ["prompts"]
    href = browser.evaluate("document.querySelector('table.jobs a').href")
    assert href == (run / "prompts" / "report.html").as_uri()


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("HANDOFF_SLOW_TESTS"),
                    reason="a 600 MB made-up run, ~1 min on 2 cores: set HANDOFF_SLOW_TESTS=1 "
                           "(benchmarks/run_report.py checks the same and times it)")
def test_a_40k_answer_run(browser: Chromium, tmp_path: Path) -> None:
    """The benchmark's run (40k thinking-size answers over 3 hosts): built in seconds, its
    page loads with no error and shows the records' figures."""
    FakeRun(samples=40_000, concurrency=2000).write(tmp_path)
    t = time.monotonic()
    build.build(tmp_path)
    assert time.monotonic() - t < 60
    report = tmp_path / "prompts" / "report.html"
    loaded(browser, report)
    out = [json.loads(x) for x in (tmp_path / "prompts" / "output.jsonl").open("rb")]
    q = statistics.quantiles([r["latency_s"] for r in out], n=100, method="inclusive")
    got = browser.evaluate("JSON.parse(document.getElementById('handoff-summary').textContent)")
    assert got["samples"] == len(out) and abs(got["cost_usd"] - sum(r["usage"]["cost"] for r in out)) < 1e-6
    assert abs(got["latency_s"]["p50"] - q[49]) < 1e-3 and abs(got["latency_s"]["p99"] - q[98]) < 1e-3
    browser.screenshot(tmp_path / "job-40k.png")

