"""The endpoint filter the preflight applies to the endpoint list."""

from __future__ import annotations

import pytest

from payload.generate.preflight import endpoint_allowed

pytestmark = pytest.mark.timeout(30)


def test_endpoint_filter():
    ep = {"provider_name": "Fireworks", "tag": "fireworks/int4", "quantization": "int4"}
    assert endpoint_allowed(ep, {"quantizations": ["int4"]})
    assert not endpoint_allowed(ep, {"quantizations": ["fp8"]})
    assert not endpoint_allowed(ep, {"ignore": ["fireworks"]})
    assert not endpoint_allowed(ep, {"only": ["deepinfra"]})
    assert endpoint_allowed(ep, {"order": ["deepinfra"]})  # order alone still falls back
    assert not endpoint_allowed(ep, {"order": ["deepinfra"], "allow_fallbacks": False})
    assert endpoint_allowed(ep, None)
