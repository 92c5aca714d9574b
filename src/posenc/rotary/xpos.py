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

from typing import ClassVar

from posenc.rotary.apply import Layout
from posenc.rotary.module import RotaryEmbedding

__all__ = ["XPosEmbedding"]


class XPosEmbedding(RotaryEmbedding):
    """xPos: RoPE whose queries/keys are scaled by ``zeta^(+-n / scale_base)``.

    Equivalent to ``RotaryEmbedding(head_dim, xpos_scale_base=scale_base, ...)``, under the
    registry name ``"xpos"``.

    Args:
        head_dim: channels per head (even).
        scale_base: the length scale of the decay (512 in the paper).
        base, rotary_dim, layout: as in :class:`posenc.RotaryEmbedding` (the paper's code
            and rotary-embedding-torch use ``layout="interleaved"``).

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
    ) -> None:
        super().__init__(
            head_dim, base=base, rotary_dim=rotary_dim, layout=layout, xpos_scale_base=scale_base
        )
        self._set_config(
            head_dim=self.head_dim,
            scale_base=self.xpos_scale_base,
            base=self.base,
            rotary_dim=rotary_dim,
            layout=layout,
        )
