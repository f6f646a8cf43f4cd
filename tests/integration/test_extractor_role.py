"""The extractor role through `.venv/bin/fab` against real sshd containers on loopback.

The containers' python has aiohttp and no torch, like a CPU box that is not ready to
extract: verify must say exactly what is missing and how to fix it, and the disk
preflight must say what it waits for (the payload, the input, the role's modules).
(The preflight actually running is covered by tests/handoff/ops/test_verify_extractor.py, which
runs the real probe and payload locally, where torch is installed.)
Launch must push the input, give host i of n `--shard i/n`, and report the torchrun
command's instant failure with its log.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from tests.integration.conftest import explain, remote_dir, wipe_remote_state


def extractor_inventory(sbx, tmp_path: Path, **extra) -> Path:
    """The sandbox's inventory with the extractor role and its vars on every host."""
    data = sbx.inventory_data()
    for host in data["hosts"].values():
        host["roles"] = ["extractor"]
        host["vars"].update({"gpus": 2, "model_dir": "/nonexistent/kimi"}, **extra)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_verify_names_every_missing_piece_with_its_fix(sandbox, fab) -> None:
    host = sandbox.containers[0].name
    r = fab("verify", "--role", "extractor", "--host", host)
    text = r.out + r.err
    assert r.rc != 0, explain(r)
    for line in ("module torch", "module transformers", "module safetensors"):
        assert any(line in row and "missing" in row for row in text.splitlines()), (line, explain(r))
    assert "pip install torch --index-url" in text, explain(r)  # the CUDA-matched wheel, by hand
    assert "CUDA via torch" in text and "not checked: torch is missing" in text, explain(r)
    assert "no nvidia-smi" in text, explain(r)
    assert "var model_dir unset" in text, explain(r)  # the sandbox inventory names no model
    assert "Traceback" not in text, explain(r)


def test_preflight_waits_for_payload_and_input_then_launch_shards(sandbox, fab, tmp_path) -> None:
    hosts = sandbox.containers[:2]
    names = ",".join(c.name for c in hosts)
    for c in hosts:
        wipe_remote_state(c)
    inv = extractor_inventory(sandbox, tmp_path, input="~/.handoff/data/gen.jsonl")
    env = {"HANDOFF_INVENTORY": str(inv)}

    # Nothing on the hosts yet: the disk check is skipped (not failed) and says what to do.
    r = fab.on(sandbox, "verify", "--host", hosts[0].name, env=env)
    assert r.rc != 0, explain(r)  # torch & co. are still missing
    assert "skipped" in r.out and "fab push-script" in r.out, explain(r)
    assert "fab launch --role extractor --input" in r.out, explain(r)

    r = fab.on(sandbox, "push-script", "--host", names, env=env)
    assert r.rc == 0, explain(r)

    # Launch pushes the generator's output and shards it: it dies at once (no torch here),
    # and says so with the log's tail; job.json records what each host was given.
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"id": i, "messages": [{"role": "user", "content": f"q{i}"}],
                                       "response": f"a{i}"}) + "\n" for i in range(4)))
    r = fab.on(sandbox, "launch", "--host", names, "--input", str(gen), env=env)
    assert r.rc != 0, explain(r)
    assert "exited right after start" in r.out + r.err and "torch" in r.out + r.err, explain(r)
    # An extractor's own estimate (issue 32 #9): samples and tokens, nothing of an API.
    said = " ".join(r.out.split())
    assert "over 2 host(s), extractor (features of the target model; no API, no dollars)" in said
    assert "requests in flight" not in said and "prices" not in said and "budget" not in said
    assert "│ extractor │ 4 " in r.out and "hidden size" in said, explain(r)
    # Its status: tokens/s, GB written, mismatches; no dollars, no key columns. (Each host's
    # status file as an extractor that got going writes it: a sharded job none of whose
    # shards wrote one is issue 32 #2's crash of the `all` row, fixed apart.)
    for c in hosts:
        status_file = remote_dir(c) / "jobs" / "extractor" / "status.json"
        status_file.write_text(json.dumps({
            "state": "aborted", "done": 1, "failed": 0, "total": 2, "tokens_per_s": 812.0,
            "rate_rps": 0.5, "cost": 0.0, "bytes_written": 1_250_000_000, "tokens_written": 64,
            "retokenized_mismatch": 1}))
        os.chmod(status_file, 0o644)  # root's file, readable by the container's user
    st = fab.on(sandbox, "status", "--host", names, "--job", "extractor", env=env)
    head = next((line for line in st.out.splitlines() if "done/fail/total" in line), "")
    assert "tok/s" in head and "GB written" in head and "mismatches" in head, explain(st)
    assert "$" not in st.out and "key" not in head, explain(st)
    row = next(line for line in st.out.splitlines() if line.startswith(f"│ {hosts[0].name} "))
    assert "│ 1/0/2 " in row and "│ 812 " in row and "│ 1.25 " in row and "│ 1 " in row, explain(st)
    records = [json.loads(line) for line in fab.on(sandbox, "status", "--host", names, "--job",
                                                    "extractor", "--json", env=env).out.splitlines()]
    assert [rec["role"] for rec in records] == ["extractor", "extractor"], records
    assert {"bytes_written", "retokenized_mismatch", "tokens_written"} <= set(records[0])
    for i, c in enumerate(hosts):
        jd = remote_dir(c) / "jobs" / "extractor"
        meta = json.loads((jd / "job.json").read_text())
        assert meta["role"] == "extractor" and meta["shard"] == f"{i}/2", meta
        assert meta["input"] == str(remote_dir(c) / "data" / "gen.jsonl"), meta
        assert (remote_dir(c) / "data" / "gen.jsonl").read_bytes() == gen.read_bytes()

    # Payload and input are there now: the preflight still waits for the role's modules
    # (it is the payload's own code) rather than failing with an import error.
    r = fab.on(sandbox, "verify", "--host", hosts[1].name, env=env)
    assert r.rc != 0, explain(r)
    row = next((line for line in r.out.splitlines() if "disk for the features" in line), "")
    assert "skipped" in row and "not run: needs torch" in row, explain(r)
    assert "No module named" not in r.out, explain(r)
    assert not (remote_dir(hosts[1]) / "jobs" / "extractor" / "features").exists()
