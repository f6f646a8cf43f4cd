"""Fixtures for payload tests: a fresh key, a 0600 key file, the fake OpenRouter in a thread."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from handoff.testing.fakeapi import FakeOpenRouter
from tests.payload.helpers import make_key, write_private


@pytest.fixture
def api_key() -> str:
    return make_key()


@pytest.fixture
def key_file(tmp_path: Path, api_key: str) -> Path:
    return write_private(tmp_path / "openrouter.key", api_key)


@pytest.fixture
def fake_factory(api_key: str) -> Iterator[Callable[..., FakeOpenRouter]]:
    started: list[FakeOpenRouter] = []

    def make(**kwargs: Any) -> FakeOpenRouter:
        kwargs.setdefault("api_key", api_key)
        fake = FakeOpenRouter(**kwargs)
        fake.start_in_thread()
        started.append(fake)
        return fake

    yield make
    for fake in started:
        fake.stop_thread()


