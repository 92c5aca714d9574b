"""Float64 NumPy oracle of attention: ``softmax(q k^T * scale + bias + mask) v``, written plainly."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["attention"]


def attention(
    q,
    k,
    v,
    *,
    bias=None,
    causal: bool = False,
    mask=None,
    scale: float | None = None,
    value_term: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """Explicit attention, one query row at a time, in float64.

    Args:
        q, k, v: ``[b, h, q, d]``, ``[b, h_kv, k, d]``, ``[b, h_kv, k, d_v]``; query head
            ``i`` reads key/value head ``i // (h // h_kv)`` (grouped-query attention).
        bias: added to the scaled logits; broadcastable to ``[b, h, q, k]``.
        causal: query ``i`` sees key ``j`` iff ``j <= i + (k - q)`` (queries are the last keys).
        mask: bool, broadcastable to ``[b, h, q, k]``, True where a query may attend.
        scale: logits multiplier, default ``1 / sqrt(d)``.
        value_term: ``f(probs [b, h, q, k]) -> [b, h, q, d_v]`` added to ``probs @ v``
            (Shaw et al.'s relative values).

    A query that may attend to no key gets an output of zeros.

    Shape: ``-> [b, h, q, d_v]`` float64.
    """
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    group = h // h_kv
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    full = (b, h, n_q, n_k)
    bias = np.zeros(full) if bias is None else np.broadcast_to(np.asarray(bias, np.float64), full)
    allowed = np.ones(full, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), full)
    probs = np.zeros(full)
    out = np.zeros((b, h, n_q, v.shape[-1]))
    for bi in range(b):
        for hi in range(h):
            kh, vh = k[bi, hi // group], v[bi, hi // group]  # [k, d], [k, d_v]
            for i in range(n_q):
                visible = allowed[bi, hi, i].copy()
                if causal:
                    visible &= np.arange(n_k) <= i + (n_k - n_q)
                if not visible.any():
                    continue  # no key to attend to: zeros
                logits = kh @ q[bi, hi, i] * scale + bias[bi, hi, i]  # [k]
                logits = np.where(visible, logits, -np.inf)
                e = np.exp(logits - logits[visible].max())
                probs[bi, hi, i] = e / e.sum()
                out[bi, hi, i] = probs[bi, hi, i] @ vh
    if value_term is not None:
        out = out + np.asarray(value_term(probs), dtype=np.float64)
    return out
