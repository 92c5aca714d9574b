"""xPos (Sun et al., 2022, "A Length-Extrapolatable Transformer"): RoPE with a decay.

On top of the rotation, frequency ``i`` of a query at position ``n`` is scaled by
``zeta_i^(n / scale_base)`` and of a key at position ``n`` by ``zeta_i^(-n / scale_base)``,
with ``zeta_i = (2i + 0.4 r) / (1.4 r)`` (``r`` the rotary dim, ``0 <= i < r/2``). The
score of query ``m`` and key ``n`` then carries ``zeta_i^((m - n) / scale_base)``: it still
depends on the offset only, and the low frequencies (small ``zeta``) decay with distance.

Matching rotary-embedding-torch (``RotaryEmbedding(dim, use_xpos=True)``, interleaved
layout): it rotates by positions ``n`` but scales by the *centred* positions
``n - s // 2`` (``s`` the sequence length of the call). The attention scores are equal
to ours; the rotated queries and keys differ by constant factors:
``ours_q = theirs_q * zeta^((s // 2) / scale_base)`` and
``ours_k = theirs_k * zeta^(-(s // 2) / scale_base)`` (per frequency pair).

Range: ``zeta_0 = 2/7``, so keys grow like ``3.5^(n / scale_base)``; float32 overflows past
``n ~ 70 * scale_base``. So positions must satisfy ``|n| <= max_position(scale_base, dtype)``
(:func:`xpos_max_position`: ``|n| / scale_base <= ln(finfo.max) / ln(3.5) - 4``, a factor
``3.5^4 = 150`` left for the dot products; 33 792 positions in float32 and 287 744 in
float64 for ``scale_base=512``); positions beyond it raise :class:`posenc.PosEncError`
(on the CPU and while tracing; on other devices a runtime assertion, no host sync).
Shifting all positions by one constant keeps every score unchanged (e.g. pass
``positions - s // 2``) and halves the largest exponent, as rotary-embedding-torch's
centring does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from posenc._errors import (
    PosEncError,
    check_alloc,
    check_float,
    check_int,
    check_positions,
    check_traced,
    tracing,
)
from posenc.rotary.frequencies import Scaling
from posenc.rotary.layout import Layout
from posenc.rotary.module import RotaryEmbedding, Rotation

__all__ = ["XPosEmbedding", "xpos_max_position", "xpos_scale"]

_MARGIN = 4.0  # powers of 1 / zeta_0 = 3.5 kept free below overflow, for the dot products


def xpos_max_position(scale_base: float, dtype: torch.dtype = torch.float32) -> float:
    """The largest ``|position|`` whose xPos scales are finite in ``dtype`` (with a margin):
    ``|scale_base| * (ln(finfo(dtype).max) / ln(3.5) - 4)``.

    >>> xpos_max_position(512.0)
    33792.0
    """
    top = math.log(torch.finfo(dtype).max) / math.log(3.5) - _MARGIN
    return abs(scale_base) * math.floor(top)


def _check_range(name: str, positions: torch.Tensor, scale_base: float, dtype: torch.dtype) -> None:
    """Refuse positions whose scales overflow ``dtype``: a PosEncError on the CPU, a graph
    assertion while tracing, an asynchronous device assertion elsewhere (no host sync)."""
    limit = xpos_max_position(scale_base, dtype)
    if tracing() or positions.device.type not in ("cpu", "meta"):
        # a constant message: the graph holds it as it is
        rule = f"{name} must be within +-xpos_max_position(scale_base, dtype) for xPos"
        check_traced(positions.to(torch.float64).abs() <= limit, rule)
        return
    if positions.device.type == "meta" or positions.numel() == 0:
        return
    largest = float(positions.to(torch.float64).abs().max())  # int64 min has no abs
    if largest > limit:
        raise PosEncError(
            f"{name} must be within +-{limit:g} for xPos with scale_base={scale_base:g} in "
            f"{dtype} (its scales 3.5^(|n| / scale_base) overflow beyond), got largest "
            f"|{name}| {largest:g}"
        )


def xpos_scale(positions: torch.Tensor, rotary_dim: int, scale_base: float) -> torch.Tensor:
    """xPos' scale ``zeta_i ^ (n / scale_base)`` with ``zeta_i = (2i + 0.4 r) / (1.4 r)``,
    in float64.

    Queries are multiplied by it and keys by its inverse (``-scale_base``), so
    ``q_m . k_n`` carries ``zeta^((m - n) / scale_base)``: attention decays with distance.

    Shape: positions ``[*P]`` -> ``[*P, r/2]``.

    Examples:
        >>> import torch
        >>> from posenc.rotary.xpos import xpos_scale
        >>> xpos_scale(torch.tensor([0, 512]), 4, 512.0)  # zeta = (1.6, 3.6) / 5.6
        tensor([[1.0000, 1.0000],
                [0.2857, 0.6429]], dtype=torch.float64)
    """
    check_positions("positions", positions, ndims=None)
    rotary_dim = check_int("rotary_dim", rotary_dim, min=2)
    if rotary_dim % 2:
        raise PosEncError(f"rotary_dim must be even, got {rotary_dim}")
    check_alloc("rotary_dim", rotary_dim, (3, positions.numel(), rotary_dim), torch.float64)
    scale_base = check_float("scale_base", scale_base)
    if scale_base == 0:
        raise PosEncError("scale_base must be non-zero, got 0.0")
    _check_range("positions", positions, scale_base, torch.float64)
    return _scale(positions, rotary_dim, scale_base)


def _scale(positions: torch.Tensor, rotary_dim: int, scale_base: float) -> torch.Tensor:
    """:func:`xpos_scale` of checked arguments."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float64, device=positions.device)
    log_zeta = torch.log((2 * i + 0.4 * rotary_dim) / (1.4 * rotary_dim))  # [r/2]
    return torch.exp(positions.to(torch.float64).unsqueeze(-1) / scale_base * log_zeta)


class XPosEmbedding(RotaryEmbedding):
    """xPos: RoPE whose queries/keys are scaled by ``zeta^(+-n / scale_base)``.

    The rotation of :class:`posenc.RotaryEmbedding`, with every cos/sin of a query at
    position ``n`` multiplied by :func:`xpos_scale` ``(n)`` and of a key by its inverse,
    under the registry name ``"xpos"``.

    Args:
        head_dim: channels per head (even).
        scale_base: the length scale of the decay (512 in the paper).
        base, rotary_dim, layout, scaling: as in :class:`posenc.RotaryEmbedding` (the
            paper's code and rotary-embedding-torch use ``layout="interleaved"``).

    Attributes:
        scale_base: read-only.

    Shape:
        ``q: [b, hq, sq, d]``, ``k: [b, hk, sk, d]``; positions ``[s]`` or ``[b, s]``
        -> ``(q, k)``.

    Examples:
        >>> import torch, posenc
        >>> xpos = posenc.XPosEmbedding(8, scale_base=512.0)
        >>> q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
        >>> def score(m, n):
        ...     q_rot, k_rot = xpos(q, k, torch.tensor([m]), k_positions=torch.tensor([n]))
        ...     return (q_rot * k_rot).sum()
        >>> torch.allclose(score(5, 3), score(1005, 1003))  # the offset alone matters
        True
    """

    name: ClassVar[str] = "xpos"

    def __init__(
        self,
        head_dim: int,
        *,
        scale_base: float = 512.0,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Layout = "half",
        scaling: Scaling | Mapping[str, Any] | None = None,
    ) -> None:
        # checked before RoPE's tables are built, so a huge one names head_dim
        check_alloc(
            "head_dim", check_int("head_dim", head_dim, min=2), (4, head_dim), torch.float64
        )
        super().__init__(head_dim, base=base, rotary_dim=rotary_dim, layout=layout, scaling=scaling)
        self._scale_base = check_float("scale_base", scale_base, min=0.0, min_exclusive=True)
        self._set_config(
            head_dim=self.head_dim,
            scale_base=self._scale_base,
            base=self.base,
            rotary_dim=rotary_dim,
            layout=layout,
            scaling=self.scaling,
        )

    @property
    def scale_base(self) -> float:
        return self._scale_base

    def rotation_at(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor, *, dtype: torch.dtype
    ) -> Rotation:
        """RoPE's cos/sin in float64, times ``zeta^(n / scale_base)`` for the queries and
        ``zeta^(-n / scale_base)`` for the keys, rounded once to ``dtype``, after the product."""
        _check_range("q_positions", q_positions, self._scale_base, dtype)
        if k_positions is not q_positions:
            _check_range("k_positions", k_positions, self._scale_base, dtype)
        rope = super().rotation_at(q_positions, k_positions, dtype=torch.float64)
        zq = _scale(q_positions, self.rotary_dim, self._scale_base)  # [.., s, r/2]
        zk = _scale(k_positions, self.rotary_dim, -self._scale_base)
        return Rotation(
            (rope.cos_q * zq).to(dtype),
            (rope.sin_q * zq).to(dtype),
            (rope.cos_k * zk).to(dtype),
            (rope.sin_k * zk).to(dtype),
        )
