"""Request bodies the payload sends validate against OpenRouter's published OpenAPI schema
(`ChatRequest`; `ProviderPreferences` rejects unknown fields), and the fake answers in the
spec's shapes. The schemas are a trimmed copy vendored next to this file
(openrouter-schema.yaml, its header says where it comes from), so this runs on any clone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from handoff.testing.fakeapi import FaultPlan
from tests.payload.helpers import gen_args, run_payload, write_prompts

jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

SPEC = Path(__file__).with_name("openrouter-schema.yaml")
pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with SPEC.open(encoding="utf-8") as fh:
        return yaml.load(fh, Loader=loader)


def validator(spec: dict[str, Any], schema_name: str) -> Any:
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": spec["components"]}
    return jsonschema.Draft202012Validator(schema)


def test_request_bodies_validate_against_chat_request(spec, fake_factory, key_file, tmp_path):
    fake = fake_factory(record_bodies=True, faults=FaultPlan(schedule={2: "500"}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    with inp.open("w") as fh:  # ShareGPT too: converted to messages, trailing gpt turn dropped
        fh.write(json.dumps({"conversations": [{"from": "system", "value": "s"},
                                               {"from": "human", "value": "hi"},
                                               {"from": "gpt", "value": "old answer"}]}) + "\n")
    write_prompts(tmp_path / "more.jsonl", 3)
    with inp.open("a") as fh:
        fh.write((tmp_path / "more.jsonl").read_text())
    proc = run_payload(*gen_args(
        fake, key_file, inp, out, "--max-tokens", "256", "--temperature", "0.6", "--top-p",
        "0.95", "--seed", "7", "--reasoning", '{"effort": "high"}', "--provider",
        '{"quantizations": ["int4"], "ignore": ["fireworks", "baseten"], "sort": "throughput",'
        ' "allow_fallbacks": true}'))
    assert proc.returncode == 0, proc.stderr
    check = validator(spec, "ChatRequest")
    assert len(fake.stats.bodies) == 5
    for body in fake.stats.bodies:
        errors = list(check.iter_errors(body))
        assert not errors, [e.message for e in errors]
        assert body["provider"]["sort"] == "throughput"  # sent as given
        assert body["reasoning"] == {"effort": "high"}
        assert body["seed"] == 7
    # Requests go out concurrently: find the ShareGPT prompt by content, not by position.
    assert [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}] in [
        b["messages"] for b in fake.stats.bodies]


def test_default_provider_validates_and_unknown_fields_are_rejected(spec):
    from payload.defaults import PROVIDER as DEFAULT_PROVIDER
    from payload.generate.client import build_body
    check = validator(spec, "ChatRequest")
    body = build_body([{"role": "user", "content": "x"}], model="moonshotai/kimi-k2.5",
                      provider=DEFAULT_PROVIDER, max_tokens=None, temperature=None,
                      top_p=None, reasoning=None)
    assert not list(check.iter_errors(body))
    # The schema really is strict: the test would catch a misspelt routing field.
    body["provider"] = {**DEFAULT_PROVIDER, "quantisation": ["int4"]}
    assert list(check.iter_errors(body))


def test_fake_answers_in_the_spec_shapes(spec, fake_factory, key_file, tmp_path):
    import urllib.request
    fake = fake_factory()
    key = key_file.read_text()

    def get(path: str, body: dict[str, Any] | None = None) -> Any:
        req = urllib.request.Request(fake.base_url + path, headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            data=json.dumps(body).encode() if body else None)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    result = get("/chat/completions", {"model": "a/b", "messages": [
        {"role": "user", "content": "hello"}]})
    assert not list(validator(spec, "ChatResult").iter_errors(result))
    eps = get("/models/moonshotai/kimi-k2.5/endpoints")
    assert not list(validator(spec, "ListEndpointsResponse").iter_errors(eps["data"]))
    assert "limit_remaining" in get("/key")["data"]
