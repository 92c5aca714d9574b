"""CoPE (Golovneva et al., 2024, "Contextual Position Encoding"): positions counted by gates.

A query decides which keys count as a step: each key ``j`` it may attend gets a gate
``g_ij = sigmoid(q_i . k_j * scale)`` (``scale = 1 / sqrt(d)``; 0 on the pairs it may not
attend), and the key's position seen from query ``i`` is the number of counted keys
from ``j`` up to the query, ``p_ij = sum_{t >= j} g_it``, clamped to ``npos_max - 1``.
Positions are fractional, so the position logit interpolates a learned table
``e [npos_max, d]`` (one for every head) between its integer neighbours:
``z_ij = (1 - w) q_i . e[floor p] + w q_i . e[ceil p]`` with ``w = p - floor p``.

The paper's released code adds ``z`` to ``q . k`` *before* the ``1 / sqrt(d)`` scaling
(``position_logit="scaled"``, the default: the term added to the scaled logits is
``z * scale``); its ``--cope-nodiv`` adds it after (``position_logit="unscaled"``: ``z``).
The table starts at zero, as there, so an untrained CoPE adds nothing. With every gate 1,
``p_ij = i - j + 1``: CoPE is then a learned relative encoding counting tokens; with
gates that open only on, say, sentence ends it counts sentences.

Where the paper's code differs from the formula above only in how it is computed, posenc
computes the same numbers: the gates reuse the attention logits, and ``ceil p`` is
``min(floor p + 1, npos_max - 1)`` (equal wherever its weight ``w`` is not 0).

Shapes: ``q [b, h, q, d]``, ``k [b, h_kv, k, d]`` -> bias ``[b, h, q, k]``, added to the
scaled logits ``q k^T * scale``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import nn

from posenc._base import ContextualEncoding
from posenc._errors import (
    PosEncError,
    check_alloc,
    check_bool,
    check_choice,
    check_factory,
    check_float,
    check_int,
    check_tensor,
    tracing,
)
from posenc.contextual import cope_fused
from posenc.positions import causal_pairs

__all__ = ["POSITION_LOGITS", "CoPEBias", "cope_bias", "cope_position_logits", "cope_positions"]

#: Where the position logit joins the attention logits: ``"scaled"`` (before the
#: ``1 / sqrt(d)`` scaling, the paper's default) or ``"unscaled"`` (after: ``--cope-nodiv``).
POSITION_LOGITS = ("scaled", "unscaled")


# --- the formula, on validated tensors -------------------------------------------------


def _positions_from_logits(
    logits: torch.Tensor, allowed: torch.Tensor | None, npos_max: int | None
) -> torch.Tensor:
    """``p_ij = sum_{t >= j} sigmoid(logits_it)`` over allowed pairs, clamped: ``[b, h, q, k]``."""
    gates = torch.sigmoid(logits)
    if allowed is not None:  # a filled 0, not a product: a NaN key stays out of the rows
        gates = gates.masked_fill(~allowed, 0.0)  # that may not see it (NaN * 0 is NaN)
    positions = gates.flip(-1).cumsum(-1).flip(-1)  # counted from j to the last key
    return positions if npos_max is None else positions.clamp(max=npos_max - 1)


def _position_logits(
    q: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """:func:`cope_position_logits` of checked tensors. A NaN position (from NaN logits)
    gives a NaN logit: it is read at index 0 and its weight ``w = p - floor p`` is NaN."""
    npos = weight.shape[0]
    fixed = q @ weight.to(q.dtype).T  # [b, h, q, npos]: q . e[p] at every integer p
    lo = torch.nan_to_num(positions.detach(), nan=0.0).floor()
    frac = positions - lo  # differentiable in the gates, as in the paper's code
    lo_index = lo.long()
    hi_index = (lo_index + 1).clamp(max=npos - 1)
    z_lo = fixed.gather(-1, lo_index)
    z_hi = fixed.gather(-1, hi_index)
    return z_lo + frac * (z_hi - z_lo)


def cope_position_logits(
    q: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """CoPE's position logits ``z_ij = q_i . e[p_ij]``, interpolated between ``floor p`` and
    ``floor p + 1``, for contextual positions already computed (:func:`cope_positions`).

    Args:
        q: queries ``[.., q, d]``, floating.
        weight: the position table ``[npos_max, d]``, on ``q``'s device.
        positions: ``[.., q, k]`` (the leading dims of ``q``), floating, finite, in
            ``[0, npos_max - 1]`` (checked: one host synchronisation).

    Shape:
        ``q [.., q, d]``, ``weight [npos_max, d]``, ``positions [.., q, k]`` -> ``[.., q, k]``
        in the dtype of ``q`` and ``weight`` promoted.

    Examples:
        >>> import torch
        >>> from posenc.contextual import cope_position_logits
        >>> q, table = torch.ones(1, 1, 1, 2), torch.tensor([[0.0, 0.0], [1.0, 1.0]])
        >>> cope_position_logits(q, table, torch.tensor([[[[0.0, 0.25, 1.0]]]]))
        tensor([[[[0.0000, 0.5000, 2.0000]]]])
    """
    check_tensor("q", q, floating=True)
    if q.ndim < 2 or 0 in q.shape:
        raise PosEncError(f"q must be a non-empty [.., q, d] tensor, got shape {tuple(q.shape)}")
    _check_weight(weight, q)
    check_tensor("positions", positions, floating=True)
    want = (*q.shape[:-1], "k")
    if positions.ndim != q.ndim or tuple(positions.shape[:-1]) != tuple(q.shape[:-1]):
        raise PosEncError(
            f"positions must be [{', '.join(map(str, want))}] (the leading dims of q), got "
            f"shape {tuple(positions.shape)}"
        )
    if positions.device != q.device:
        raise PosEncError(f"positions must be on {q.device} (that of q), got {positions.device}")
    if positions.shape[-1] == 0:
        raise PosEncError(f"positions must hold >= 1 key, got shape {tuple(positions.shape)}")
    top = weight.shape[0] - 1
    if q.device.type != "meta" and not tracing():
        ok = bool(((positions >= 0) & (positions <= top)).all())  # NaN fails both
        if not ok:
            raise PosEncError(
                f"positions must be finite and in [0, {top}] (npos_max - 1 = weight.shape[0] "
                f"- 1), got values in [{positions.min().item()}, {positions.max().item()}]"
            )
    compute = torch.promote_types(torch.promote_types(q.dtype, weight.dtype), positions.dtype)
    return _position_logits(q.to(compute), weight.to(compute), positions.to(compute))


def _bias(
    logits: torch.Tensor,
    q: torch.Tensor,
    weight: torch.Tensor,
    allowed: torch.Tensor | None,
    scale: float,
    position_logit: str,
) -> torch.Tensor:
    positions = _positions_from_logits(logits, allowed, weight.shape[0])
    z = _position_logits(q, weight, positions)
    return z * scale if position_logit == "scaled" else z


# --- public functions --------------------------------------------------------------------


def _check_qk(q: Any, k: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [b, h, q, d]`` and ``k [b, h_kv, k, d]`` (``h_kv`` dividing ``h``), ``k`` repeated
    to ``h`` heads."""
    for name, t in (("q", q), ("k", k)):
        check_tensor(name, t, floating=True)
        if t.ndim != 4 or 0 in t.shape:
            raise PosEncError(
                f"{name} must be a non-empty [b, h, s, d], got shape {tuple(t.shape)}"
            )
    if q.dtype != k.dtype or q.device != k.device:
        raise PosEncError(
            f"q and k must share one dtype and device, got {q.dtype} on {q.device} and "
            f"{k.dtype} on {k.device}"
        )
    if k.shape[0] != q.shape[0] or k.shape[-1] != q.shape[-1] or q.shape[1] % k.shape[1]:
        raise PosEncError(
            "k must be [b, h_kv, k, d] with the batch and head dim of q and h_kv dividing its "
            f"heads, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    return q, k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)


def _check_weight(weight: Any, q: torch.Tensor) -> None:
    """The table ``[npos_max, d]`` (``d`` the head dim of ``q``), floating, on ``q``'s device."""
    check_tensor("weight", weight, floating=True)
    d = q.shape[-1]
    if weight.ndim != 2 or weight.shape[1] != d or weight.shape[0] < 1:
        raise PosEncError(
            f"weight must be [npos_max, {d}] (the head dim of q), got {tuple(weight.shape)}"
        )
    if weight.device != q.device:
        raise PosEncError(f"weight must be on {q.device} (that of q), got {weight.device}")


def _check_result(out: torch.Tensor, tensors: dict[str, torch.Tensor], scale: float) -> None:
    """Raise when finite ``tensors`` (q, k, the table) gave a non-finite ``out``: the logits
    ``q k^T * scale`` (or the term ``z * scale``) overflowed. Non-finite input passes its
    NaN on. One host synchronisation; none on the meta device or under ``torch.compile``."""
    if out.device.type == "meta" or tracing() or bool(torch.isfinite(out).all()):
        return
    if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
        return  # NaN or inf in, NaN out
    names = ", ".join(tensors)
    raise PosEncError(
        f"scale={scale:g} makes CoPE's logits q k^T * scale (or its term) overflow "
        f"{out.dtype} for these {names}: use a smaller scale (or smaller q and k), got "
        f"|q| <= {tensors['q'].abs().max().item():.3g}, |k| <= "
        f"{tensors['k'].abs().max().item():.3g}"
    )


def _allowed(
    attn_mask: Any, causal: bool, b: int, q_len: int, k_len: int, device: torch.device
) -> torch.Tensor | None:
    """The pairs that may attend, ``[b|1, 1, q|1, k]`` bool (None: all)."""
    causal = check_bool("causal", causal)
    if causal and q_len > k_len:
        raise PosEncError(
            f"causal needs q_len <= k_len (the queries are the last keys), got {q_len} > {k_len}"
        )
    allowed = None
    if attn_mask is not None:
        check_tensor("attn_mask", attn_mask)
        if attn_mask.dtype != torch.bool or tuple(attn_mask.shape) != (b, k_len):
            raise PosEncError(
                f"attn_mask must be a bool key padding mask [b, k] = [{b}, {k_len}] (True = "
                f"real token), got {attn_mask.dtype} of shape {tuple(attn_mask.shape)}"
            )
        if attn_mask.device.type == "meta" and device.type != "meta":
            raise PosEncError("attn_mask must hold values, got a tensor on the meta device")
        allowed = attn_mask.to(device)[:, None, None, :]
    if causal:
        tri = causal_pairs(q_len, k_len, device=device)
        allowed = tri if allowed is None else allowed & tri
    return allowed


def _scale(scale: Any, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    return check_float("scale", scale, min=0.0, min_exclusive=True)


def cope_positions(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    npos_max: int | None = None,
    scale: float | None = None,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """CoPE's contextual positions ``p_ij = sum_{t >= j} sigmoid(q_i . k_t * scale)`` over
    the keys query ``i`` may attend (0 elsewhere), clamped to ``npos_max - 1`` when given.

    Args:
        q, k: queries ``[b, h, q, d]``, keys ``[b, h_kv, k, d]`` (``h_kv`` divides ``h``).
        npos_max: the number of positions of the table (None: no clamp).
        scale: the logits' scale, default ``1 / sqrt(d)``.
        causal: query ``i`` sees keys ``j <= i + (k - q)`` (the queries are the last keys).
        attn_mask: bool key padding ``[b, k]`` (True = real token).

    Shape:
        ``[b, h, q, k]`` in the dtype of ``q`` (float32 or wider).

    Raises:
        PosEncError: when finite ``q`` and ``k`` give non-finite positions (the logits
            ``q k^T * scale`` overflow: ``scale`` too large for them); a NaN in ``q`` or
            ``k`` gives NaN positions. One host synchronisation.

    Examples:
        >>> import torch
        >>> from posenc.contextual import cope_positions
        >>> q, k = torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4)  # every gate 0.5
        >>> cope_positions(q, k)[0, 0]
        tensor([[0.5000, 0.0000, 0.0000],
                [1.0000, 0.5000, 0.0000],
                [1.5000, 1.0000, 0.5000]])
    """
    q, k = _check_qk(q, k)
    b, h, q_len, d = q.shape
    if npos_max is not None:
        npos_max = check_int("npos_max", npos_max, min=1)
    check_alloc("q, k", (tuple(q.shape), tuple(k.shape)), (b, h, q_len, k.shape[2]))
    allowed = _allowed(attn_mask, causal, b, q_len, k.shape[2], q.device)
    compute = torch.promote_types(q.dtype, torch.float32)
    logits = (q.to(compute) * _scale(scale, d)) @ k.to(compute).transpose(-1, -2)
    positions = _positions_from_logits(logits, allowed, npos_max)
    _check_result(positions, {"q": q, "k": k}, _scale(scale, d))
    return positions if allowed is None else positions.masked_fill(~allowed, 0.0)


def cope_bias(
    q: torch.Tensor,
    k: torch.Tensor,
    weight: torch.Tensor,
    *,
    position_logit: str = "scaled",
    scale: float | None = None,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """CoPE's term added to the scaled logits ``q k^T * scale``: ``z * scale``
    (``position_logit="scaled"``) or ``z`` (``"unscaled"``), where ``z_ij`` interpolates
    ``q_i . weight[p]`` at the contextual position ``p_ij`` (:func:`cope_positions`,
    clamped to ``npos_max - 1 = weight.shape[0] - 1``).

    Args:
        q, k: queries ``[b, h, q, d]``, keys ``[b, h_kv, k, d]``.
        weight: the position table ``[npos_max, d]``, shared by the heads.
        position_logit: ``"scaled"`` or ``"unscaled"`` (see the module docs).
        scale, causal, attn_mask: as in :func:`cope_positions`.

    Shape:
        ``[b, h, q, k]`` in float32 (or float64 for float64 inputs); 0 on the pairs a query
        may not attend.

    Raises:
        PosEncError: when finite ``q``, ``k`` and ``weight`` give a non-finite term (the
            logits ``q k^T * scale`` or the term ``z * scale`` overflow: ``scale`` too large
            for them); a NaN in them gives NaN. ``attn_mask`` on the meta device (no values)
            is refused (meta ``q`` and ``k`` give a meta result). One host synchronisation.
    """
    q, k = _check_qk(q, k)
    check_choice("position_logit", position_logit, POSITION_LOGITS)
    _check_weight(weight, q)
    d = q.shape[-1]
    b, h, q_len, _ = q.shape
    check_alloc("q, k", (tuple(q.shape), tuple(k.shape)), (b, h, q_len, k.shape[2]))
    allowed = _allowed(attn_mask, causal, b, q_len, k.shape[2], q.device)
    compute = torch.promote_types(q.dtype, torch.float32)
    s = _scale(scale, d)
    qf, kf = q.to(compute), k.to(compute)
    logits = (qf * s) @ kf.transpose(-1, -2)
    bias = _bias(logits, qf, weight, allowed, s, position_logit)
    bias = bias if allowed is None else bias.masked_fill(~allowed, 0.0)
    _check_result(bias, {"q": q, "k": k, "weight": weight}, s)
    return bias


class CoPEBias(ContextualEncoding):
    """Contextual position encoding: gated token counts as positions (see the module docs).

    A :class:`~posenc._base.ContextualEncoding`: its term depends on the queries and
    keys, so it has no bias of positions alone; :func:`posenc.attention` computes it from
    the logits on its eager path (or the query-chunked one, for long sequences), and the
    positions passed to attention are not read. :func:`cope_bias` is the same term as a
    pure function of ``q``, ``k`` and the table; calling the module, ``cope(q, k)``, is
    that function with its own table (:meth:`forward`). ``TinyTransformer`` gives each
    layer its own table (``per_layer = True``), as the paper's code does by default.

    Args:
        head_dim: the head dimension ``d`` of the queries.
        npos_max: positions of the table; contextual positions are clamped to
            ``npos_max - 1`` (the paper's default is the training length + 1).
        position_logit: ``"scaled"`` (the paper's default) or ``"unscaled"``
            (``--cope-nodiv``).
        device, dtype: of the table.

    Attributes:
        weight: the table ``[npos_max, head_dim]``, initialised to zero (as the paper's
            code), shared by every head.

    Examples:
        >>> import torch, posenc
        >>> cope = posenc.build("cope", head_dim=8, npos_max=16)
        >>> q, k, v = torch.randn(3, 2, 4, 6, 8).unbind(0)
        >>> posenc.attention(q, k, v, encoding=cope, causal=True).shape
        torch.Size([2, 4, 6, 8])
    """

    name: ClassVar[str] = "cope"
    per_layer: ClassVar[bool] = True  # the paper's code: a table per layer
    num_heads = None  # one table for any number of heads

    def __init__(
        self,
        head_dim: int,
        npos_max: int,
        *,
        position_logit: str = "scaled",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        device, dtype = check_factory(device, dtype)
        self.head_dim = check_int("head_dim", head_dim, min=1)
        self.npos_max = check_int("npos_max", npos_max, min=1)
        self.position_logit = check_choice("position_logit", position_logit, POSITION_LOGITS)
        shape = (self.npos_max, self.head_dim)
        big = "head_dim" if self.head_dim > self.npos_max else "npos_max"  # the one asking
        check_alloc(big, getattr(self, big), shape, dtype or torch.float32, device)
        self.weight = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        self.reset_parameters()
        self._set_config(
            head_dim=self.head_dim, npos_max=self.npos_max, position_logit=self.position_logit
        )

    def reset_parameters(self) -> None:
        """Zero the table (the paper's initialisation)."""
        with torch.no_grad():
            self.weight.zero_()

    def contextual_bias_at(
        self,
        logits: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        allowed: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        """CoPE's term from the attention ``logits`` (its gates), ``q`` and the table
        (``k`` is read through the logits)."""
        if self.weight.device != q.device:
            raise PosEncError(
                f"encoding 'cope' has its table on {self.weight.device}; q is on {q.device}"
            )
        if q.shape[-1] != self.head_dim:
            raise PosEncError(
                f"encoding 'cope' has head_dim={self.head_dim}; q has head dim {q.shape[-1]}"
            )
        return _bias(logits, q, self.weight, allowed, scale, self.position_logit)

    def counted_table(self) -> tuple[torch.Tensor, bool] | None:
        """``(weight, position_logit == "scaled")``: CoPE's term is the counted form
        (:meth:`~posenc._base.ContextualEncoding.counted_table`); None for a subclass that
        computes its own term (overrides :meth:`contextual_bias_at`)."""
        if type(self).contextual_bias_at is not CoPEBias.contextual_bias_at:
            return None
        return self.weight, self.position_logit == "scaled"

    def fused_attention_at(self, q: torch.Tensor, dropout_p: float) -> Any:
        """CoPE's fused CPU attention (:mod:`posenc.contextual.cope_fused`) where it serves
        the call (CPU tensors, no dropout, outside tracing and ``torch.func``, the library
        built), else None (see :meth:`~posenc._base.ContextualEncoding.fused_attention_at`)."""
        counted = self.counted_table()
        if counted is None or not cope_fused.applies(q, counted[0], dropout_p):
            return None
        table, scaled = counted

        def run(q, k, v, keep, *, causal: bool, scale: float) -> torch.Tensor:
            return cope_fused.fused(q, k, v, table, keep, causal=causal, scale=scale, scaled=scaled)

        return run

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        scale: float | None = None,
        causal: bool = True,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``module(q, k)``: the term itself, :func:`cope_bias` of ``q`` and ``k`` with this
        module's table and ``position_logit`` (every argument checked there):
        ``[b, h, q, k]``."""
        return cope_bias(
            q,
            k,
            self.weight,
            position_logit=self.position_logit,
            scale=scale,
            causal=causal,
            attn_mask=attn_mask,
        )
