"""``paired_verdict``, the one rule that orders two things measured in pairs (by seed in a
study, by document in ``posenc extend``): the mean, the 95 % t interval against hand-computed
values, the verdict, and what it refuses."""

from __future__ import annotations

import math
from typing import Any

import pytest

from posenc import PosEncError
from posenc.experiments.comparisons import paired_verdict as from_comparisons
from posenc.experiments.paired import paired_verdict

T2 = 4.302652729911275  # Student's t, 0.975 quantile, 2 degrees of freedom


def _expected(d: list[float]) -> tuple[float, list[float], str]:
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    half = T2 * sd / math.sqrt(len(d))
    low, high = mean - half, mean + half
    return mean, [low, high], "level" if low <= 0 <= high else "better" if high < 0 else "worse"


@pytest.mark.parametrize(
    ("differences", "verdict"),
    [
        ([-1.0, -0.9, -1.2], "better"),
        ([1.0, 0.9, 1.2], "worse"),
        ([-0.1, 0.1, -0.1], "level"),
        ([-0.21, -0.16, -0.04], "level"),  # lower on every pair, but the spread holds 0
    ],
)
def test_the_interval_and_the_verdict(differences: list[float], verdict: str) -> None:
    mean, interval, got = paired_verdict(differences)
    want_mean, want_interval, want_verdict = _expected(differences)
    assert (got, want_verdict) == (verdict, verdict)
    assert mean == pytest.approx(want_mean, rel=1e-12)
    assert interval == pytest.approx(want_interval, rel=1e-4)


def test_one_pair_is_level_with_no_interval() -> None:
    assert paired_verdict([-5.0]) == (-5.0, None, "level")


def test_equal_differences_have_a_zero_width_interval() -> None:
    assert paired_verdict((-2, -2, -2)) == (-2.0, [-2.0, -2.0], "better")


def test_comparisons_uses_the_same_rule() -> None:
    assert from_comparisons is paired_verdict


@pytest.mark.parametrize(
    "differences",
    [[], (), None, "0.1", [float("nan")], [1.0, float("inf")], [True, 1.0], ["1"], [1e151], {1.0}],
)
def test_what_is_not_differences_is_refused(differences: Any) -> None:
    with pytest.raises(PosEncError, match=r"^differences must be a non-empty list or tuple"):
        paired_verdict(differences)
