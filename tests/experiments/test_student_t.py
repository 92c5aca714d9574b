"""The t table of the 95 % intervals (posenc.experiments.student_t) against SciPy: every
``df`` it tabulates, then the expansion past it, whole arrays at the stated tolerance."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy import stats

from posenc import PosEncError
from posenc.experiments.student_t import MAX_DF, T_975, t_quantile

#: Past the table: every df to 10^5, then a geometric sweep to MAX_DF.
BEYOND = np.unique(
    np.concatenate(
        [np.arange(101, 100_001), np.geomspace(1e5, MAX_DF, 200).round().astype(np.int64)]
    )
)


def test_the_table_is_scipys_for_every_df_it_holds() -> None:
    df = np.arange(1, len(T_975) + 1)
    ours = np.array([t_quantile(0.975, int(d)) for d in df])
    assert len(T_975) == 100
    np.testing.assert_allclose(ours, stats.t.ppf(0.975, df), rtol=1e-14, atol=0)


@pytest.mark.parametrize(
    ("low", "high"), [(101, 300), (300, 100_001), (100_001, MAX_DF + 1)], ids=str
)
def test_the_expansion_past_the_table_is_within_1e_12_of_scipy(low: int, high: int) -> None:
    df = BEYOND[(BEYOND >= low) & (BEYOND < high)]
    ours = np.array([t_quantile(0.975, int(d)) for d in df])
    np.testing.assert_allclose(ours, stats.t.ppf(0.975, df), rtol=0, atol=1e-12)


def test_the_quantile_falls_to_the_normal_one() -> None:
    df = [100, 101, 102, 1000, 10**6, MAX_DF]
    ours = np.array([t_quantile(0.975, d) for d in df])
    assert np.all(np.diff(ours) < 0)
    assert ours[-1] == pytest.approx(stats.norm.ppf(0.975), abs=1e-14)


@pytest.mark.parametrize(
    ("p", "df", "name"),
    [
        (0.95, 3, "p"),
        (0.5, 3, "p"),
        (0.9750001, 3, "p"),
        (float("nan"), 3, "p"),
        ("0.975", 3, "p"),
        (True, 3, "p"),
        (0.975, 0, "df"),
        (0.975, MAX_DF + 1, "df"),
        (0.975, 2.0, "df"),
        (0.975, np.int64(3), "df"),
    ],
    ids=repr,
)
def test_anything_else_is_refused_naming_its_argument(p: Any, df: Any, name: str) -> None:
    with pytest.raises(PosEncError, match=rf"^{name} must be .*, got "):
        t_quantile(p, df)
