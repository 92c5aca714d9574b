"""Float64 NumPy oracle of the attention biases (the formulas, written plainly with loops).

Positions are ``[q]`` / ``[k]`` or ``[b, q]`` / ``[b, k]``; biases are ``[h, q, k]``, or
``[b, h, q, k]`` when a position array is batched. ``i`` is a query position, ``j`` a key
position.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "fire_bias",
    "fire_normalized_distance",
    "kerple_bias",
    "shaw_relative_logits",
    "shaw_relative_values",
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
    """``-m_h (i - j)`` (causal) or ``-m_h |i - j|``.

    Shape: positions ``[q]`` / ``[k]`` (or ``[b, q]`` / ``[b, k]``) -> ``[h, q, k]`` (or
    ``[b, h, q, k]``) float64.
    """
    slopes = np.asarray(slopes, dtype=np.float64)

    def value(h, i, j):
        return -slopes[h] * ((i - j) if causal else abs(i - j))

    return _pairwise(q_positions, k_positions, len(slopes), value)


# --- T5 (Raffel et al., 2020) ----------------------------------------------------------


def _causal(causal: bool | None, bidirectional: bool | None) -> bool:
    """``causal`` (default False), or ``not bidirectional``: its deprecated spelling,
    accepted with a DeprecationWarning."""
    if bidirectional is None:
        return bool(causal)
    if causal is not None:
        raise ValueError("give causal or the deprecated bidirectional (its opposite), not both")
    warnings.warn(
        "bidirectional= is deprecated, use causal= (causal=not bidirectional)",
        DeprecationWarning,
        stacklevel=3,
    )
    return not bidirectional


def t5_relative_bucket(
    relative_position: int,
    *,
    causal: bool | None = None,
    num_buckets: int = 32,
    max_distance: int = 128,
    bidirectional: bool | None = None,
) -> int:
    """T5's bucket of one relative position ``key - query``, in exact arithmetic.

    ``causal=False`` (the default, T5's encoder): keys after the query have buckets of their
    own; ``causal=True`` (T5's decoder): they share bucket 0. ``bidirectional`` is the
    deprecated spelling of ``causal=not bidirectional``.

    T5 itself takes the logarithm in float32; for a few ``(num_buckets, max_distance)``
    that puts a distance lying exactly on a bucket boundary one bucket lower than here.

    Shape: one integer -> one integer bucket in ``[0, num_buckets)``.
    """
    causal = _causal(causal, bidirectional)
    n = relative_position
    bucket = 0
    if not causal:
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
    q_positions,
    k_positions,
    table,
    *,
    causal: bool | None = None,
    max_distance: int = 128,
    bidirectional: bool | None = None,
) -> np.ndarray:
    """``table[bucket(j - i), h]`` with ``table`` ``[num_buckets, h]``; ``causal`` and
    ``bidirectional`` as in :func:`t5_relative_bucket`.

    Shape: positions ``[q]`` / ``[k]`` (or ``[b, q]`` / ``[b, k]``) -> ``[h, q, k]`` (or
    ``[b, h, q, k]``) float64.
    """
    causal = _causal(causal, bidirectional)
    table = np.asarray(table, dtype=np.float64)
    num_buckets, num_heads = table.shape

    def value(h, i, j):
        bucket = t5_relative_bucket(
            int(j - i),
            causal=causal,
            num_buckets=num_buckets,
            max_distance=max_distance,
        )
        return table[bucket, h]

    return _pairwise(q_positions, k_positions, num_heads, value)


# --- Shaw et al. (2018) ------------------------------------------------------------------


def _shaw_row(i: float, j: float, max_distance: int) -> int:
    """Row of the relative table for query ``i`` and key ``j``: ``clip(j - i, -K, K) + K``."""
    return int(min(max(j - i, -max_distance), max_distance)) + max_distance


def _shaw_pairs(q_positions, k_positions, table: np.ndarray, shape: tuple[int, ...]):
    """``(b, h, i, j, table[clip(j - i) + K])`` for every index of ``shape = (batch, heads, q,
    k)``, in order (unbatched positions serve every ``b``)."""
    qp, kp, _ = _batched(q_positions, k_positions)
    max_distance = (table.shape[0] - 1) // 2
    for b, h, i, j in np.ndindex(*shape):
        row = b if qp.shape[0] > 1 else 0
        yield b, h, i, j, table[_shaw_row(qp[row, i], kp[row, j], max_distance)]


def shaw_relative_logits(q, table, q_positions, k_positions) -> np.ndarray:
    """``out[b, h, i, j] = q[b, h, i] . table[clip(j - i) + K]`` with ``table`` ``[2K + 1, d]``.

    Shape: ``q [b, h, q, d]`` -> ``[b, h, q, k]``.
    """
    q = np.asarray(q, dtype=np.float64)
    table = np.asarray(table, dtype=np.float64)
    shape = (*q.shape[:3], np.shape(k_positions)[-1])
    out = np.empty(shape, dtype=np.float64)
    for b, h, i, j, a in _shaw_pairs(q_positions, k_positions, table, shape):
        out[b, h, i, j] = np.dot(q[b, h, i], a)
    return out


def shaw_relative_values(probs, table, q_positions, k_positions) -> np.ndarray:
    """``out[b, h, i] = sum_j probs[b, h, i, j] * table[clip(j - i) + K]``.

    Shape: ``probs [b, h, q, k]`` -> ``[b, h, q, d]``.
    """
    probs = np.asarray(probs, dtype=np.float64)
    table = np.asarray(table, dtype=np.float64)
    out = np.zeros((*probs.shape[:3], table.shape[1]), dtype=np.float64)
    for b, h, i, j, a in _shaw_pairs(q_positions, k_positions, table, probs.shape):
        out[b, h, i] += probs[b, h, i, j] * a
    return out


# --- FIRE (Li et al., 2023) ----------------------------------------------------------------


def fire_normalized_distance(
    q_positions, k_positions, *, c: float, threshold: float, eps: float = 1e-6
) -> np.ndarray:
    """``psi(|i - j|) / (psi(max(L, i)) + eps)`` with ``psi(x) = log(c x + 1)``.

    Shape: ``[q, k]`` (or ``[b, q, k]``).
    """
    c, threshold = abs(c), abs(threshold)

    def psi(x):
        return math.log(c * x + 1.0)

    value = _pairwise(
        q_positions,
        k_positions,
        1,
        lambda h, i, j: psi(abs(i - j)) / (psi(max(threshold, i)) + eps),
    )
    return value[:, 0] if value.ndim == 4 else value[0]


def fire_bias(
    q_positions, k_positions, w1, b1, w2, b2, *, c: float, threshold: float, eps: float = 1e-6
) -> np.ndarray:
    """``f(x)[h] = b2[h] + sum_u w2[h, u] * max(0, w1[u] * x + b1[u])`` of the normalised
    distance ``x``: FIRE's MLP with one hidden ReLU layer (``w1`` ``[width]`` or
    ``[width, 1]``, ``w2`` ``[h, width]``).

    Shape: positions ``[q]`` / ``[k]`` (or ``[b, q]`` / ``[b, k]``) -> ``[h, q, k]`` (or
    ``[b, h, q, k]``) float64.
    """
    w1 = np.asarray(w1, dtype=np.float64).reshape(-1)
    b1, w2, b2 = (np.asarray(a, dtype=np.float64) for a in (b1, w2, b2))
    c, threshold = abs(c), abs(threshold)

    def value(h, i, j):
        x = math.log(c * abs(i - j) + 1.0) / (math.log(c * max(threshold, i) + 1.0) + eps)
        out = b2[h]
        for u in range(len(w1)):
            out += w2[h, u] * max(0.0, w1[u] * x + b1[u])
        return out

    return _pairwise(q_positions, k_positions, len(b2), value)


# --- KERPLE (Chi et al., 2022) -------------------------------------------------------------


def kerple_bias(q_positions, k_positions, r1, r2) -> np.ndarray:
    """The logarithmic variant ``-r1_h * log(1 + r2_h * |i - j|)``.

    Shape: positions ``[q]`` / ``[k]`` (or ``[b, q]`` / ``[b, k]``) -> ``[h, q, k]`` (or
    ``[b, h, q, k]``) float64.
    """
    r1 = np.asarray(r1, dtype=np.float64)
    r2 = np.asarray(r2, dtype=np.float64)

    def value(h, i, j):
        return -r1[h] * math.log(1.0 + r2[h] * abs(i - j))

    return _pairwise(q_positions, k_positions, len(r1), value)
