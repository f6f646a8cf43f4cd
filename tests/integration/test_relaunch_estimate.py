"""A relaunch's estimate over real sshd and the project's fake OpenRouter (issue 22 #13:
"the estimate counts prompts already done on a relaunch"): a job stopped half-way over two
hosts is relaunched; the estimate before the hosts answer counts every prompt and says so,
and once the probes have read each shard's status the launch says how many are done and
what the rest costs and takes; the rest is then all that is asked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.conftest import explain, wait_until


def flat(result: Any) -> str:
    """Both streams with the table/line wrapping undone."""
    return " ".join(result.text.split())


def records(result: Any) -> dict[str, dict[str, Any]]:
    return {r["host"]: r for r in (json.loads(line) for line in result.out.splitlines()
                                   if line.startswith("{"))}


def test_a_half_done_relaunch_estimates_only_what_is_left(make_sandbox, fab, tmp_path: Path) -> None:
    # Answers take 0.3 s, one request at a time per host: 30 s per host's 100 prompts, long
    # enough that a loaded machine's slow `fab stop` still stops it part-way (with 40, CI at
    # load 8 saw the job finish before the stop).
    total = 200
    sbx = make_sandbox(hosts=2, api_latency_s=0.3)
    data = tmp_path / "H1.jsonl"
    data.write_text("".join(json.dumps({"id": f"h{i}", "prompt": f"question {i}"}) + "\n"
                            for i in range(total)))
    assert fab.on(sbx, "deploy").rc == 0
    smoke = fab.on(sbx, "smoke-test")  # the figures the estimate prices with
    assert smoke.rc == 0, explain(smoke)
    smoked = sbx.api.stats.successes
    first = fab.on(sbx, "launch", "--input", str(data), "--concurrency", "1", "--max-tokens", "64")
    assert first.rc == 0, explain(first)
    assert "estimate: 1 dataset(s) over 2 host(s)" in flat(first)
    assert "what is left is said once the hosts answer" in flat(first)
    assert "relaunched" not in flat(first), explain(first)  # a first launch: nothing done

    def status_of(host: str) -> dict[str, Any]:
        path = sbx.container(host).home / ".handoff" / "jobs" / "H1" / "status.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return {}

    assert wait_until(lambda: all((status_of(h).get("done") or 0) >= 2 for h in ("sbx-1", "sbx-2")),
                      60), [status_of(h) for h in ("sbx-1", "sbx-2")]
    stop = fab.on(sbx, "stop", "--timeout", "30")
    assert stop.rc == 0, explain(stop)
    halted = fab.on(sbx, "status", "--json")
    got = records(halted)
    assert {r["state"] for r in got.values()} == {"stopped"}, explain(halted)
    done = sum(r["done"] + r["failed"] for r in got.values())
    assert 4 <= done < total, got

    again = fab.on(sbx, "launch", "--input", str(data), "--concurrency", "16", "--max-tokens", "64")
    assert again.rc == 0, explain(again)
    text = flat(again)
    assert "estimate: 1 dataset(s) over 2 host(s)" in text  # every prompt, before the hosts answer
    assert (f"H1: relaunched: {done} of {total} prompts already done or failed on the hosts (not "
            f"asked again); what is left, {total - done} prompts: ~$") in text, explain(again)
    assert text.index("estimate: 1 dataset(s)") < text.index("H1: relaunched:")

    finished = fab.on(sbx, "status", "--wait", "--json", "--interval", "0.5", timeout=180)
    assert finished.rc == 0, explain(finished)
    end = records(finished)
    assert sum(r["done"] + r["failed"] for r in end.values()) == total
    # only the rest was asked again: each prompt answered once over both runs
    assert sbx.api.stats.successes - smoked == total, sbx.api.stats.successes - smoked
