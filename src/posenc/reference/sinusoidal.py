"""Float64 NumPy oracle of the sinusoidal tables (the formulas, written plainly)."""

from __future__ import annotations

import numpy as np

__all__ = ["sinusoidal_table", "sinusoidal_table_nd"]


def sinusoidal_table(
    positions,
    dim: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    order: str = "sin_cos",
) -> np.ndarray:
    """``PE[p, 2i] = sin(p / base^(2i/dim))``, ``PE[p, 2i+1] = cos(...)``; see posenc.sinusoidal_table.

    ``layout="half"``: the same rates, all sines then all cosines. ``layout="flax"`` (Flax
    examples' ``sinusoidal_init``, tensor2tensor, T5X, MaxText, fairseq): with ``n = dim // 2``,
    ``PE[p, i] = sin(p * rate_i)``, ``PE[p, n + i] = cos(p * rate_i)``, ``rate_i =
    base^(-i / (n - 1))`` (so ``rate_{n-1} = 1 / base``), and a zero last channel for odd ``dim``;
    it needs ``dim >= 4``.

    Shape: ``[*P]`` -> ``[*P, dim]`` float64.
    """
    p = np.asarray(positions, dtype=np.float64)
    out = np.zeros((*p.shape, dim), dtype=np.float64)
    first, second = (np.sin, np.cos) if order == "sin_cos" else (np.cos, np.sin)
    if layout == "flax":
        n = dim // 2
        if n < 2:
            raise ValueError(f"dim must be >= 4 for layout='flax', got {dim}")
        for i in range(n):
            rate = base ** -(i / (n - 1))
            out[..., i] = first(p * rate)
            out[..., n + i] = second(p * rate)
        return out
    if layout != "interleaved" and layout != "half":
        raise ValueError(f"layout must be 'interleaved', 'half' or 'flax', got {layout!r}")
    n_first = (dim + 1) // 2
    for c in range(dim):
        if layout == "interleaved":
            i, fn = c // 2, (first if c % 2 == 0 else second)
        elif c < n_first:
            i, fn = c, first
        else:
            i, fn = c - n_first, second
        out[..., c] = fn(p / base ** (2.0 * i / dim))
    return out


def sinusoidal_table_nd(grid, dim: int, **options) -> np.ndarray:
    """Channels split evenly across axes, axis 0 first; ``grid`` is a shape or coordinates ``[..., k]``.

    Shape: ``(n_0, ..., n_{k-1})`` -> ``[n_0, ..., n_{k-1}, dim]``; ``[..., k]`` -> ``[..., dim]``.
    """
    if isinstance(grid, (tuple, list)) and all(isinstance(n, (int, np.integer)) for n in grid):
        coords = np.stack(np.meshgrid(*[np.arange(n) for n in grid], indexing="ij"), axis=-1)
    else:
        coords = np.asarray(grid, dtype=np.float64)
    k = coords.shape[-1]
    if dim % k:
        raise ValueError(f"dim must be divisible by the {k} axes of grid, got {dim}")
    if options.get("layout") == "flax" and dim // k < 4:
        raise ValueError(
            f"dim {dim} over {k} axes gives {dim // k} channels per axis; "
            f"layout='flax' needs >= 4 per axis: dim >= {4 * k}"
        )
    return np.concatenate(
        [sinusoidal_table(coords[..., a], dim // k, **options) for a in range(k)], axis=-1
    )
