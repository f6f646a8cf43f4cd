"""The fake OpenRouter's key-management API (handoff.testing.fakekeys) against OpenRouter's
published schema (paths `/keys`, `/keys/{hash}`, `/key`, vendored next to this file), and
the per-key accounting the minted-key tests rely on: who served each chat request, a
child key's limit (402, `limit_source`), expiry and revocation (401)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from handoff.testing.fakekeys import KEY_LIMIT_SOURCE, ROOT, MgmtFault
from tests.support.workstation import KeyedAPI

jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

SPEC = Path(__file__).with_name("openrouter-keys-schema.yaml")


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    with SPEC.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def response_schema(spec: dict[str, Any], path: str, method: str, status: int) -> Any:
    op = spec["paths"][path][method]
    schema = op["responses"][str(status)]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator({**schema, "components": spec["components"]})


def request_schema(spec: dict[str, Any], path: str, method: str) -> Any:
    schema = spec["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator(schema)


def call(api: KeyedAPI, method: str, path: str, body: Any = None,
         token: str | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token != "":
        headers["Authorization"] = f"Bearer {token or api.management_key}"
    req = urllib.request.Request(api.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat(api: KeyedAPI, key: str) -> tuple[int, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return call(api, "POST", "/chat/completions", body, token=key)


def valid(validator: Any, body: Any) -> list[str]:
    return [e.message for e in validator.iter_errors(body)]


def test_management_api_answers_in_the_spec_shapes(keyed_api: KeyedAPI, spec: dict[str, Any]) -> None:
    create = {"name": "handoff sbx-1 generator", "limit": 2.5, "expires_at": "2099-01-01T00:00:00Z"}
    assert valid(request_schema(spec, "/keys", "post"), create) == []
    status, made = call(keyed_api, "POST", "/keys", create)
    assert status == 201 and valid(response_schema(spec, "/keys", "post", 201), made) == []
    key, key_hash = made["key"], made["data"]["hash"]
    assert made["data"]["limit"] == 2.5 and made["data"]["expires_at"] == "2099-01-01T00:00:00Z"
    assert key not in json.dumps(made["data"])  # the key only in `key`, once

    status, got = call(keyed_api, "GET", f"/keys/{key_hash}")
    assert status == 200 and valid(response_schema(spec, "/keys/{hash}", "get", 200), got) == []
    status, listed = call(keyed_api, "GET", "/keys?offset=0")
    assert status == 200 and valid(response_schema(spec, "/keys", "get", 200), listed) == []
    assert [k["hash"] for k in listed["data"]] == [key_hash]
    patch = {"limit": 1.0}
    assert valid(request_schema(spec, "/keys/{hash}", "patch"), patch) == []
    status, patched = call(keyed_api, "PATCH", f"/keys/{key_hash}", patch)
    assert status == 200 and valid(response_schema(spec, "/keys/{hash}", "patch", 200), patched) == []
    assert patched["data"]["limit"] == 1.0 and patched["data"]["limit_remaining"] == 1.0
    status, deleted = call(keyed_api, "DELETE", f"/keys/{key_hash}")
    assert status == 200 and deleted == {"deleted": True}
    assert valid(response_schema(spec, "/keys/{hash}", "delete", 200), deleted) == []
    status, missing = call(keyed_api, "GET", f"/keys/{key_hash}")
    assert status == 404 and valid(response_schema(spec, "/keys/{hash}", "get", 404), missing) == []
    assert call(keyed_api, "DELETE", f"/keys/{key_hash}")[0] == 404


def test_only_a_management_key_may_manage_keys(keyed_api: KeyedAPI, spec: dict[str, Any]) -> None:
    _, made = call(keyed_api, "POST", "/keys", {"name": "x", "limit": 1})
    for token, status in (("", 401), ("sk-or-v1-nobody", 401), (keyed_api.api_key, 403),
                          (made["key"], 403)):
        got, body = call(keyed_api, "GET", "/keys", token=token)
        assert got == status, token
        assert valid(response_schema(spec, "/keys", "get", 401), body) == [] or status == 403
    assert call(keyed_api, "POST", "/keys", {"name": "y"}, token=keyed_api.api_key)[0] == 403


@pytest.mark.parametrize("expires", ["2099-01-01T02:00:00+02:00", "2099-01-01T00:00:00",
                                     "2000-01-01T00:00:00Z", "tomorrow"])
def test_expires_at_must_be_a_future_utc_time(keyed_api: KeyedAPI, expires: str) -> None:
    status, body = call(keyed_api, "POST", "/keys", {"name": "x", "expires_at": expires})
    assert status == 400 and "expires_at" in body["error"]["message"]
    assert keyed_api.keys.keys == {}


def test_each_key_is_accounted_and_its_limit_and_life_enforced(keyed_api: KeyedAPI) -> None:
    cost = keyed_api.fake.cost_per_request
    _, made = call(keyed_api, "POST", "/keys", {"name": "c", "limit": cost * 2.5})
    child, child_hash = made["key"], made["data"]["hash"]
    assert chat(keyed_api, child)[0] == 200 and chat(keyed_api, child)[0] == 200
    status, refused = chat(keyed_api, child)  # a third would pass the limit
    assert status == 402 and refused["error"]["metadata"]["limit_source"] == KEY_LIMIT_SOURCE
    assert chat(keyed_api, keyed_api.api_key)[0] == 200  # the account's own key is not capped
    assert keyed_api.keys.served_by == {child_hash: 3, ROOT: 1}
    status, me = call(keyed_api, "GET", "/key", token=child)
    assert status == 200 and me["data"]["limit"] == pytest.approx(cost * 2.5)
    assert me["data"]["usage"] == pytest.approx(cost * 2)
    assert call(keyed_api, "GET", f"/keys/{child_hash}")[1]["data"]["usage"] == pytest.approx(cost * 2)

    keyed_api.keys.expire(child_hash)
    status, body = chat(keyed_api, child)
    assert status == 401 and "expired" in body["error"]["message"]
    call(keyed_api, "DELETE", f"/keys/{child_hash}")
    status, body = chat(keyed_api, child)
    assert status == 401 and "revoked" in body["error"]["message"]
    assert call(keyed_api, "GET", "/key", token=child)[0] == 401


def test_faults_fail_management_calls_on_a_schedule(keyed_api: KeyedAPI) -> None:
    keyed_api.keys.inject(MgmtFault("create", 500, skip=1))
    assert call(keyed_api, "POST", "/keys", {"name": "first"})[0] == 201
    assert call(keyed_api, "POST", "/keys", {"name": "second"})[0] == 500
    assert call(keyed_api, "POST", "/keys", {"name": "third"})[0] == 201
    # The answer lost, the key made: what a client must clean up by name.
    keyed_api.keys.inject(MgmtFault("create", 502, after_effect=True))
    assert call(keyed_api, "POST", "/keys", {"name": "lost"})[0] == 502
    assert sorted(k.name for k in keyed_api.keys.keys.values()) == ["first", "lost", "third"]
    with pytest.raises(ValueError):
        keyed_api.keys.inject(MgmtFault("rotate"))


def test_a_fault_aimed_at_one_key_name_spares_the_others(keyed_api: KeyedAPI) -> None:
    keyed_api.keys.inject(MgmtFault("create", 502, after_effect=True, subject="host-b"))
    assert call(keyed_api, "POST", "/keys", {"name": "handoff host-a"})[0] == 201
    assert call(keyed_api, "POST", "/keys", {"name": "handoff host-b"})[0] == 502
    assert call(keyed_api, "POST", "/keys", {"name": "handoff host-c"})[0] == 201
    assert len(keyed_api.keys.keys) == 3  # host-b's key was made, only its answer lost
    # Authentication still comes first, even for a body that is not JSON.
    assert call(keyed_api, "POST", "/keys", None, token="wrong")[0] == 401
