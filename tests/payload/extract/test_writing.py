"""The NaN/Inf check of payload.extract.writing.finite_rows: exactly the samples with a
non-finite value on a real token fail, whatever the dtype and however large the values,
also when stored as FP8 (checked on the scales) or cast to float16 (where bf16 overflows)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from payload.extract.feature_dtype import Stored, store  # noqa: E402
from payload.extract.writing import finite_rows  # noqa: E402


class Errors:
    def __init__(self) -> None:
        self.added: list[Any] = []

    def add(self, *args: Any) -> None:
        self.added.append(args)


def check(aux: Any, final: Any, mask: Any, feature_dtype: str | None = None,
          ) -> tuple[list[bool], int]:
    run = SimpleNamespace(stats=SimpleNamespace(failed_nonfinite=0), errors=Errors(),
                          lock=threading.Lock())
    samples = [SimpleNamespace(id=i, key=str(i)) for i in range(aux.shape[0])]
    batch = SimpleNamespace(attention_mask=mask, samples=samples)
    stored = Stored(aux, final) if feature_dtype is None else store(aux, final, feature_dtype)
    ok = finite_rows(run, SimpleNamespace(update=lambda **_: None), batch, stored)
    assert len(run.errors.added) == run.stats.failed_nonfinite == ok.count(False)
    return ok, run.stats.failed_nonfinite


@pytest.mark.parametrize("feature_dtype", [None, "float8_e4m3fn"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_exactly_the_samples_with_a_non_finite_real_token_fail(dtype: str,
                                                               feature_dtype: str | None) -> None:
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
    ok, failed = check(aux, final, mask, feature_dtype)
    assert ok == [True, False, False, False, False, True] and failed == 4


def test_a_float16_cast_that_overflows_fails_the_sample() -> None:
    """bf16 states beyond float16's range are finite in the model and Inf once stored as
    --feature-dtype fp16: the stored values are what is checked."""
    aux = torch.ones(2, 3, 12, dtype=torch.bfloat16)
    final = torch.ones(2, 3, 4, dtype=torch.bfloat16)
    final[1, 2, 0] = 70000.0  # finite in bfloat16, above float16's 65504
    mask = torch.ones(2, 3, dtype=torch.long)
    assert check(aux, final, mask)[0] == [True, True]
    assert check(aux, final, mask, "float16")[0] == [True, False]
