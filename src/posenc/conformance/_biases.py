"""The bias cases: ALiBi, T5 (buckets and bias), Shaw (logits and values), FIRE, KERPLE,
CoPE, FoX, and the position maps of Self-Extend and STRING, from :mod:`posenc.reference`.

Each is ``fn(query_positions [m], key_positions [n], *, heads, **parameters) -> [heads, m,
n]`` (Shaw's values ``[heads, m, d]``; a position map ``[2, m, n]``: the query's position
and the key's, per pair, with ``heads = 2``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posenc import reference
from posenc.conformance._case import Case, make, representable, seed, where_name

__all__ = ["build"]

_NEAR_Q = np.array([0, 1, 2, 255, 256, 257, 1000, 4095], dtype=np.int64)
_NEAR_K = np.array([0, 1, 2, 3, 100, 255, 256, 257, 2048, 4095], dtype=np.int64)
_FAR_Q = np.array([100_000, 100_001, 1_000_000, 1_000_001], dtype=np.int64)
_FAR_K = np.array([0, 99_999, 100_000, 100_001, 999_999, 1_000_000, 1_000_001], dtype=np.int64)


def _pos(far: bool) -> tuple[np.ndarray, np.ndarray]:
    return (_FAR_Q, _FAR_K) if far else (_NEAR_Q, _NEAR_K)


def _bias(
    name: str,
    family: str,
    far: bool,
    qp: np.ndarray,
    kp: np.ndarray,
    bias: np.ndarray,
    *,
    parameters: dict[str, Any],
    arrays: dict[str, np.ndarray] | None = None,
    convention: dict[str, Any] | None = None,
    magnitude: np.ndarray | None = None,
    doc: str,
) -> Case:
    return make(
        f"{name}{where_name(far)}",
        family,
        "bias",
        convention=convention or {},
        parameters={"heads": int(bias.shape[0]), **parameters},
        inputs={"query_positions": qp, "key_positions": kp, **(arrays or {})},
        expected={"bias": bias},
        magnitude=None if magnitude is None else {"bias": magnitude},
        far=far,
        doc=doc,
    )


def _alibi() -> list[Case]:
    out = []
    for heads in (8, 12):
        slopes = reference.alibi_slopes(heads)
        for causal in (True, False):
            for far in (False, True):
                qp, kp = _pos(far)
                kind = "causal" if causal else "symmetric"
                out.append(
                    _bias(
                        f"alibi.{kind}.h{heads}",
                        "alibi",
                        far,
                        qp,
                        kp,
                        reference.alibi_bias(qp, kp, slopes, causal=causal),
                        parameters={"causal": causal},
                        convention={"causal": causal},
                        doc=f"ALiBi, {heads} heads (the paper's slopes"
                        + ("" if heads & (heads - 1) == 0 else ", not a power of two")
                        + f"), {'-m (i - j)' if causal else '-m |i - j|'}",
                    )
                )
    return out


def _t5() -> list[Case]:
    out = []
    heads, buckets, distance = 4, 32, 128
    rng = np.random.default_rng(seed("t5"))
    weights = representable(rng, (buckets, heads))
    identity = np.repeat(np.arange(buckets, dtype=np.float64)[:, None], heads, axis=1)
    for causal in (False, True):
        kind = "causal" if causal else "bidirectional"
        for what, table in (("buckets", identity), ("bias", weights)):
            for far in (False, True):
                qp, kp = _pos(far)
                bias = reference.t5_relative_bias(
                    qp, kp, table, causal=causal, max_distance=distance
                )
                out.append(
                    _bias(
                        f"t5.{what}.{kind}",
                        "t5",
                        far,
                        qp,
                        kp,
                        bias,
                        parameters={
                            "causal": causal,
                            "num_buckets": buckets,
                            "max_distance": distance,
                        },
                        arrays={"weights": table},
                        convention={"causal": causal},
                        doc=f"T5 relative bias, {kind}, 32 buckets, max_distance 128, "
                        + (
                            "weights[b, h] = b (the bias is the bucket)"
                            if what == "buckets"
                            else "seeded weights [32, 4]"
                        ),
                    )
                )
    return out


def _shaw() -> list[Case]:
    rng = np.random.default_rng(seed("shaw"))
    heads, d, k_max = 2, 8, 4
    qp = np.arange(6, dtype=np.int64)
    kp = np.arange(9, dtype=np.int64)
    table = representable(rng, (2 * k_max + 1, d))
    q = representable(rng, (heads, len(qp), d))
    probs = rng.integers(0, 9, size=(heads, len(qp), len(kp))).astype(np.float64) / 64
    logits = reference.shaw_relative_logits(q[None], table, qp, kp)[0]
    values = reference.shaw_relative_values(probs[None], table, qp, kp)[0]
    mag_logits = np.einsum("hid,jd->hij", np.abs(q), np.abs(table)).max() * np.ones((1, 1, 1))
    return [
        _bias(
            "shaw.logits.k4",
            "shaw",
            False,
            qp,
            kp,
            logits,
            parameters={},
            arrays={"q": q, "table": table},
            magnitude=mag_logits,
            doc="Shaw et al.: q_i . table[clip(j - i, -4, 4) + 4]; q [heads, m, d]",
        ),
        _bias(
            "shaw_values.values.k4",
            "shaw_values",
            False,
            qp,
            kp,
            values,
            parameters={},
            arrays={"probs": probs, "table": table},
            magnitude=np.einsum("hij,d->hid", probs, np.abs(table).max(axis=0)),
            doc="Shaw et al.: sum_j probs[h, i, j] table[clip(j - i) + 4]; output [heads, m, d]",
        ),
    ]


def _fire() -> list[Case]:
    rng = np.random.default_rng(seed("fire"))
    heads, width, c, threshold = 4, 8, 1.0, 512.0
    w1 = representable(rng, (width,), scale=32)
    b1 = representable(rng, (width,), scale=128)
    w2 = representable(rng, (heads, width), scale=64)
    b2 = representable(rng, (heads,), scale=64)
    out = []
    for far in (False, True):
        qp, kp = _pos(far)
        bias = reference.fire_bias(qp, kp, w1, b1, w2, b2, c=c, threshold=threshold)
        x = reference.fire_normalized_distance(qp, kp, c=c, threshold=threshold)
        terms = np.abs(b2)[:, None, None] + np.einsum(
            "hu,uij->hij",
            np.abs(w2),
            np.abs(w1)[:, None, None] * x[None] + np.abs(b1)[:, None, None],
        )
        out.append(
            _bias(
                "fire.mlp.h4",
                "fire",
                far,
                qp,
                kp,
                bias,
                parameters={"c": c, "threshold": threshold},
                arrays={"w1": w1, "b1": b1, "w2": w2, "b2": b2},
                magnitude=terms * 4.0,  # the logs of the normalised distance: a few units
                doc="FIRE: an MLP (8 hidden, ReLU) of log(c|i - j| + 1) / log(c max(L, i) + 1), "
                "c = 1, L = 512",
            )
        )
    return out


def _kerple() -> list[Case]:
    r1 = np.array([0.5, 1.0, 1.5, 2.0])
    r2 = np.array([0.25, 0.5, 1.0, 2.0])
    out = []
    for far in (False, True):
        qp, kp = _pos(far)
        bias = reference.kerple_bias(qp, kp, r1, r2)
        out.append(
            _bias(
                "kerple.log.h4",
                "kerple",
                far,
                qp,
                kp,
                bias,
                parameters={},
                arrays={"r1": r1, "r2": r2},
                magnitude=np.abs(bias) + r1[:, None, None],
                doc="KERPLE (logarithmic): -r1_h log(1 + r2_h |i - j|)",
            )
        )
    return out


def _contextual() -> list[Case]:
    rng = np.random.default_rng(seed("cope"))
    heads, n, d, npos = 2, 8, 8, 6
    q = representable(rng, (heads, n, d), scale=128)
    k = representable(rng, (heads, n, d), scale=128)
    weight = representable(rng, (npos, d), scale=128)
    pos = np.arange(n, dtype=np.int64)
    bias = reference.cope_bias(q[None], k[None], weight)[0]
    scale = 1.0 / np.sqrt(d)
    mag = scale * np.abs(q).sum(axis=-1).max() * np.abs(weight).max() * n * np.ones((1, 1, 1))
    log_forget = -np.abs(representable(rng, (heads, n), scale=64))
    fox = reference.fox_bias(log_forget[None], n)[0]
    fox_mag = np.cumsum(np.abs(log_forget[:, ::-1]), axis=1)[:, ::-1].max() * np.ones((1, 1, 1))
    return [
        _bias(
            "cope.scaled.h2",
            "cope",
            False,
            pos,
            pos,
            bias,
            parameters={"position_logit": "scaled", "causal": True},
            arrays={"q": q, "k": k, "weight": weight},
            magnitude=mag,
            doc="CoPE's bias (causal, scaled): gates sigmoid(q.k / sqrt(d)) counted from key to "
            "query, a position logit interpolated from weight [6, d]; q, k [heads, n, d]",
        ),
        _bias(
            "fox.bias.h2",
            "fox",
            False,
            pos,
            pos,
            fox,
            parameters={},
            arrays={"log_forget": log_forget},
            magnitude=fox_mag,
            doc="FoX's decay: sum of log_forget[h, l] for l = j+1 .. i, -inf for keys after "
            "the query; log_forget [heads, n]",
        ),
    ]


#: The position maps: (name, family, the reference's function, its parameters, doc).
_REMAPS = (
    (
        "self_extend.positions.g4w16",
        "self_extend",
        reference.self_extend_positions,
        {"group_size": 4, "neighbor_window": 16},
        "Self-Extend's per-pair positions [2, m, n] (query's, key's): offsets < 16 keep "
        "theirs, others i // 4 + 16 - 4 and j // 4",
    ),
    (
        "string.positions.s64w8",
        "string",
        reference.string_positions,
        {"shift": 64, "local_window": 8},
        "STRING's per-pair positions [2, m, n] (query's, key's): offsets < 64 keep theirs, "
        "others the query at i - 64 + 8",
    ),
)


def _remaps() -> list[Case]:
    out = []
    for far in (False, True):
        base = 1_000_000 if far else 0
        qp = base + np.array([0, 1, 5, 63, 64, 100, 257], dtype=np.int64)
        kp = base + np.array([0, 1, 2, 5, 31, 64, 100, 257], dtype=np.int64)
        for name, family, fn, parameters, doc in _REMAPS:
            sq, sk = fn(qp, kp, **parameters)
            out.append(
                _bias(
                    name,
                    family,
                    far,
                    qp,
                    kp,
                    np.stack([sq, sk]),
                    parameters=parameters,
                    doc=doc,
                )
            )
    return out


def build() -> list[Case]:
    """Every bias case, in a fixed order."""
    return _alibi() + _t5() + _shaw() + _fire() + _kerple() + _contextual() + _remaps()
