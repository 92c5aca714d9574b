"""Float64 NumPy oracle of the context-dependent attention encodings, written plainly with loops.

CoPE (Golovneva et al., 2024, "Contextual Position Encoding"), as the paper's released code
computes it: sigmoid gates on the scaled logits count the keys between a key and its query,
and the (fractional) count picks a position logit from a table by linear interpolation.

Forgetting attention (FoX; Lin et al., 2025, "Forgetting Transformer: Softmax Attention with a
Forget Gate"): the logit of key ``j`` for query ``i`` decays by the forget gates of the tokens
after ``j`` up to ``i``, ``sum_{l = j+1 .. i} log f_l``.

Shapes: ``q [b, h, nq, d]``, ``k [b, h_kv, nk, d]``, ``v [b, h_kv, nk, d_v]``; query head ``i``
reads key/value head ``i // (h // h_kv)`` (grouped-query attention). Queries are the last
``nq`` of the ``nk`` tokens, so query ``i`` sits at token ``i' = i + nk - nq``; causal
attention lets it see key ``j`` iff ``j <= i'``. ``keep [b, nk]`` (bool, True = a real token)
masks padded keys. A query that may attend to no key gets an output of zeros.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "cope_attention",
    "cope_bias",
    "cope_positions",
    "fox_attention",
    "fox_bias",
]

_POSITION_LOGITS = ("scaled", "unscaled")


# --- shared checks and masks ---------------------------------------------------------------


def _qk(q, k) -> tuple[np.ndarray, np.ndarray, int]:
    """``q``, ``k`` as float64 after the shape checks, and the GQA group ``h // h_kv``."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(f"q and k must be [b, h, n, d], got q {q.shape} and k {k.shape}")
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"q and k batch differ: q {q.shape}, k {k.shape}")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"q and k head dims differ: q {q.shape}, k {k.shape}")
    h, h_kv = q.shape[1], k.shape[1]
    if h_kv == 0 or h % h_kv != 0:
        raise ValueError(f"key heads ({h_kv}) must divide query heads ({h})")
    return q, k, h // h_kv


def _values(v, k: np.ndarray) -> np.ndarray:
    """``v`` as float64, checked against ``k``: ``[b, h_kv, nk, d_v]``."""
    v = np.asarray(v, dtype=np.float64)
    if v.ndim != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must be [b, h_kv, nk, d_v] matching k {k.shape}, got {v.shape}")
    return v


def _allowed(batch: int, nq: int, nk: int, causal: bool, keep) -> np.ndarray:
    """``allowed[b, i, j]``: ``(not causal or j <= i + nk - nq) and keep[b, j]``.

    Shape: ``-> [b, nq, nk]`` bool.
    """
    if causal and nq > nk:
        raise ValueError(f"causal queries are the last nq of the nk keys: nq {nq} > nk {nk}")
    if keep is None:
        keep = np.ones((batch, nk), dtype=bool)
    keep = np.asarray(keep, dtype=bool)
    if keep.shape != (batch, nk):
        raise ValueError(f"keep must be [b, nk] = {(batch, nk)}, got {keep.shape}")
    allowed = np.zeros((batch, nq, nk), dtype=bool)
    for b in range(batch):
        for i in range(nq):
            for j in range(nk):
                allowed[b, i, j] = (not causal or j <= i + (nk - nq)) and bool(keep[b, j])
    return allowed


def _scale(scale: float | None, d: int) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _sigmoid(x: float) -> float:
    """``1 / (1 + e^-x)`` without overflow for very negative ``x``."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _softmax_rows(logits: np.ndarray, allowed: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``out[i] = sum_j softmax_j(logits[i, j] over allowed j) v[j]``; zeros for an empty row.

    Shape: ``logits [nq, nk]``, ``allowed [nq, nk]``, ``v [nk, d_v]`` -> ``[nq, d_v]``.
    """
    nq, nk = logits.shape
    out = np.zeros((nq, v.shape[1]), dtype=np.float64)
    for i in range(nq):
        js = [j for j in range(nk) if allowed[i, j]]
        if not js:
            continue  # no key to attend to: zeros
        top = max(logits[i, j] for j in js)
        weights = {j: math.exp(logits[i, j] - top) for j in js}
        total = sum(weights.values())
        for j in js:
            out[i] += weights[j] / total * v[j]
    return out


# --- CoPE (Golovneva et al., 2024) -----------------------------------------------------------


def cope_positions(
    q,
    k,
    *,
    scale: float | None = None,
    causal: bool = True,
    keep=None,
    npos_max: int | None = None,
) -> np.ndarray:
    """CoPE's contextual positions ``p_ij = sum_{t >= j} gate_it``.

    ``gate_it = sigmoid(scale * q_i . k_t)`` on allowed pairs and 0 elsewhere, so with causal
    masking the sum runs over ``t = j .. i'``. Clamped to at most ``npos_max - 1`` when
    ``npos_max`` is given; 0 on pairs that are not allowed.

    Args:
        q, k: ``[b, h, nq, d]``, ``[b, h_kv, nk, d]``.
        scale: logits multiplier, default ``1 / sqrt(d)``.
        causal: query ``i`` sees key ``j`` iff ``j <= i + (nk - nq)``.
        keep: bool ``[b, nk]``, True for a real key; None keeps every key.
        npos_max: the size of the position table; None leaves the positions unclamped.

    Shape: ``-> [b, h, nq, nk]`` float64.
    """
    q, k, group = _qk(q, k)
    batch, heads, nq, d = q.shape
    nk = k.shape[2]
    scale = _scale(scale, d)
    allowed = _allowed(batch, nq, nk, causal, keep)
    p = np.zeros((batch, heads, nq, nk), dtype=np.float64)
    for b in range(batch):
        for h in range(heads):
            kh = k[b, h // group]
            for i in range(nq):
                gate = np.zeros(nk, dtype=np.float64)
                for t in range(nk):
                    if allowed[b, i, t]:
                        gate[t] = _sigmoid(scale * float(np.dot(q[b, h, i], kh[t])))
                for j in range(nk):
                    if not allowed[b, i, j]:
                        continue
                    total = 0.0
                    for t in range(j, nk):
                        total += gate[t]
                    if npos_max is not None:
                        total = min(total, float(npos_max - 1))
                    p[b, h, i, j] = total
    return p


def _cope_logits(q, k, weight, scale, position_logit, causal, keep):
    """The checked inputs, ``scale``, ``q . k`` ``[b, h, nq, nk]``, the interpolated position
    logits ``z`` ``[b, h, nq, nk]`` and ``allowed`` ``[b, nq, nk]``."""
    if position_logit not in _POSITION_LOGITS:
        raise ValueError(
            f"position_logit must be one of {_POSITION_LOGITS}, got {position_logit!r}"
        )
    q, k, group = _qk(q, k)
    weight = np.asarray(weight, dtype=np.float64)
    batch, heads, nq, d = q.shape
    nk = k.shape[2]
    if weight.ndim != 2 or weight.shape[1] != d or weight.shape[0] < 1:
        raise ValueError(f"weight must be [npos_max, d] with d = {d}, got {weight.shape}")
    npos_max = weight.shape[0]
    scale = _scale(scale, d)
    allowed = _allowed(batch, nq, nk, causal, keep)
    p = cope_positions(q, k, scale=scale, causal=causal, keep=keep, npos_max=npos_max)
    qk = np.zeros((batch, heads, nq, nk), dtype=np.float64)
    z = np.zeros((batch, heads, nq, nk), dtype=np.float64)
    for b in range(batch):
        for h in range(heads):
            kh = k[b, h // group]
            for i in range(nq):
                for j in range(nk):
                    if not allowed[b, i, j]:
                        continue
                    qk[b, h, i, j] = float(np.dot(q[b, h, i], kh[j]))
                    pos = p[b, h, i, j]
                    lo, hi = math.floor(pos), math.ceil(pos)
                    w = pos - lo
                    e_lo = float(np.dot(q[b, h, i], weight[lo]))
                    e_hi = float(np.dot(q[b, h, i], weight[hi]))
                    z[b, h, i, j] = (1.0 - w) * e_lo + w * e_hi
    return q, k, group, scale, qk, z, allowed


def cope_bias(
    q,
    k,
    weight,
    *,
    scale: float | None = None,
    position_logit: str = "scaled",
    causal: bool = True,
    keep=None,
) -> np.ndarray:
    """The term CoPE adds to ``scale * q_i . k_j`` before the softmax.

    ``z_ij = (1 - w) * q_i . weight[floor(p_ij)] + w * q_i . weight[ceil(p_ij)]`` with
    ``w = p_ij - floor(p_ij)`` and ``p`` from :func:`cope_positions` clamped to
    ``npos_max - 1``. ``position_logit="scaled"`` returns ``scale * z`` (the logits are
    ``scale * (q . k + z)``), ``"unscaled"`` returns ``z`` (``scale * q . k + z``); 0 on
    pairs that are not allowed.

    Args:
        q, k: ``[b, h, nq, d]``, ``[b, h_kv, nk, d]``.
        weight: ``[npos_max, d]``, one position table shared by every head.
        scale, causal, keep: as in :func:`cope_positions`.
        position_logit: ``"scaled"`` or ``"unscaled"``.

    Shape: ``-> [b, h, nq, nk]`` float64.
    """
    _, _, _, scale, _, z, _ = _cope_logits(q, k, weight, scale, position_logit, causal, keep)
    return scale * z if position_logit == "scaled" else z


def cope_attention(
    q,
    k,
    v,
    weight,
    *,
    scale: float | None = None,
    position_logit: str = "scaled",
    causal: bool = True,
    keep=None,
) -> np.ndarray:
    """CoPE attention: ``out_i = sum_j softmax_j(logits_ij) v_j`` over the allowed keys.

    ``logits_ij = scale * (q_i . k_j + z_ij)`` (``"scaled"``) or ``scale * q_i . k_j + z_ij``
    (``"unscaled"``), ``z`` as in :func:`cope_bias`. A query with no allowed key gets zeros.

    Args:
        q, k, v: ``[b, h, nq, d]``, ``[b, h_kv, nk, d]``, ``[b, h_kv, nk, d_v]``.
        weight, scale, position_logit, causal, keep: as in :func:`cope_bias`.

    Shape: ``-> [b, h, nq, d_v]`` float64.
    """
    q, k, group, scale, qk, z, allowed = _cope_logits(
        q, k, weight, scale, position_logit, causal, keep
    )
    v = _values(v, k)
    batch, heads, nq, _ = q.shape
    out = np.zeros((batch, heads, nq, v.shape[3]), dtype=np.float64)
    for b in range(batch):
        for h in range(heads):
            if position_logit == "scaled":
                logits = scale * (qk[b, h] + z[b, h])
            else:
                logits = scale * qk[b, h] + z[b, h]
            out[b, h] = _softmax_rows(logits, allowed[b], v[b, h // group])
    return out


# --- Forgetting attention (Lin et al., 2025) ---------------------------------------------------


def _log_forget(log_forget) -> np.ndarray:
    log_forget = np.asarray(log_forget, dtype=np.float64)
    if log_forget.ndim != 3:
        raise ValueError(f"log_forget must be [b, h, nk], got {log_forget.shape}")
    return log_forget


def fox_bias(log_forget, nq: int) -> np.ndarray:
    """FoX's decay bias ``sum_{l = j+1 .. i'} log_forget_l`` for ``j <= i'``, ``-inf`` for
    ``j > i'``, where ``i' = i + nk - nq`` (the queries are the last ``nq`` tokens).

    Written as the explicit sum over ``l``, not as a difference of cumulative sums, so it
    checks that formula independently. The diagonal ``j = i'`` is an empty sum, 0.

    Args:
        log_forget: ``[b, h, nk]``, the log of each token's forget gate (values ``<= 0``).
        nq: the number of queries, ``<= nk``.

    Shape: ``-> [b, h, nq, nk]`` float64.
    """
    log_forget = _log_forget(log_forget)
    batch, heads, nk = log_forget.shape
    if not 0 <= nq <= nk:
        raise ValueError(
            f"the queries are the last nq of the nk tokens: need 0 <= nq {nq} <= nk {nk}"
        )
    out = np.full((batch, heads, nq, nk), -np.inf, dtype=np.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(nq):
                last = i + (nk - nq)
                for j in range(last + 1):
                    total = 0.0
                    for l in range(j + 1, last + 1):  # noqa: E741
                        total += log_forget[b, h, l]
                    out[b, h, i, j] = total
    return out


def fox_attention(q, k, v, log_forget, *, scale: float | None = None, keep=None) -> np.ndarray:
    """Forgetting attention: ``out = softmax(scale * q . k + D) v`` over the allowed keys.

    ``D_ij = c_{i'} - c_j`` with ``c_t = sum_{l <= t} log_forget_l`` (a cumulative sum over
    the ``nk`` tokens) and ``i' = i + nk - nq``; always causal (``j <= i'``). ``keep`` masks
    keys only: the decay still sums ``log_forget`` over every token in between, padded or
    not (give 0 there to skip them). A query with no allowed key gets zeros.

    Args:
        q, k, v: ``[b, h, nq, d]``, ``[b, h_kv, nk, d]``, ``[b, h_kv, nk, d_v]``.
        log_forget: ``[b, h, nk]``, per query head.
        scale: logits multiplier, default ``1 / sqrt(d)``.
        keep: bool ``[b, nk]``, True for a real key; None keeps every key.

    Shape: ``-> [b, h, nq, d_v]`` float64.
    """
    q, k, group = _qk(q, k)
    v = _values(v, k)
    log_forget = _log_forget(log_forget)
    batch, heads, nq, d = q.shape
    nk = k.shape[2]
    if log_forget.shape != (batch, heads, nk):
        raise ValueError(
            f"log_forget must be [b, h, nk] = {(batch, heads, nk)}, got {log_forget.shape}"
        )
    scale = _scale(scale, d)
    allowed = _allowed(batch, nq, nk, True, keep)
    out = np.zeros((batch, heads, nq, v.shape[3]), dtype=np.float64)
    for b in range(batch):
        for h in range(heads):
            kh = k[b, h // group]
            c = np.cumsum(log_forget[b, h])
            logits = np.zeros((nq, nk), dtype=np.float64)
            for i in range(nq):
                last = i + (nk - nq)
                for j in range(last + 1):
                    logits[i, j] = scale * float(np.dot(q[b, h, i], kh[j])) + (c[last] - c[j])
            out[b, h] = _softmax_rows(logits, allowed[b], v[b, h // group])
    return out
