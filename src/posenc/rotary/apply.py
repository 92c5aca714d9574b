"""Rotating queries and keys: cos/sin from positions, and the rotation in both pairing layouts.

RoPE (Su et al., 2021) rotates each pair of channels ``(a, b)`` of a query or key at
position ``p`` by the angle ``p * w_i`` of its frequency ``w_i``::

    out[a] = x[a] * cos(p w_i) - x[b] * sin(p w_i)
    out[b] = x[b] * cos(p w_i) + x[a] * sin(p w_i)

so that ``q_m . k_n`` depends on ``m - n`` only. Checkpoints disagree on which channels
form a pair, so the layout is always named:

- ``layout="half"``: channel ``i`` pairs with ``i + r/2`` (GPT-NeoX, Llama as ported to
  transformers, Qwen, ...);
- ``layout="interleaved"``: channel ``2i`` pairs with ``2i + 1`` (RoFormer, GPT-J, Meta's
  original Llama checkpoints, rotary-embedding-torch).

Only the first ``r = rotary_dim`` channels rotate; channels past it pass through unchanged
(partial rotary, as in GPT-NeoX and Phi).

Shapes: ``x`` is ``[b, h, s, d]`` (``seq_dim=-2``) or ``[b, s, h, d]`` (``seq_dim=-3``);
``cos``/``sin`` hold one value per frequency, ``[s, r/2]`` or ``[b, s, r/2]``, and are
broadcast over heads through views, so ``x`` is never copied or made contiguous.

The rotation itself runs in :mod:`posenc.rotary.kernels` (a fused path, or the plain torch
twin :func:`posenc.rotary.kernels.plain.apply_rotary_torch`); this module validates and
dispatches. ``LAYOUTS``, ``SEQ_DIMS`` and ``Layout`` are those of
:mod:`posenc.rotary.layout`, re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from posenc._angles import reduced_angles
from posenc._errors import (
    PosEncError,
    check_choice,
    check_dtype,
    check_finite,
    check_float,
    check_int,
    check_positions,
    check_tensor,
)
from posenc.rotary.kernels import dispatch_rotary
from posenc.rotary.kernels.plain import check_cos_sin
from posenc.rotary.layout import LAYOUTS, SEQ_DIMS, Layout

__all__ = [
    "LAYOUTS",
    "SEQ_DIMS",
    "Layout",
    "apply_rotary",
    "check_sections",
    "rotary_cos_sin",
]


def rotary_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    attention_scale: float = 1.0,
    sections: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of ``positions * inv_freq``, each multiplied by ``attention_scale``.

    The angles are formed in float64 from the exact positions and reduced to ``[-pi, pi)``
    before they are rounded (:func:`posenc._angles.reduced_angles`), so the error stays
    below ~1e-7 at positions of 2^24 and beyond, where a float32 product has lost the
    whole fractional part of the angle.

    Args:
        positions: int or float positions of any shape, e.g. ``[s]`` or ``[b, s]``; with
            ``sections``, coordinates ``[..., s, n_axes]``. Floating positions must be
            finite (checked: one host synchronisation on CUDA for floating positions, none
            for integer ones).
        inv_freq: the frequencies ``[r/2]``; float64 keeps them exact (see
            :func:`posenc.rope_frequencies`).
        attention_scale: multiplies cos and sin (YaRN / LongRoPE's attention factor,
            applied to q and k as transformers does).
        sections: multi-axis RoPE (M-RoPE, Qwen2-VL): ``n_axes`` sizes summing to ``r/2``;
            frequency ``j`` takes its position from the axis whose section holds ``j``
            (the first ``sections[0]`` frequencies from axis 0, and so on).
        dtype: dtype of the result (float32 by default; float64 for float64 inputs).

    Shape:
        positions ``[*P]`` (with sections ``[*P, n_axes]``), inv_freq ``[r/2]`` -> cos, sin
        ``[*P, r/2]``, on the device of ``positions``.

    Examples:
        >>> import torch, posenc
        >>> cos, sin = posenc.rotary_cos_sin(torch.arange(3), torch.tensor([1.0, 0.01]))
        >>> cos
        tensor([[ 1.0000,  1.0000],
                [ 0.5403,  0.9999],
                [-0.4161,  0.9998]])
        >>> grid = torch.tensor([[0, 0], [0, 1], [1, 0]])  # [s=3, n_axes=2]
        >>> posenc.rotary_cos_sin(grid, torch.tensor([1.0, 1.0]), sections=(1, 1))[0]
        tensor([[1.0000, 1.0000],
                [1.0000, 0.5403],
                [0.5403, 1.0000]])
    """
    check_positions("positions", positions, ndims=None)
    check_tensor("inv_freq", inv_freq, floating=True)
    if inv_freq.ndim != 1:
        raise PosEncError(f"inv_freq must be 1-D [r/2], got shape {tuple(inv_freq.shape)}")
    if inv_freq.is_meta:  # another real device is fine: the angles are formed on positions'
        raise PosEncError("inv_freq must hold values, got a tensor on the meta device")
    check_finite("inv_freq", inv_freq)
    attention_scale = check_float("attention_scale", attention_scale)
    check_dtype("dtype", dtype)
    if not math.isfinite(torch.tensor(attention_scale, dtype=dtype).item()):
        raise PosEncError(
            f"attention_scale must be finite in {dtype} (cos and sin are multiplied by it), "
            f"got {attention_scale}"
        )
    if sections is not None:
        sections = check_sections(sections, inv_freq.shape[0])
        if positions.ndim < 1 or positions.shape[-1] != len(sections):
            raise PosEncError(
                f"positions must be [..., s, {len(sections)}] (one coordinate per section), "
                f"got shape {tuple(positions.shape)}"
            )
    return _cos_sin(positions, inv_freq, attention_scale, sections, dtype)


def check_sections(sections: Any, half: int) -> tuple[int, ...]:
    """Validate M-RoPE ``sections``: positive integers summing to ``half`` (= rotary_dim / 2)."""
    if isinstance(sections, (str, bytes, torch.Tensor)) or not hasattr(sections, "__len__"):
        raise PosEncError(f"sections must be a sequence of integers, got {sections!r}")
    values = tuple(check_int(f"sections[{i}]", n, min=1) for i, n in enumerate(sections))
    if not values or sum(values) != half:
        raise PosEncError(
            f"sections must sum to rotary_dim / 2 = {half}, got {list(values)} (sum {sum(values)})"
        )
    return values


def _cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    attention_scale: float,
    sections: tuple[int, ...] | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rotary_cos_sin` on validated arguments."""
    if sections is None:
        theta = reduced_angles(positions, inv_freq)  # [*P, r/2] float64
    else:  # section a of the frequencies takes the coordinate of axis a
        blocks = torch.split(inv_freq, list(sections))
        theta = torch.cat(
            [reduced_angles(positions[..., a], w) for a, w in enumerate(blocks)], dim=-1
        )  # [*P, r/2]
    cos, sin = torch.cos(theta), torch.sin(theta)
    if attention_scale != 1.0:
        cos, sin = cos * attention_scale, sin * attention_scale
    return cos.to(dtype), sin.to(dtype)


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: Layout = "half",
    rotary_dim: int | None = None,
    seq_dim: int = -2,
) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` channels of ``x`` by the angles whose cos/sin are given.

    The math runs in float32 for bf16/fp16 inputs (float64 for float64 inputs) and the
    result is rounded once to ``x``'s dtype.

    Args:
        x: queries or keys, ``[b, h, s, d]`` (or ``[b, s, h, d]`` with ``seq_dim=-3``).
        cos, sin: one value per frequency, ``[s, r/2]`` or ``[b, s, r/2]``, from
            :func:`rotary_cos_sin`.
        layout: ``"half"`` pairs channel ``i`` with ``i + r/2`` (GPT-NeoX, Llama in
            transformers); ``"interleaved"`` pairs ``2i`` with ``2i + 1`` (RoFormer, GPT-J,
            Meta checkpoints).
        rotary_dim: the number of rotated channels ``r``; ``None`` means ``2 * cos.shape[-1]``
            (given, it must equal that). Channels ``r..d`` pass through unchanged.
        seq_dim: ``-2`` for ``[b, h, s, d]``, ``-3`` for ``[b, s, h, d]``.

    Shape:
        ``x: [b, h, s, d]`` (or ``[b, s, h, d]``), ``cos, sin: [s, r/2]`` or ``[b, s, r/2]``
        -> same shape and dtype as ``x``.

    Examples:
        >>> import torch, posenc
        >>> x = torch.tensor([[[[1.0, 0.0, 0.0, 0.0]]]])  # [b=1, h=1, s=1, d=4]
        >>> cos, sin = posenc.rotary_cos_sin(torch.tensor([1]), torch.tensor([torch.pi / 2, 0.0]))
        >>> posenc.apply_rotary(x, cos, sin, layout="half").round(decimals=6) + 0.0  # 0 pairs with 2
        tensor([[[[0., 0., 1., 0.]]]])
        >>> posenc.apply_rotary(x, cos, sin, layout="interleaved").round(decimals=6) + 0.0  # 0 with 1
        tensor([[[[0., 1., 0., 0.]]]])
    """
    check_tensor("x", x, floating=True)
    check_choice("layout", layout, LAYOUTS)
    check_choice("seq_dim", seq_dim, SEQ_DIMS)
    if x.ndim != 4:
        raise PosEncError(
            f"x must be [b, h, s, d] (seq_dim=-2) or [b, s, h, d] (seq_dim=-3), "
            f"got shape {tuple(x.shape)}"
        )
    check_cos_sin(x, cos, sin, seq_dim)
    half = cos.shape[-1]
    if rotary_dim is None:
        rotary_dim = 2 * half
    rotary_dim = check_int("rotary_dim", rotary_dim, min=2)
    if rotary_dim != 2 * half:
        raise PosEncError(f"rotary_dim must equal 2 * cos.shape[-1] = {2 * half}, got {rotary_dim}")
    if rotary_dim > x.shape[-1]:
        raise PosEncError(
            f"rotary_dim must be <= x's last dimension {x.shape[-1]}, got {rotary_dim}"
        )
    return dispatch_rotary(x, None, cos, sin, layout=layout, seq_dim=seq_dim)[0]
