"""The key never appears in anything the payload writes: stdout, stderr, records, status
(payload/redact.py, and every path that reports through it)."""

from __future__ import annotations

import pytest

from handoff.testing.fakeapi import FaultPlan
from tests.payload.helpers import (
    gen_args,
    run_payload,
    write_prompts,
)

pytestmark = pytest.mark.timeout(120)


def test_key_never_appears_in_any_output(fake_factory, key_file, tmp_path, api_key):
    """The fake echoes the key in its error texts (as some proxies do); the payload must
    redact it everywhere it writes."""
    fake = fake_factory(echo_key_in_errors=True,
                        faults=FaultPlan(schedule={1: "400", 2: "500", 3: "429", 4: "402"}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_prompts(inp, 20)
    proc = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "1"))
    assert proc.returncode == 3  # the scheduled 402
    again = run_payload(*gen_args(fake, key_file, inp, out, "--concurrency", "1"))
    assert again.returncode == 0
    fake.api_key = "sk-or-v1-" + "1" * 64
    refused = run_payload(*gen_args(fake, key_file, inp, tmp_path / "o2.jsonl"))
    smoke = run_payload("smoke", "--base-url", fake.base_url, "--api-key-file", str(key_file))
    texts = [proc.stdout, proc.stderr, again.stdout, again.stderr, refused.stdout,
             refused.stderr, smoke.stdout, smoke.stderr]
    texts += [p.read_text() for p in tmp_path.iterdir() if p.suffix == ".json"
              or p.name.endswith(".jsonl")]
    assert any("(request had Authorization: Bearer sk-or-v1-****)" in t for t in texts)
    assert all(api_key not in t for t in texts)
    assert all(api_key[9:25] not in t for t in texts)
