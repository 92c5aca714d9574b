"""Measured properties of an encoding: boundedness, uniqueness, shift structure and decay.

Each function takes an encoding (an instance, a registry name or a config dict; names are
built with :data:`posenc.analysis.DEFAULT_ARGS` for required arguments) and returns a
frozen dataclass of numbers with ``to_dict()``. What is measured per kind:

============  ==============================  ==================================  ==========
property      additive (and ``none``)         rotary                              bias
============  ==============================  ==================================  ==========
vector        table row ``PE(p)``             map ``R(p)`` on a query             ``b[:, q-k]``
norm          ``||PE(p)||`` vs a token         rms gain ``||R(p)||_F / sqrt(d)``   ``max_h |b|``
similarity    ``PE(p) . PE(p+k)``             ``E[q.k]``, ``q = k ~ N(0, I)``      the bias
============  ==============================  ==================================  ==========

(bias vectors are indexed by the distance ``q - k`` of a key behind its query, not by an
absolute position: a relative bias has nothing else to measure.)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from posenc._base import Encoding
from posenc._errors import PosEncError, check_float, check_int
from posenc.analysis._encodings import (
    additive_table,
    bias_matrix,
    bias_profile,
    encoding_dim,
    resolve_encoding,
    resolve_positions,
    rms,
    rotary_matrices,
)
from posenc.analysis._results import Result

__all__ = [
    "Boundedness",
    "Decay",
    "ShiftStructure",
    "Uniqueness",
    "boundedness",
    "decay",
    "roformer_bound",
    "shift_structure",
    "uniqueness",
]

EncodingSpec = str | Mapping[str, Any] | Encoding
Positions = int | tuple[int, int] | Sequence[float] | torch.Tensor | None

# Above this many times its reference norm, a position "swamps" the token (additive, bias)
# or rescales the query (rotary: a rotation keeps norms, a gain of 2 does not).
SWAMP_RATIO = {"additive": 1.0, "none": 1.0, "rotary": 2.0, "bias": 1.0}


def _vectors(
    enc: Encoding,
    positions: torch.Tensor,
    *,
    dtype: torch.dtype,
    position_dtype: torch.dtype | None = None,
) -> tuple[str, torch.Tensor, torch.Tensor | None]:
    """``(unit, vectors [n, D], maps [n, d, c] or None)`` of ``enc`` at ``positions``."""
    if enc.kind == "rotary":
        rq, _ = rotary_matrices(enc, positions, dtype=dtype, position_dtype=position_dtype)
        return "position", rq.reshape(rq.shape[0], -1), rq  # [n, d*d], [n, d, d]
    if enc.kind == "bias":
        profile = bias_profile(enc, positions)  # [h, m]
        return "distance", profile.T.contiguous(), None
    table = additive_table(enc, positions, dtype=dtype, position_dtype=position_dtype)
    return "position", table, table[:, :, None]  # [n, d], [n, d, 1]


def _values(positions: torch.Tensor) -> tuple[float, ...]:
    return tuple(float(p) for p in positions.tolist())


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


# --- boundedness ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Boundedness(Result):
    """Norm of the encoding per position (or distance) against a reference norm.

    ``bounded`` is measured on the range: the largest norm over its second half is at most
    ``1 + growth_rtol`` times the largest over its first half (a growing norm is not).
    ``first_swamping`` is the first position whose norm exceeds ``swamp_ratio`` times the
    reference (``None``: never in the range).
    """

    encoding: str
    kind: str
    unit: str
    measure: str
    positions: tuple[float, ...]
    norms: tuple[float, ...]
    reference_norm: float
    reference: str
    swamp_ratio: float
    max_norm: float
    max_ratio: float
    first_swamping: float | None
    growth: float | None
    growth_rtol: float
    bounded: bool


def boundedness(
    encoding: EncodingSpec,
    positions: Positions = None,
    *,
    token_norm: float | None = None,
    swamp_ratio: float | None = None,
    growth_rtol: float = 0.1,
    dtype: torch.dtype = torch.float32,
) -> Boundedness:
    """How large the encoding gets per position, against the token it is added to.

    Args:
        encoding: an encoding module, registry name or config dict.
        positions: a count ``n``, a ``(start, stop)`` range or explicit positions
            (default ``0..1023``); for bias encodings, distances ``q - k >= 0``.
        token_norm: the reference of additive encodings (default ``sqrt(dim)``, the
            expected norm of an ``N(0, 1)`` token embedding as ``nn.Embedding``
            initialises it). Rotary gains are compared with 1 (a pure rotation) and biases
            with 1 (the standard deviation of scaled logits ``q.k / sqrt(d)`` for
            unit-variance ``q``, ``k``).
        swamp_ratio: the ratio above which a position swamps the token (default 1;
            rotary 2).
        growth_rtol: tolerance of the ``bounded`` test: the largest norm over the second
            half of the range may exceed the largest over the first half by this fraction
            (random tables fluctuate; a norm growing like ``log p`` still exceeds 10% over
            ranges up to ~1000).
        dtype: dtype the encoding is evaluated in.

    Examples:
        >>> from posenc.analysis import boundedness
        >>> r = boundedness("index", positions=200)  # ||PE(p)|| = p * sqrt(dim)
        >>> r.bounded, r.first_swamping  # above a token's sqrt(dim) from p = 2 on
        (False, 2.0)
        >>> boundedness("sinusoidal").bounded
        True
    """
    enc = resolve_encoding(encoding)
    pos = resolve_positions(positions, (0, 1024), min_len=2, nonnegative=enc.kind == "bias")
    unit, vectors, _ = _vectors(enc, pos, dtype=dtype)
    d = encoding_dim(enc)
    if enc.kind == "rotary":
        norms = vectors.norm(dim=-1) / math.sqrt(d)
        measure, reference_norm = "rms gain ||R(p)||_F / sqrt(head_dim) of a query", 1.0
        reference = "1 (a rotation keeps a query's norm)"
    elif enc.kind == "bias":
        norms = vectors.abs().amax(dim=-1)
        measure, reference_norm = "max over heads of |bias|", 1.0
        reference = "1 (std of scaled logits q.k/sqrt(d) for unit-variance q, k)"
    else:
        norms = vectors.norm(dim=-1)
        measure = "||PE(p)||"
        if token_norm is None:
            reference_norm = math.sqrt(d)
            reference = f"sqrt(dim) = {reference_norm:.4g} (an N(0, 1) token embedding)"
        else:
            reference_norm = check_float("token_norm", token_norm, min=0.0, min_exclusive=True)
            reference = f"token_norm = {reference_norm:.4g}"
    if swamp_ratio is None:
        swamp_ratio = SWAMP_RATIO[enc.kind]
    swamp_ratio = check_float("swamp_ratio", swamp_ratio, min=0.0, min_exclusive=True)
    growth_rtol = check_float("growth_rtol", growth_rtol, min=0.0)
    half = pos.shape[0] // 2
    first, second = float(norms[:half].max()), float(norms[half:].max())
    ratios = norms / reference_norm
    swamped = torch.nonzero(ratios > swamp_ratio).flatten()
    return Boundedness(
        encoding=enc.name, kind=enc.kind, unit=unit, measure=measure,
        positions=_values(pos), norms=tuple(norms.tolist()),
        reference_norm=reference_norm, reference=reference, swamp_ratio=swamp_ratio,
        max_norm=float(norms.max()), max_ratio=float(ratios.max()),
        first_swamping=float(pos[swamped[0]]) if swamped.numel() else None,
        growth=second / first if first > 0 else None, growth_rtol=growth_rtol,
        bounded=second <= first * (1 + growth_rtol) + 1e-12,
    )  # fmt: skip


# --- uniqueness ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Collision(Result):
    """Two positions (or distances) whose encodings are within ``atol`` of each other."""

    a: float
    b: float
    distance: float


@dataclasses.dataclass(frozen=True)
class Uniqueness(Result):
    """The smallest distance between the encodings of two distinct positions.

    Pairs closer than ``atol = rtol * scale`` (``scale``: the rms norm of the encodings)
    are collisions; ``collisions`` lists the closest ``max_examples`` of them.
    """

    encoding: str
    kind: str
    unit: str
    dtype: str
    position_dtype: str | None
    num_positions: int
    min_distance: float
    closest_pair: tuple[float, float]
    scale: float
    rtol: float
    atol: float
    num_collisions: int
    collisions: tuple[Collision, ...]
    unique: bool


def uniqueness(
    encoding: EncodingSpec,
    positions: Positions = None,
    *,
    dtype: torch.dtype = torch.float32,
    position_dtype: torch.dtype | None = None,
    rtol: float = 1e-4,
    max_examples: int = 10,
) -> Uniqueness:
    """Whether distinct positions get distinct encodings, with the collisions found.

    Args:
        encoding: an encoding module, registry name or config dict.
        positions: a count, a ``(start, stop)`` range or explicit (float) positions
            (default ``0..511``); bias encodings: distances ``>= 0``.
        dtype: dtype the encoding is evaluated (stored) in.
        position_dtype: round the positions to this dtype first, as a model that holds
            positions in bf16 does (bf16 has 8 significant bits: 257 becomes 256).
        rtol: collision tolerance relative to the encodings' rms norm.
        max_examples: how many collisions to list.

    Examples:
        >>> import math, torch
        >>> from posenc.analysis import uniqueness
        >>> one_frequency = {"name": "sinusoidal", "dim": 2}  # (sin p, cos p): period 2 pi
        >>> uniqueness(one_frequency, torch.tensor([0.0, 1.0, 2 * math.pi])).num_collisions
        1
        >>> uniqueness("sinusoidal", 1024, position_dtype=torch.bfloat16).unique
        False
    """
    enc = resolve_encoding(encoding)
    pos = resolve_positions(positions, (0, 512), min_len=2, nonnegative=enc.kind == "bias")
    rtol = check_float("rtol", rtol, min=0.0)
    max_examples = check_int("max_examples", max_examples, min=0)
    unit, vectors, _ = _vectors(enc, pos, dtype=dtype, position_dtype=position_dtype)
    keep = vectors.abs().amax(dim=0) > 0  # coordinates zero everywhere change no distance
    vectors = vectors[:, keep] if bool(keep.any()) else vectors[:, :1]
    scale = rms(vectors)
    atol = rtol * scale
    n = pos.shape[0]
    dist = torch.cdist(
        vectors, vectors, compute_mode="donot_use_mm_for_euclid_dist"
    )  # [n, n], exact 0 for equal rows
    upper = torch.ones(n, n, dtype=torch.bool).triu(1)
    pair_dist = dist.masked_fill(~upper, math.inf)
    flat = int(pair_dist.argmin())
    i, j = divmod(flat, n)
    close = torch.nonzero(upper & (dist <= atol))  # [c, 2]
    order = dist[close[:, 0], close[:, 1]].argsort()[:max_examples]
    examples = tuple(
        Collision(a=float(pos[a]), b=float(pos[b]), distance=float(dist[a, b]))
        for a, b in close[order].tolist()
    )
    return Uniqueness(
        encoding=enc.name, kind=enc.kind, unit=unit, dtype=_dtype_name(dtype) or "",
        position_dtype=_dtype_name(position_dtype), num_positions=n,
        min_distance=float(dist[i, j]), closest_pair=(float(pos[i]), float(pos[j])),
        scale=scale, rtol=rtol, atol=atol, num_collisions=int(close.shape[0]),
        collisions=examples, unique=close.shape[0] == 0,
    )  # fmt: skip


# --- shift structure -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ShiftStructure(Result):
    """Is a shift by ``k`` one linear map, and does similarity depend only on ``k``?

    ``linear_map_residuals[i]``: relative residual ``||PE(p+k) - M_k PE(p)|| / ||PE(p+k)||``
    of the least-squares ``M_k`` over the range, for ``k = offsets[i]`` (``None`` for bias
    encodings, which have no per-position vector). ``linear_map_determined`` is False when
    there were no more samples than unknowns (any table then fits exactly).
    ``dot_spreads[i]``: ``max - min`` over ``p`` of the similarity of a query at ``p + k``
    and a key at ``p`` (and of the query at ``p``, the key at ``p + k``), relative to the
    mean similarity magnitude at offset 0 (bias encodings: of the bias itself, relative to
    its largest magnitude). Rotary maps ``R(p)`` are ``d x d`` and ``M_k`` acts on them
    from the left.
    """

    encoding: str
    kind: str
    measure: str
    offsets: tuple[int, ...]
    linear_map_residuals: tuple[float, ...] | None
    linear_map_determined: bool | None
    linear_map_holds: bool | None
    dot_spreads: tuple[float, ...]
    dot_depends_only_on_offset: bool
    tol: float


def _fit_shift(columns: torch.Tensor, k: int) -> tuple[float, bool]:
    """Relative residual of the least-squares ``M`` with ``PE(p + k) ~ M PE(p)``.

    ``columns`` ``[d, n, c]`` holds the ``c`` columns of each position's ``[d, c]`` map.
    """
    d, n, _ = columns.shape
    a = columns[:, : n - k].reshape(d, -1)  # [d, m*c] columns of PE(p) (a view)
    b = columns[:, k:].reshape(d, -1)  # [d, m*c] columns of PE(p + k)
    gram = a @ a.T  # [d, d]
    eig = torch.linalg.eigvalsh(gram)
    if a.shape[1] >= 4 * d and eig[0] > 1e-8 * eig[-1]:
        # Well conditioned and tall (rotary maps: a sum of rotations): the normal equations
        # lose at most cond**2 * eps <= 1e-8 * eps and cost one [d, d] solve.
        m_t = torch.linalg.solve(gram, a @ b.T)  # [d, d] = M^T
    else:
        m_t = torch.linalg.lstsq(a.T, b.T, driver="gelsy").solution
    residual = b - m_t.T @ a
    denom = float(b.norm())
    return (float(residual.norm()) / denom if denom > 0 else 0.0), a.shape[1] > d


def shift_structure(
    encoding: EncodingSpec,
    positions: Positions = None,
    *,
    offsets: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
    tol: float = 1e-4,
) -> ShiftStructure:
    """Fit ``PE(p + k) = M_k PE(p)`` by least squares and test whether the similarity of
    ``p`` and ``p + k`` depends on ``k`` alone.

    Args:
        encoding: an encoding module, registry name or config dict.
        positions: the range of ``p`` (default ``0..255``).
        offsets: the shifts ``k`` (``1 <= k < n``; default powers of two up to ``n / 4``).
        dtype: dtype the encoding is evaluated in.
        tol: residual / spread under which a property holds.

    Examples:
        >>> from posenc.analysis import shift_structure
        >>> s = shift_structure("sinusoidal")
        >>> s.linear_map_holds, s.dot_depends_only_on_offset
        (True, True)
        >>> shift_structure("index").linear_map_holds
        False
    """
    enc = resolve_encoding(encoding)
    pos = resolve_positions(positions, (0, 256), min_len=2)
    tol = check_float("tol", tol, min=0.0)
    n = pos.shape[0]
    if offsets is None:  # powers of two up to n / 4, so each fit has >= 3n/4 samples
        offsets = [2**i for i in range(n.bit_length()) if 2**i <= max(1, n // 4)]
    if isinstance(offsets, (str, bytes)) or not offsets:
        raise PosEncError(f"offsets must be a non-empty sequence of integers, got {offsets!r}")
    ks = tuple(check_int("offsets", k, min=1, max=n - 1) for k in offsets)
    if enc.kind == "bias":
        bias = bias_matrix(enc, pos)  # [h, n, n]
        finite = bias[torch.isfinite(bias)]
        top = float(finite.abs().max()) if finite.numel() else 0.0
        spreads = []
        for k in ks:
            worst = 0.0
            for diag in (bias.diagonal(-k, 1, 2), bias.diagonal(k, 1, 2)):  # [h, n-k]
                for row in diag:
                    row = row[torch.isfinite(row)]
                    if row.numel():
                        worst = max(worst, float(row.max() - row.min()))
            spreads.append(worst / top if top > 0 else 0.0)
        return ShiftStructure(
            encoding=enc.name, kind=enc.kind,
            measure="bias(p + k, p) and bias(p, p + k) over p (per head)", offsets=ks,
            linear_map_residuals=None, linear_map_determined=None, linear_map_holds=None,
            dot_spreads=tuple(spreads), dot_depends_only_on_offset=max(spreads) <= tol, tol=tol,
        )  # fmt: skip
    if enc.kind == "rotary":
        rq, rk = rotary_matrices(enc, pos, dtype=dtype)  # [n, d, d]
        maps, keys = rq, rk.reshape(n, -1)
        measure = "<R_q(p + k), R_k(p)>_F = E[q.k] for q = k ~ N(0, I), both directions"
    else:
        maps = additive_table(enc, pos, dtype=dtype)[:, :, None]  # [n, d, 1]
        keys = maps[:, :, 0]
        measure = "PE(p) . PE(p + k)"
    queries = maps.reshape(n, -1)
    gram = queries @ keys.T  # [n, n]: query p against key p'
    scale2 = float((queries * keys).sum(-1).abs().mean())
    columns = maps.permute(1, 0, 2).contiguous()  # [d, n, c]
    spreads, residuals, determined = [], [], True
    for k in ks:
        worst = 0.0
        for diag in (gram.diagonal(-k), gram.diagonal(k)):  # query k after / before the key
            worst = max(worst, float(diag.max() - diag.min()))
        spreads.append(worst / scale2 if scale2 > 0 else 0.0)
        residual, enough = _fit_shift(columns, k)
        residuals.append(residual)
        determined = determined and enough
    return ShiftStructure(
        encoding=enc.name, kind=enc.kind, measure=measure, offsets=ks,
        linear_map_residuals=tuple(residuals), linear_map_determined=determined,
        linear_map_holds=determined and max(residuals) <= tol,
        dot_spreads=tuple(spreads), dot_depends_only_on_offset=max(spreads) <= tol, tol=tol,
    )  # fmt: skip


# --- decay ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Decay(Result):
    """Similarity against distance ``k`` (the query ``k`` positions after the key).

    ``similarity``: additive, ``PE(p + k) . PE(p)``; rotary, ``E[q.k]`` for one random
    ``q = k ~ N(0, I)`` rotated to ``p + k`` and ``p``; both averaged over ``anchors``
    values of ``p``. Bias: the mean over heads of the bias, ``per_head`` each head.
    ``normalized``: ``similarity / similarity[0]`` (``None`` for bias or a zero start).
    ``bound``: rotary only, RoFormer's relative upper bound ``(1/(r/2)) sum_j |S_j(k)|``,
    ``S_j(k) = sum_{i<j} exp(i k theta_i)`` (Su et al., 2021, section 3.4.3).
    """

    encoding: str
    kind: str
    measure: str
    distances: tuple[int, ...]
    similarity: tuple[float, ...]
    normalized: tuple[float, ...] | None
    per_head: tuple[tuple[float, ...], ...] | None
    bound: tuple[float, ...] | None
    bound_normalized: tuple[float, ...] | None


def roformer_bound(inv_freq: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """RoFormer's long-term decay bound ``(1/(r/2)) sum_{j=1}^{r/2} |sum_{i<j} e^{i k theta_i}|``.

    Shape: ``inv_freq [r/2]``, ``distances [m]`` -> ``[m]`` float64.

    Examples:
        >>> import torch
        >>> from posenc.analysis import roformer_bound
        >>> roformer_bound(torch.tensor([1.0, 0.5]), torch.tensor([0])).item()  # (1 + 2) / 2
        1.5
    """
    theta = distances.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    s = torch.cumsum(torch.polar(torch.ones_like(theta), theta), dim=-1)  # [m, r/2]: S_1..S_r/2
    return s.abs().mean(dim=-1)


def decay(
    encoding: EncodingSpec,
    max_distance: int = 256,
    *,
    anchors: int = 8,
    dtype: torch.dtype = torch.float32,
) -> Decay:
    """How similarity (or the bias) falls with the distance between query and key.

    Args:
        encoding: an encoding module, registry name or config dict.
        max_distance: distances ``0..max_distance``.
        anchors: the similarity is averaged over key positions ``0..anchors-1``.
        dtype: dtype the encoding is evaluated in.

    Examples:
        >>> from posenc.analysis import decay
        >>> d = decay("sinusoidal", 4, anchors=1)  # sum_i cos(k w_i) / (dim / 2)
        >>> [round(v, 3) for v in d.normalized]
        [1.0, 0.966, 0.884, 0.8, 0.748]
    """
    enc = resolve_encoding(encoding)
    max_distance = check_int("max_distance", max_distance, min=1)
    anchors = check_int("anchors", anchors, min=1)
    dist = torch.arange(max_distance + 1)
    per_head = bound = bound_normalized = normalized = None
    if enc.kind == "bias":
        profile = bias_profile(enc, dist)  # [h, m]
        sim = profile.mean(dim=0)
        per_head = tuple(tuple(row) for row in profile.tolist())
        measure = "bias added to the logit of a key k positions behind the query"
    else:
        pos = torch.arange(anchors + max_distance)
        key = torch.arange(anchors)  # [a] key positions p
        query = key[None, :] + dist[:, None]  # [m, a] query positions p + k
        if enc.kind == "rotary":
            rq, rk = rotary_matrices(enc, pos, dtype=dtype)  # [n, d, d]
            # E[(R_q x) . (R_k x)] = trace(R_q^T R_k) for x ~ N(0, I)
            sim = (rq[query] * rk[key][None]).sum(dim=(-1, -2)).mean(dim=-1)
            b = roformer_bound(enc.inv_freq, dist)
            bound, bound_normalized = tuple(b.tolist()), tuple((b / b[0]).tolist())
            measure = "E[q.k] for q = k ~ N(0, I): query at p + k, key at p"
        else:
            table = additive_table(enc, pos, dtype=dtype)  # [n, d]
            sim = (table[query] * table[key][None]).sum(dim=-1).mean(dim=-1)
            measure = "PE(p + k) . PE(p)"
        if float(sim[0]) != 0.0:
            normalized = tuple((sim / sim[0]).tolist())
    return Decay(
        encoding=enc.name, kind=enc.kind, measure=measure, distances=tuple(dist.tolist()),
        similarity=tuple(sim.tolist()), normalized=normalized, per_head=per_head,
        bound=bound, bound_normalized=bound_normalized,
    )  # fmt: skip
