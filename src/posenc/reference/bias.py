"""Float64 NumPy oracle of the attention biases (the formulas, written plainly with loops).

Positions are ``[q]`` / ``[k]`` or ``[b, q]`` / ``[b, k]``; biases are ``[h, q, k]``, or
``[b, h, q, k]`` when a position array is batched. ``i`` is a query position, ``j`` a key
position.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "t5_relative_bias",
    "t5_relative_bucket",
]


def _batched(q_positions, k_positions):
    """Positions as float64 ``[B, q]`` and ``[B, k]`` (B = 1 unless batched) and whether batched."""
    qp = np.asarray(q_positions, dtype=np.float64)
    kp = np.asarray(k_positions, dtype=np.float64)
    batched = qp.ndim == 2 or kp.ndim == 2
    qp, kp = np.atleast_2d(qp), np.atleast_2d(kp)
    rows = max(qp.shape[0], kp.shape[0])
    return (
        np.broadcast_to(qp, (rows, qp.shape[1])),
        np.broadcast_to(kp, (rows, kp.shape[1])),
        batched,
    )


def _pairwise(q_positions, k_positions, num_heads: int, value) -> np.ndarray:
    """``out[b, h, i, j] = value(h, q_positions[b, i], k_positions[b, j])``."""
    qp, kp, batched = _batched(q_positions, k_positions)
    out = np.empty((qp.shape[0], num_heads, qp.shape[1], kp.shape[1]), dtype=np.float64)
    for b in range(qp.shape[0]):
        for h in range(num_heads):
            for i in range(qp.shape[1]):
                for j in range(kp.shape[1]):
                    out[b, h, i, j] = value(h, qp[b, i], kp[b, j])
    return out if batched else out[0]


# --- ALiBi (Press et al., 2022) -------------------------------------------------------


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The paper's slopes: for ``n`` a power of two, the geometric sequence starting at
    ``2^(-8/n)`` with that ratio; otherwise the slopes of the closest lower power of two,
    then every other slope (the 1st, 3rd, ...) of twice that many heads.

    Shape: ``[num_heads]`` float64.
    """

    def power_of_two(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return np.array(power_of_two(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(closest) + list(alibi_slopes(2 * closest)[0::2][: num_heads - closest])
    return np.array(slopes)


def alibi_bias(q_positions, k_positions, slopes, *, causal: bool = True) -> np.ndarray:
    """``-m_h (i - j)`` (causal) or ``-m_h |i - j|``."""
    slopes = np.asarray(slopes, dtype=np.float64)

    def value(h, i, j):
        return -slopes[h] * ((i - j) if causal else abs(i - j))

    return _pairwise(q_positions, k_positions, len(slopes), value)


# --- T5 (Raffel et al., 2020) ----------------------------------------------------------


def t5_relative_bucket(
    relative_position: int,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> int:
    """T5's bucket of one relative position ``key - query``, in exact arithmetic.

    T5 itself takes the logarithm in float32; for a few ``(num_buckets, max_distance)``
    that puts a distance lying exactly on a bucket boundary one bucket lower than here.
    """
    n = relative_position
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if n > 0:
            bucket += num_buckets
        n = abs(n)
    else:
        n = max(-n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return bucket + min(large, num_buckets - 1)


def t5_relative_bias(
    q_positions, k_positions, table, *, bidirectional: bool = True, max_distance: int = 128
) -> np.ndarray:
    """``table[bucket(j - i), h]`` with ``table`` ``[num_buckets, h]``."""
    table = np.asarray(table, dtype=np.float64)
    num_buckets, num_heads = table.shape

    def value(h, i, j):
        bucket = t5_relative_bucket(
            int(j - i), bidirectional=bidirectional, num_buckets=num_buckets,
            max_distance=max_distance,
        )  # fmt: skip
        return table[bucket, h]

    return _pairwise(q_positions, k_positions, num_heads, value)
