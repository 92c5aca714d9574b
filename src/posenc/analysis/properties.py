"""Measured properties of an encoding: boundedness and uniqueness here, shift structure and
decay in :mod:`posenc.analysis.relative`.

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
from posenc._errors import check_float, check_int
from posenc.analysis._encodings import (
    additive_table,
    bias_profile,
    check_dtypes,
    encoding_dim,
    resolve_encoding,
    resolve_positions,
    rms,
    rotary_matrices,
)
from posenc.analysis._results import Result

__all__ = ["Boundedness", "Collision", "Uniqueness", "boundedness", "uniqueness"]

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
) -> tuple[str, torch.Tensor]:
    """``(unit, vectors [n, D])`` of ``enc`` at ``positions`` (see the table above)."""
    if enc.kind == "rotary":
        rq, _ = rotary_matrices(enc, positions, dtype=dtype, position_dtype=position_dtype)
        return "position", rq.reshape(rq.shape[0], -1)  # [n, d*d]
    if enc.kind == "bias":
        return "distance", bias_profile(enc, positions).T.contiguous()  # [m, h]
    return "position", additive_table(enc, positions, dtype=dtype, position_dtype=position_dtype)


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
    check_dtypes(dtype)
    enc = resolve_encoding(encoding)
    pos = resolve_positions(positions, (0, 1024), min_len=2, nonnegative=enc.kind == "bias")
    unit, vectors = _vectors(enc, pos, dtype=dtype)
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
        encoding=enc.name,
        kind=enc.kind,
        unit=unit,
        measure=measure,
        positions=_values(pos),
        norms=tuple(norms.tolist()),
        reference_norm=reference_norm,
        reference=reference,
        swamp_ratio=swamp_ratio,
        max_norm=float(norms.max()),
        max_ratio=float(ratios.max()),
        first_swamping=float(pos[swamped[0]]) if swamped.numel() else None,
        growth=second / first if first > 0 else None,
        growth_rtol=growth_rtol,
        bounded=second <= first * (1 + growth_rtol) + 1e-12,
    )


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
    check_dtypes(dtype, position_dtype)
    enc = resolve_encoding(encoding)
    pos = resolve_positions(positions, (0, 512), min_len=2, nonnegative=enc.kind == "bias")
    rtol = check_float("rtol", rtol, min=0.0, max=1.0)
    max_examples = check_int("max_examples", max_examples, min=0)
    unit, vectors = _vectors(enc, pos, dtype=dtype, position_dtype=position_dtype)
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
        encoding=enc.name,
        kind=enc.kind,
        unit=unit,
        dtype=_dtype_name(dtype) or "",
        position_dtype=_dtype_name(position_dtype),
        num_positions=n,
        min_distance=float(dist[i, j]),
        closest_pair=(float(pos[i]), float(pos[j])),
        scale=scale,
        rtol=rtol,
        atol=atol,
        num_collisions=int(close.shape[0]),
        collisions=examples,
        unique=close.shape[0] == 0,
    )
