"""`python -m payload smoke`: one request, the facts an engineer checks, honest exit codes."""

from __future__ import annotations

import pytest

from handoff.testing.fakeapi import FaultPlan
from tests.payload.helpers import run_payload

pytestmark = pytest.mark.timeout(60)


def smoke(fake, key_file):
    return run_payload("smoke", "--base-url", fake.base_url, "--api-key-file", str(key_file))


def test_smoke_prints_provider_latency_tokens_cost_and_key_credit(fake_factory, key_file):
    fake = fake_factory(cost_per_request=0.002, credit_limit=10.0)
    proc = smoke(fake, key_file)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "model:     moonshotai/kimi-k2.5" in out
    assert "served by: DeepInfra" in out
    assert "latency:" in out and "tokens:    prompt" in out
    assert "cost:      $0.002000" in out
    assert "limit $10.000000, left $9.998000" in out
    assert fake.stats.requests == 1 and fake.stats.key_calls == 1


@pytest.mark.parametrize(("fault", "code", "text"), [
    ("401", 3, "API key was refused"),
    ("402", 3, "out of credit or key limit"),
    ("empty", 1, "empty_content"),
    ("length_empty", 1, "finish_reason 'length'"),
    ("500", 1, "server_error"),
])
def test_smoke_exit_codes_name_the_cause(fake_factory, key_file, fault, code, text):
    fake = fake_factory(faults=FaultPlan(schedule={1: fault}))
    proc = smoke(fake, key_file)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert text in proc.stderr
    assert fake.stats.requests == 1  # one request, never a retry loop


def test_smoke_with_a_refused_key(fake_factory, key_file):
    fake = fake_factory(api_key="sk-or-v1-" + "2" * 64)
    proc = smoke(fake, key_file)
    assert proc.returncode == 3
    assert "API key was refused" in proc.stderr
    assert "GET /key answered 401" in proc.stdout
