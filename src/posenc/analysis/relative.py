"""Relative structure of an encoding: is a shift one linear map, does similarity depend on
the offset alone, and how it decays with distance (see :mod:`posenc.analysis.properties`
for what each kind's vector is)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from posenc._base import Encoding
from posenc._errors import PosEncError, check_float, check_int, check_same_device, check_tensor
from posenc.analysis._encodings import (
    additive_table,
    bias_matrix,
    bias_profile,
    check_count,
    check_dtypes,
    inv_freq,
    resolve_encoding,
    resolve_positions,
    rotary_matrices,
)
from posenc.analysis._results import Result
from posenc.analysis.properties import EncodingSpec, Positions

__all__ = ["Decay", "ShiftStructure", "decay", "roformer_bound", "shift_structure"]


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
    check_dtypes(dtype)
    enc = resolve_encoding(encoding)
    pos = resolve_positions(positions, (0, 256), min_len=2)
    tol = check_float("tol", tol, min=0.0, max=1.0)
    n = pos.shape[0]
    if offsets is None:  # powers of two up to n / 4, so each fit has >= 3n/4 samples
        offsets = [2**i for i in range(n.bit_length()) if 2**i <= max(1, n // 4)]
    if not isinstance(offsets, (list, tuple, range)) or not offsets:
        raise PosEncError(f"offsets must be a non-empty sequence of integers, got {offsets!r}")
    ks = tuple(check_int("offsets", k, min=1, max=n - 1) for k in offsets)
    if enc.kind == "bias":
        measure = "bias(p + k, p) and bias(p, p + k) over p (per head)"
        spreads, residuals, determined = _bias_spreads(bias_matrix(enc, pos), ks), None, None
    else:
        measure, spreads, residuals, determined = _vector_shifts(enc, pos, ks, dtype)
    return ShiftStructure(
        encoding=enc.name,
        kind=enc.kind,
        measure=measure,
        offsets=ks,
        linear_map_residuals=residuals,
        linear_map_determined=determined,
        linear_map_holds=None if residuals is None else determined and max(residuals) <= tol,
        dot_spreads=spreads,
        dot_depends_only_on_offset=max(spreads) <= tol,
        tol=tol,
    )


def _bias_spreads(bias: torch.Tensor, ks: tuple[int, ...]) -> tuple[float, ...]:
    """Per offset ``k``: the largest spread of a head's bias along the diagonals ``+-k`` of
    ``bias`` ``[h, n, n]`` (masked entries left out), relative to its largest magnitude."""
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
    return tuple(spreads)


def _vector_shifts(
    enc: Encoding, pos: torch.Tensor, ks: tuple[int, ...], dtype: torch.dtype
) -> tuple[str, tuple[float, ...], tuple[float, ...], bool]:
    """``(measure, spreads, residuals, determined)`` of an additive or rotary encoding:
    per offset ``k`` the spread of the similarity along the diagonals ``+-k`` relative to
    the mean magnitude at offset 0, and the residual of the fitted shift map ``M_k``."""
    n = pos.shape[0]
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
    return measure, tuple(spreads), tuple(residuals), determined


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

    Shape: ``inv_freq [r/2]`` (floating), ``distances [m]`` (integer or floating) -> ``[m]``
    float64.

    Examples:
        >>> import torch
        >>> from posenc.analysis import roformer_bound
        >>> roformer_bound(torch.tensor([1.0, 0.5]), torch.tensor([0])).item()  # (1 + 2) / 2
        1.5
    """
    for name, t in (("inv_freq", inv_freq), ("distances", distances)):
        check_tensor(name, t)
        if t.dtype == torch.bool or t.is_complex() or t.ndim != 1:
            raise PosEncError(
                f"{name} must be a 1-D real tensor, got shape {tuple(t.shape)} and {t.dtype}"
            )
    if not inv_freq.is_floating_point():
        raise PosEncError(
            f"inv_freq must be a floating tensor (frequencies in radians per position), got "
            f"{inv_freq.dtype}"
        )
    check_same_device(("inv_freq", "distances"), inv_freq, distances)
    if inv_freq.numel() == 0:
        raise PosEncError("inv_freq must hold at least one frequency, got an empty tensor")
    if not bool(torch.isfinite(inv_freq).all()):
        raise PosEncError("inv_freq must be finite, got a tensor containing NaN or inf")
    if distances.is_floating_point() and not bool(torch.isfinite(distances).all()):
        raise PosEncError("distances must be finite, got a tensor containing NaN or inf")
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
    check_dtypes(dtype)
    enc = resolve_encoding(encoding)
    max_distance = check_count("max_distance", max_distance)
    anchors = check_count("anchors", anchors)
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
            b = roformer_bound(inv_freq(enc), dist)
            bound, bound_normalized = tuple(b.tolist()), tuple((b / b[0]).tolist())
            measure = "E[q.k] for q = k ~ N(0, I): query at p + k, key at p"
        else:
            table = additive_table(enc, pos, dtype=dtype)  # [n, d]
            sim = (table[query] * table[key][None]).sum(dim=-1).mean(dim=-1)
            measure = "PE(p + k) . PE(p)"
        if float(sim[0]) != 0.0:
            normalized = tuple((sim / sim[0]).tolist())
    return Decay(
        encoding=enc.name,
        kind=enc.kind,
        measure=measure,
        distances=tuple(dist.tolist()),
        similarity=tuple(sim.tolist()),
        normalized=normalized,
        per_head=per_head,
        bound=bound,
        bound_normalized=bound_normalized,
    )
