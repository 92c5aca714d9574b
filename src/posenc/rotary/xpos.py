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
``n ~ 70 * scale_base`` (about 36k positions for ``scale_base=512``). Shifting all positions
by one constant keeps every score unchanged (e.g. pass ``positions - s // 2``) and halves
the largest exponent, as rotary-embedding-torch's centring does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from posenc._errors import check_float
from posenc.rotary.frequencies import Scaling
from posenc.rotary.layout import Layout
from posenc.rotary.module import RotaryEmbedding, Rotation

__all__ = ["XPosEmbedding", "xpos_scale"]


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
        rope = super().rotation_at(q_positions, k_positions, dtype=torch.float64)
        zq = xpos_scale(q_positions, self.rotary_dim, self._scale_base)  # [.., s, r/2]
        zk = xpos_scale(k_positions, self.rotary_dim, -self._scale_base)
        return Rotation(
            (rope.cos_q * zq).to(dtype),
            (rope.sin_q * zq).to(dtype),
            (rope.cos_k * zk).to(dtype),
            (rope.sin_k * zk).to(dtype),
        )
