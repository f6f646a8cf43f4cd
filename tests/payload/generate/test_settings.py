"""Rules of single flags: `--max-failed`, which routing object goes where."""

from __future__ import annotations

import pytest

from payload.generate.settings import MaxFailed, parse_max_failed, provider_for

pytestmark = pytest.mark.timeout(30)


def test_max_failed_and_provider_rules():
    assert parse_max_failed("2%") == MaxFailed(fraction=0.02)
    assert parse_max_failed("50").allowed(10) == 50
    assert parse_max_failed("1%").allowed(20000) == 200
    assert parse_max_failed("1%").allowed(30) == 0
    with pytest.raises(ValueError):
        parse_max_failed("-1")
    routing = {"only": ["x"]}
    assert provider_for("https://openrouter.ai/api/v1", routing, explicit=False) == routing
    assert provider_for("https://eu.openrouter.ai/api/v1", routing, explicit=False) == routing
    assert provider_for("https://api.openai.com/v1", routing, explicit=False) is None
    assert provider_for("http://127.0.0.1:9/v1", routing, explicit=True) == routing
    assert provider_for("https://openrouter.ai/api/v1", None, explicit=True) is None
