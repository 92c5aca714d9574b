"""Float64 NumPy oracle of the position maps (Self-Extend, STRING) and their attention.

Written plainly, per (query, key) pair: the positions each map gives a pair, then attention
that rotates query ``i`` and key ``j`` at those positions, pair by pair, before their dot
product. Self-Extend: Jin et al. 2024 ("LLM Maybe LongLM", datamllab/LongLM); STRING: An et
al. 2024 ("Why Does the Effective Context Length of LLMs Fall Short?").

Shapes: positions ``[sq]`` / ``[sk]``; per-pair positions ``[sq, sk]``.
"""

from __future__ import annotations

import numpy as np

from posenc.reference.rotary import apply_rotary, rotary_angles

__all__ = ["remapped_attention_reference", "self_extend_positions", "string_positions"]


def _offsets(q_pos, k_pos) -> np.ndarray:
    q = np.asarray(q_pos, dtype=np.int64)
    k = np.asarray(k_pos, dtype=np.int64)
    return q[:, None] - k[None, :]  # [sq, sk]


def _per_pair(q_pos, k_pos, rule) -> tuple[np.ndarray, np.ndarray]:
    """``(qp, kp)`` float64 ``[sq, sk]``: ``rule(i, j, d)`` for each pair of positions ``i``,
    ``j`` and offset ``d = i - j``, giving the pair's query and key positions."""
    d = _offsets(q_pos, k_pos)
    qp = np.empty(d.shape)
    kp = np.empty(d.shape)
    for a, i in enumerate(np.asarray(q_pos, dtype=np.int64)):
        for c, j in enumerate(np.asarray(k_pos, dtype=np.int64)):
            qp[a, c], kp[a, c] = rule(int(i), int(j), int(d[a, c]))
    return qp, kp


def self_extend_positions(q_pos, k_pos, group_size: int, neighbor_window: int):
    """Self-Extend's positions per pair: offsets ``d < W`` keep ``(i, j)``; others rotate the
    query at ``i // G + W - W / G`` and the key at ``j // G``.

    Shape: ``[sq]``, ``[sk]`` -> ``(qp, kp)`` float64 ``[sq, sk]`` each.
    """
    g, w = int(group_size), int(neighbor_window)

    def rule(i: int, j: int, d: int) -> tuple[float, float]:
        if d < w:
            return float(i), float(j)
        return float(i // g) + w - w / g, float(j // g)

    return _per_pair(q_pos, k_pos, rule)


def string_positions(q_pos, k_pos, shift: int, local_window: int):
    """STRING's positions per pair: offsets ``d < S`` keep ``(i, j)``; others rotate the query
    at ``i - S + W`` (the pair's offset becomes ``d - S + W``) and the key at ``j``.

    Shape: ``[sq]``, ``[sk]`` -> ``(qp, kp)`` float64 ``[sq, sk]`` each.
    """
    s, w = int(shift), int(local_window)
    return _per_pair(
        q_pos, k_pos, lambda i, j, d: (float(i) if d < s else float(i - s + w), float(j))
    )


def _seen(q_pos, k_pos, sq: int, sk: int) -> np.ndarray:
    """Bool ``[sq, sk]``: key ``j`` is visible to query ``i`` iff its position is not after
    the query's (positions default to ``arange(sk)``, the queries the last ``sq`` of them)."""
    q = np.arange(sk - sq, sk) if q_pos is None else np.asarray(q_pos, dtype=np.int64)
    k = np.arange(sk) if k_pos is None else np.asarray(k_pos, dtype=np.int64)
    return _offsets(q, k) >= 0


def remapped_attention_reference(
    q,
    k,
    v,
    inv_freq,
    qp,
    kp,
    *,
    q_positions=None,
    k_positions=None,
    layout: str = "half",
    scale: float | None = None,
    attention_factor: float = 1.0,
    softcap: float | None = None,
    keep=None,
) -> np.ndarray:
    """Attention where query ``i`` is rotated at ``qp[i, j]`` and key ``j`` at ``kp[i, j]``
    for their dot product (RoPE of ``inv_freq``, cos and sin times ``attention_factor``).

    Args:
        q, k, v: ``[b, h, sq, d]``, ``[b, h_kv, sk, d]``, ``[b, h_kv, sk, d_v]``; query head
            ``i`` reads key head ``i // (h // h_kv)``.
        qp, kp: per-pair positions ``[sq, sk]`` (:func:`self_extend_positions`, ...).
        q_positions, k_positions: the original positions ``[sq]`` / ``[sk]`` (default: keys
            ``arange(sk)``, queries the last ``sq``); key ``j`` is visible to query ``i`` iff
            ``k_positions[j] <= q_positions[i]``.
        scale: default ``1 / sqrt(d)``; softcap: logits ``c * tanh(logits / c)`` before
            the mask; keep: bool broadcastable to ``[b, h, sq, sk]``, True = may attend.

    A query that sees no key gets zeros. Shape: ``-> [b, h, sq, d_v]`` float64.
    """
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    group = h // hk
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    qp = np.asarray(qp, dtype=np.float64)
    kp = np.asarray(kp, dtype=np.float64)
    allowed = np.broadcast_to(_seen(q_positions, k_positions, sq, sk), (b, h, sq, sk))
    if keep is not None:
        allowed = allowed & np.broadcast_to(np.asarray(keep, bool), (b, h, sq, sk))
    kr = np.repeat(k, group, axis=1)  # [b, h, sk, d]
    out = np.zeros((b, h, sq, v.shape[-1]))
    vr = np.repeat(v, group, axis=1)
    factor = np.full((sk, len(inv_freq)), float(attention_factor))
    for i in range(sq):
        # query i copied once per key, each copy rotated at that pair's position
        qi = apply_rotary(
            np.repeat(q[:, :, i : i + 1], sk, axis=2),
            rotary_angles(qp[i], inv_freq),
            layout=layout,
            scale=factor,
        )
        ki = apply_rotary(kr, rotary_angles(kp[i], inv_freq), layout=layout, scale=factor)
        logits = (qi * ki).sum(axis=-1) * scale  # [b, h, sk]
        if softcap is not None:
            logits = softcap * np.tanh(logits / softcap)
        for bi in range(b):
            for hi in range(h):
                seen = allowed[bi, hi, i]
                if not seen.any():
                    continue  # no key to attend to: zeros
                z = np.where(seen, logits[bi, hi], -np.inf)
                e = np.exp(z - z[seen].max())
                out[bi, hi, i] = (e / e.sum()) @ vr[bi, hi]
    return out
