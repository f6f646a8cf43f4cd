"""The run is the unit (issue 32, part B), over real sshd and the fake OpenRouter:

- a fetch with a host down never makes the merged output smaller: the host's last fetched
  copy stands in (said, with when), a copy lost here is covered by the last merge, and the
  fetch exits 1 naming the host (#3);
- a job's budget is its own: two jobs on one host with a management key, one without a
  budget runs to its end, the other stops at its own budget; each budgeted job runs on a
  child key of its own, minted at launch and revoked by forget and cleanup (#1); a launch
  on a job key with nothing left is refused before anything starts (#5);
- cleanup-secrets leaves a host where a job runs as it is unless --force (#7);
- a dead host's shard moves: a relaunch over fewer hosts is refused while a host it leaves
  runs; a take-over asks only what the dead host's last fetched copy lacks, and every id is
  asked exactly once at the fake across the whole run (#4).

Each test uses a private sandbox (they stop hosts and leave jobs behind).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.conftest import explain


def flat(result: Any) -> str:
    """Both streams with the table/line wrapping undone."""
    return " ".join(result.text.split())


def records(result: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """`status --json`: one object per host and job."""
    found = [json.loads(line) for line in result.out.splitlines() if line.startswith("{")]
    return {(r["host"], r["job"]): r for r in found}


def dataset(path: Path, n: int) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"{path.stem}-{i}", "messages": [
                {"role": "user", "content": f"question {i} of {path.stem}"}]}) + "\n")
    return path


def ids(path: Path) -> list[str]:
    return [str(json.loads(line)["id"]) for line in path.read_text().splitlines() if line.strip()]


def test_a_fetch_with_a_host_down_never_makes_the_merge_smaller(make_sandbox, fab,
                                                                tmp_path: Path) -> None:
    sbx = make_sandbox(hosts=3)
    data = dataset(tmp_path / "alpha.jsonl", 60)
    dest = tmp_path / "results"
    assert fab.on(sbx, "deploy").rc == 0
    r = fab.on(sbx, "launch", "--input", str(data))
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "status", "--wait", "--interval", "0.3", timeout=180)
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "fetch", "--dest", str(dest))
    assert r.rc == 0 and "complete: all 60 ids of the job" in flat(r), explain(r)
    merged = dest / "alpha" / "output.jsonl"
    whole = sorted(ids(merged))
    assert len(whole) == 60

    sbx.stop_container("sbx-3")
    r = fab.on(sbx, "fetch", "--dest", str(dest))
    text = flat(r)
    assert r.rc == 1, explain(r)
    assert "sbx-3" in text and "not fetched now (its fetch failed:" in text, explain(r)
    assert "its last fetched copy, from " in text and "(it had finished)" in text
    assert sorted(ids(merged)) == whole  # the host's last copy stands in: nothing lost

    # A copy lost here while its host is down, and only one host asked: the last merge's
    # answers stay, each id once.
    (dest / "sbx-3" / "alpha" / "output.jsonl").unlink()
    r = fab.on(sbx, "fetch", "--dest", str(dest), "--host", "sbx-1")
    assert r.rc == 0, explain(r)
    assert sorted(ids(merged)) == whole, explain(r)
    assert "answers kept from the last merge" in flat(r), explain(r)
    assert "sbx-2 not fetched now (not asked): its last fetched copy" in flat(r)
