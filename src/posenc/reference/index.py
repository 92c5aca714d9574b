"""Float64 NumPy oracle of the naive index encoding: every channel holds the position."""

from __future__ import annotations

import numpy as np

__all__ = ["index_table"]


def index_table(
    positions, dim: int, *, normalize: str | None = None, length: int | None = None
) -> np.ndarray:
    """``PE[p, c] = p`` (``normalize=None``) or ``p / length`` (``normalize="length"``).

    Shape: ``[*P]`` -> ``[*P, dim]`` float64; see posenc.index.index_table.
    """
    p = np.asarray(positions, dtype=np.float64)
    value = p / length if normalize == "length" and length else p
    out = np.empty((*p.shape, dim), dtype=np.float64)
    for c in range(dim):
        out[..., c] = value
    return out
