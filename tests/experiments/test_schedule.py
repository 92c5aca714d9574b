"""Warmup + cosine learning-rate schedule."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc import PosEncError
from posenc.experiments.schedule import warmup_cosine


@pytest.mark.parametrize(("steps", "warmup"), [(10, 0), (10, 3), (7, 7), (1, 0), (2, 1)])
def test_schedule_matches_the_formula(steps: int, warmup: int) -> None:
    peak, floor = 2e-3, 0.1
    got = [
        warmup_cosine(i, steps=steps, peak=peak, warmup=warmup, min_ratio=floor)
        for i in range(steps)
    ]
    want = []
    for i in range(steps):
        if i < warmup:
            want.append(peak * (i + 1) / warmup)
        else:
            t = (i - warmup) / max(1, steps - warmup - 1)
            want.append(peak * floor + peak * (1 - floor) * (1 + math.cos(math.pi * t)) / 2)
    assert got == pytest.approx(want, rel=1e-12)


@given(steps=st.integers(2, 500), warmup=st.integers(0, 50))
def test_schedule_rises_then_falls_to_the_floor(steps: int, warmup: int) -> None:
    lrs = [warmup_cosine(i, steps=steps, peak=1.0, warmup=warmup) for i in range(steps)]
    top = min(warmup, steps)
    rising, falling = lrs[:top], lrs[max(top - 1, 0) :]
    assert all(a < b for a, b in itertools.pairwise(rising))
    assert all(a >= b for a, b in itertools.pairwise(falling))
    if warmup < steps:
        assert lrs[-1] == pytest.approx(0.1) if steps - warmup > 1 else lrs[-1] == 1.0
    assert max(lrs) <= 1.0


def test_bad_inputs() -> None:
    with pytest.raises(PosEncError, match="steps must be >= 1, got 0"):
        warmup_cosine(0, steps=0, peak=1.0, warmup=0)
    with pytest.raises(PosEncError, match="step must be <= 4, got 5"):
        warmup_cosine(5, steps=5, peak=1.0, warmup=0)
    with pytest.raises(PosEncError, match=r"min_ratio must be <= 1\.0, got 2\.0"):
        warmup_cosine(0, steps=5, peak=1.0, warmup=0, min_ratio=2.0)
    with pytest.raises(PosEncError, match="peak must be a number, got 'x'"):
        warmup_cosine(0, steps=5, peak="x", warmup=0)
