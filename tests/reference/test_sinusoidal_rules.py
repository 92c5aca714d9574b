"""The reference's N-D sinusoidal table refuses what the torch function refuses, naming the
dim the caller gave (it is torch-free and used by other frameworks through the vectors)."""

from __future__ import annotations

import numpy as np
import pytest

from posenc import reference


@pytest.mark.parametrize(
    ("grid", "dim", "options", "message"),
    [
        ((2, 3), 5, {}, "dim must be divisible by the 2 axes of grid, got 5"),
        ((2, 3, 4), 8, {"layout": "half"}, "dim must be divisible by the 3 axes of grid, got 8"),
        (
            (2, 3),
            4,
            {"layout": "flax"},
            "dim 4 over 2 axes gives 2 channels per axis; layout='flax' needs >= 4 per axis: "
            "dim >= 8",
        ),
    ],
)
def test_nd_refuses_naming_the_callers_dim(grid, dim, options, message) -> None:
    with pytest.raises(ValueError) as info:
        reference.sinusoidal_table_nd(grid, dim, **options)
    assert str(info.value) == message


@pytest.mark.parametrize("layout", ["interleaved", "half", "flax"])
def test_nd_is_each_axis_table_side_by_side(layout) -> None:
    out = reference.sinusoidal_table_nd((3, 5), 16, layout=layout)
    rows = reference.sinusoidal_table(np.arange(3), 8, layout=layout)
    cols = reference.sinusoidal_table(np.arange(5), 8, layout=layout)
    expected = np.concatenate(
        [
            np.broadcast_to(rows[:, None, :], (3, 5, 8)),
            np.broadcast_to(cols[None, :, :], (3, 5, 8)),
        ],
        axis=-1,
    )
    np.testing.assert_array_equal(out, expected)
