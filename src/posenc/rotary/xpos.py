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
``n ~ 70 * scale_base``, float16 past ``n ~ 8.8 * scale_base``. So positions must satisfy
``|n| <= xpos_max_position(scale_base, dtype)`` (``|n| / scale_base <= ln(finfo.max) / ln(3.5)
- 4``, a factor ``3.5^4 = 150`` left for the dot products), ``dtype`` the narrowest of the
cos/sin and the queries and keys rotated: for ``scale_base=512``, 2 048 positions in float16,
33 792 in bfloat16 and float32, 287 744 in float64. Positions beyond it raise
:class:`posenc.PosEncError` naming them (on the CPU and while tracing; on other devices a
runtime assertion, no host sync): ``forward`` checks the positions, ``rotate`` the scales a
:meth:`~posenc.RotaryEmbedding.rotation` holds (``hypot(cos, sin)`` of the first frequency
is ``3.5^(|n| / scale_base)`` times the attention scale). Shifting all positions by one
constant keeps every score unchanged (e.g. pass ``positions - s // 2``) and halves the
largest exponent, as rotary-embedding-torch's centring does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from posenc._errors import (
    PosEncError,
    check_alloc,
    check_choice,
    check_dtype,
    check_float,
    check_int,
    check_positions,
    check_traced,
    tracing,
)
from posenc.rotary.frequencies import Scaling
from posenc.rotary.layout import SEQ_DIMS, Layout
from posenc.rotary.module import RotaryEmbedding, Rotation, _renamed_positions
from posenc.rotary.rotation import check_qk

__all__ = ["XPosEmbedding", "xpos_max_position", "xpos_scale"]

_MARGIN = 4.0  # powers of 1 / zeta_0 = 3.5 kept free below overflow, for the dot products


def xpos_max_position(scale_base: float, dtype: torch.dtype = torch.float32) -> float:
    """The largest ``|position|`` whose xPos scales are finite in ``dtype`` (with a margin):
    ``scale_base * floor(ln(finfo(dtype).max) / ln(3.5) - 4)``, ``scale_base > 0``.

    >>> xpos_max_position(512.0), xpos_max_position(512.0, torch.float16)
    (33792.0, 2048.0)
    """
    scale_base = _check_scale_base(scale_base)
    check_dtype("dtype", dtype)
    return _max_position(scale_base, dtype)


def _check_scale_base(scale_base: Any) -> float:
    return check_float("scale_base", scale_base, min=0.0, min_exclusive=True)


def _max_position(scale_base: float, dtype: torch.dtype) -> float:
    top = math.log(torch.finfo(dtype).max) / math.log(3.5) - _MARGIN
    return abs(scale_base) * math.floor(top)


def _narrowest(*dtypes: torch.dtype) -> torch.dtype:
    """The floating dtype of ``dtypes`` with the smallest range (float16 before bfloat16)."""
    return min(dtypes, key=lambda d: torch.finfo(d).max)


def _check_range(name: str, positions: torch.Tensor, scale_base: float, dtype: torch.dtype) -> None:
    """Refuse positions whose scales overflow ``dtype``: a PosEncError on the CPU, a graph
    assertion while tracing, an asynchronous device assertion elsewhere (no host sync)."""
    limit = _max_position(scale_base, dtype)
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


def _check_rotation_range(
    rotation: Rotation, scale_base: float, attention_scale: float, dtype: torch.dtype
) -> None:
    """Refuse a rotation whose scales overflow ``dtype`` (narrower than its own): the
    positions it was computed at, read back from ``hypot(cos, sin)`` of the first frequency,
    ``attention_scale * 3.5^(+-n / scale_base)``, as :func:`_check_range` would."""
    limit = _max_position(scale_base, dtype)
    slack = 1e-3 * scale_base  # the float32 rounding of cos / sin, in positions
    for name, cos, sin in (
        ("q_positions", rotation.cos_q, rotation.sin_q),
        ("k_positions", rotation.cos_k, rotation.sin_k),
    ):
        if cos.device.type == "meta" or cos.numel() == 0:
            continue
        z = torch.hypot(cos[..., 0].to(torch.float64), sin[..., 0].to(torch.float64))
        n = (torch.log(z / attention_scale) / math.log(3.5)).abs() * scale_base  # |n|
        if tracing() or cos.device.type != "cpu":
            rule = f"{name} must be within +-xpos_max_position(scale_base, dtype) for xPos"
            check_traced(n <= limit + slack, rule)
            continue
        largest = float(n.max())
        if largest > limit + slack:
            raise PosEncError(
                f"{name} must be within +-{limit:g} for xPos with scale_base={scale_base:g} "
                f"in {dtype} (the dtype of q / k; its scales 3.5^(|n| / scale_base) overflow "
                f"beyond), got a rotation at |{name}| up to about {largest:.6g}"
            )


def xpos_scale(positions: torch.Tensor, rotary_dim: int, scale_base: float) -> torch.Tensor:
    """xPos' scale ``zeta_i ^ (n / scale_base)`` with ``zeta_i = (2i + 0.4 r) / (1.4 r)``,
    in float64, ``scale_base > 0``.

    Queries are multiplied by it and keys by its inverse (``xpos_scale(-positions, ...)``),
    so ``q_m . k_n`` carries ``zeta^((m - n) / scale_base)``: attention decays with distance.

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
    scale_base = _check_scale_base(scale_base)
    _check_range("positions", positions, scale_base, torch.float64)
    return _scale(positions, rotary_dim, scale_base)


def _scale(positions: torch.Tensor, rotary_dim: int, scale_base: float) -> torch.Tensor:
    """:func:`xpos_scale` of checked arguments."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float64, device=positions.device)
    log_zeta = torch.log((2 * i + 0.4 * rotary_dim) / (1.4 * rotary_dim))  # [r/2]
    return torch.exp(positions.to(torch.float64).unsqueeze(-1) / scale_base * log_zeta)


def _floating(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


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
        self._scale_base = _check_scale_base(scale_base)
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

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        *,
        k_positions: torch.Tensor | None = None,
        seq_dim: int = -2,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`posenc.RotaryEmbedding.forward`, the positions' range checked for the
        dtype of ``q`` and ``k`` too (float16 keys overflow far sooner than float32 cos/sin)."""
        # the caller, past nn.Module.__call__ -> _wrapped_call_impl -> _call_impl -> forward
        q_positions = _renamed_positions(q_positions, positions, stacklevel=5)
        if _floating(q) and _floating(k):
            narrow = _narrowest(q.dtype, k.dtype)
            if _max_position(self._scale_base, narrow) < _max_position(
                self._scale_base, torch.float32
            ):
                check_choice("seq_dim", seq_dim, SEQ_DIMS)
                check_qk(q, k, seq_dim, self.head_dim)
                sq, sk = q.shape[seq_dim], k.shape[seq_dim]
                q_positions, k_positions = self._resolve(
                    q_positions, k_positions, sq, sk, q.shape[0], q.device
                )
                _check_range("q_positions", q_positions, self._scale_base, narrow)
                if k_positions is not q_positions:
                    _check_range("k_positions", k_positions, self._scale_base, narrow)
        return super().forward(q, k, q_positions, k_positions=k_positions, seq_dim=seq_dim)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, rotation: Rotation, *, seq_dim: int = -2
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`posenc.RotaryEmbedding.rotate`, the rotation's scales checked against the
        range of ``q``'s and ``k``'s dtype where it is narrower than the cos/sin's."""
        self._check_scales(q, k, rotation)
        return super().rotate(q, k, rotation, seq_dim=seq_dim)

    def rotate_at(
        self, q: torch.Tensor, k: torch.Tensor, rotation: Rotation, *, seq_dim: int = -2
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`posenc.RotaryEmbedding.rotate_at`, the scales checked as :meth:`rotate`
        checks them."""
        self._check_scales(q, k, rotation)
        return super().rotate_at(q, k, rotation, seq_dim=seq_dim)

    def _check_scales(self, q: Any, k: Any, rotation: Any) -> None:
        """Refuse a rotation whose scales overflow ``q``'s and ``k``'s dtype, where it is
        narrower than the cos/sin's."""
        if _floating(q) and _floating(k) and isinstance(rotation, Rotation):
            parts = tuple(rotation)
            if all(_floating(t) and t.ndim >= 1 and t.shape[-1] >= 1 for t in parts):
                narrow = _narrowest(q.dtype, k.dtype)
                own = _narrowest(*(t.dtype for t in parts))
                if _max_position(self._scale_base, narrow) < _max_position(self._scale_base, own):
                    _check_rotation_range(rotation, self._scale_base, self.attention_scale, narrow)

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
