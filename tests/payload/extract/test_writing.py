"""The NaN/Inf check of payload.extract.writing.finite_rows: exactly the samples with a
non-finite value on a real token fail, whatever the dtype and however large the values."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from payload.extract.writing import finite_rows  # noqa: E402


class Errors:
    def __init__(self) -> None:
        self.added: list[Any] = []

    def add(self, *args: Any) -> None:
        self.added.append(args)


def check(aux: Any, final: Any, mask: Any) -> tuple[list[bool], int]:
    run = SimpleNamespace(stats=SimpleNamespace(failed_nonfinite=0), errors=Errors(),
                          lock=threading.Lock())
    samples = [SimpleNamespace(id=i, key=str(i)) for i in range(aux.shape[0])]
    batch = SimpleNamespace(attention_mask=mask, samples=samples)
    ok = finite_rows(run, SimpleNamespace(update=lambda **_: None), batch, aux, final)
    assert len(run.errors.added) == run.stats.failed_nonfinite == ok.count(False)
    return ok, run.stats.failed_nonfinite


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_exactly_the_samples_with_a_non_finite_real_token_fail(dtype: str) -> None:
    dt = getattr(torch, dtype)
    big = torch.finfo(dt).max
    b, t, h = 6, 5, 64
    # Every value at its dtype's largest: finite, though a row's sum overflows float32.
    aux = torch.full((b, t, 3 * h), big, dtype=dt)
    final = torch.ones(b, t, h, dtype=dt)
    mask = torch.ones(b, t, dtype=torch.long)
    aux[1, 2, 7] = float("inf")
    aux[2, 0, 3] = float("-inf")
    aux[3, 4, 1], aux[3, 4, 2] = float("inf"), float("-inf")  # a row whose infinities cancel
    final[4, 1, 0] = float("nan")
    mask[5, 3:] = 0
    aux[5, 3, 0] = final[5, 4, 9] = float("nan")  # padding: never stored, never checked
    ok, failed = check(aux, final, mask)
    assert ok == [True, False, False, False, False, True] and failed == 4
