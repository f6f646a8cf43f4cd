"""Sampling from fab (issue 20), over real sshd and the project's fake OpenRouter:
`fab launch --temperature 1 --top-p 0.95 --reasoning '{"effort":"high"}'` reaches the
payload's argv (every request it sends carries them), the dry run's plan shows them, each
host's job.json records them; `fab status` breaks the answers down by provider and finish
reason, also in `--json`."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.conftest import explain, remote_dir


def test_launch_sampling_reaches_the_payload_and_job_json(make_sandbox, fab, tmp_path: Path) -> None:
    sbx = make_sandbox(hosts=2)
    sbx.api.record_bodies = True  # the fake keeps every request body it is sent
    data = tmp_path / "S1.jsonl"
    with data.open("w") as fh:
        for i in range(12):
            fh.write(json.dumps({"id": i, "messages": [{"role": "user", "content": f"q {i}"}]}) + "\n")
    assert fab.on(sbx, "deploy").rc == 0
    flags = ("--temperature", "1", "--top-p", "0.95", "--reasoning", '{"effort":"high"}')

    r = fab.on(sbx, "launch", "--input", str(data), *flags, "--dry-run")
    assert r.rc == 0, explain(r)
    text = " ".join(r.text.split())
    assert "--temperature 1.0 --top-p 0.95" in text and """--reasoning '{"effort":"high"}'""" in text
    assert 'sampling: temperature 1.0, top_p 0.95, reasoning {"effort":"high"}' in text
    assert not sbx.api.stats.bodies  # a dry run sends nothing

    r = fab.on(sbx, "launch", "--input", str(data), *flags)
    assert r.rc == 0, explain(r)
    r = fab.on(sbx, "status", "--wait", "--json", "--interval", "0.5", timeout=180)
    assert r.rc == 0, explain(r)
    got = [json.loads(line) for line in r.out.splitlines() if line.startswith("{")]
    assert sum(g["done"] for g in got) == 12
    assert sum(g["by_provider"]["DeepInfra"] for g in got) == 12
    assert sum(g["by_finish_reason"]["stop"] for g in got) == 12 and all(g["cut"] == 0 for g in got)

    bodies = sbx.api.stats.bodies
    assert len(bodies) == 12
    for body in bodies:  # what the payload was given, as it sent it
        assert (body["temperature"], body["top_p"], body["reasoning"]) == (1.0, 0.95, {"effort": "high"})
        assert "seed" not in body
    for c in sbx.containers:
        meta = json.loads((remote_dir(c) / "jobs" / "S1" / "job.json").read_text())
        assert meta["sampling"] == {"temperature": 1.0, "top_p": 0.95, "seed": None,
                                    "reasoning": {"effort": "high"}, "provider": None,
                                    "turns": None, "max_timeouts": None, "token_ids": None,
                                    "mode": None, "stream": None, "idle_timeout": None,
                                    "first_token_timeout": None, "request_timeout": None}

    r = fab.on(sbx, "status")
    assert r.rc == 0, explain(r)
    assert "S1 (2 hosts) answers: by provider DeepInfra 12; by finish reason stop 12" in \
        " ".join(r.text.split())

    bad = fab.on(sbx, "launch", "--input", str(data), "--job", "S2", "--top-p", "2")
    assert bad.rc == 2 and "--top-p: expected a number from 0 to 1, got '2'" in bad.text
