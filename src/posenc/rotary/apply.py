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

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal

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
    tracing,
)
from posenc.rotary.kernels.checks import check_cos_sin, check_rotary_dim, check_rotary_input
from posenc.rotary.kernels.dispatch import dispatch_rotary
from posenc.rotary.layout import LAYOUTS, SEQ_DIMS, Layout

__all__ = [
    "DIRECTIONS",
    "LAYOUTS",
    "PARTIALS",
    "SECTION_LAYOUTS",
    "SEQ_DIMS",
    "Direction",
    "Layout",
    "Partial",
    "SectionLayout",
    "SectionMap",
    "apply_rotary",
    "check_placement",
    "check_sections",
    "place_frequencies",
    "rotary_cos_sin",
    "section_map",
]

SectionLayout = Literal["contiguous", "interleaved", "spatial_interleaved"]
SECTION_LAYOUTS: tuple[SectionLayout, ...] = ("contiguous", "interleaved", "spatial_interleaved")
Partial = Literal["leading", "whole_head", "trailing"]
PARTIALS: tuple[Partial, ...] = ("leading", "whole_head", "trailing")
# the sense of the rotation: by +p * w_i (RoPE) or by -p * w_i (NanoChat's cat(x2, -x1))
Direction = Literal["positive", "negative"]
DIRECTIONS: tuple[Direction, ...] = ("positive", "negative")


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


def check_sections(sections: Any, half: int | None) -> tuple[int, ...]:
    """Validate M-RoPE ``sections``: positive integers summing to ``half`` (= rotary_dim / 2;
    ``None``: any sum, for the interleaved layout)."""
    unordered = isinstance(sections, (set, frozenset, dict))
    if (
        isinstance(sections, (str, bytes, torch.Tensor))
        or unordered
        or not hasattr(sections, "__len__")
    ):
        raise PosEncError(f"sections must be a sequence of integers, got {sections!r}")
    values = tuple(check_int(f"sections[{i}]", n, min=1) for i, n in enumerate(sections))
    if half is None and len(values) >= 2:
        return values
    if half is None:
        raise PosEncError(f"sections must hold two or more axes, got {list(values)}")
    if not values or sum(values) != half:
        raise PosEncError(
            f"sections must sum to rotary_dim / 2 = {half}, got {list(values)} (sum {sum(values)})"
        )
    return values


def check_placement(
    head_dim: int,
    rotary_dim: int,
    layout: str,
    partial: Any,
    sections: Any,
    section_layout: Any,
) -> tuple[Partial, int, tuple[int, ...] | None, SectionMap | None]:
    """A rotary module's channel placement: ``(partial, kernel_dim, sections, section_map)``,
    where ``kernel_dim`` is the channels cos/sin span: ``head_dim`` for ``partial=
    "whole_head"`` with ``layout="half"`` and for ``"trailing"``, else ``rotary_dim``."""
    partial = check_choice("partial", partial, PARTIALS)
    section_layout = check_choice("section_layout", section_layout, SECTION_LAYOUTS)
    if partial == "trailing" and layout == "half" and rotary_dim < head_dim:
        raise PosEncError(
            "partial 'trailing' needs layout='interleaved' (the last channels' pairs (2i, 2i + 1) "
            "are pairs of the whole head), got layout 'half'"
        )
    spread = (partial == "whole_head" and layout == "half") or partial == "trailing"
    kernel_dim = head_dim if spread else rotary_dim
    if sections is None:
        if section_layout != "contiguous":
            raise PosEncError(f"section_layout {section_layout!r} needs sections, got None")
        return partial, kernel_dim, None, None
    if kernel_dim != rotary_dim:
        raise PosEncError(
            f"partial must be 'leading' with sections (M-RoPE) and rotary_dim < head_dim, "
            f"got {partial!r}"
        )
    half = rotary_dim // 2
    checked = check_sections(sections, None if section_layout == "interleaved" else half)
    if section_layout == "spatial_interleaved" and (len(checked) < 2 or len(set(checked[1:])) > 1):
        raise PosEncError(
            f"section_layout 'spatial_interleaved' needs two or more sections, those of the axes "
            f"after the first alike (their frequencies alternate), got {list(checked)}"
        )
    return partial, kernel_dim, checked, section_map(checked, section_layout, half)


def place_frequencies(inv_freq: torch.Tensor, kernel_dim: int, partial: str) -> torch.Tensor:
    """The rotated pairs' frequencies placed among the ``kernel_dim / 2`` the kernel sees: the
    other pairs take frequency 0 (cos 1, sin 0: they pass through exactly), after the rotated
    ones (``"whole_head"``) or before them (``"trailing"``)."""
    pad = kernel_dim // 2 - inv_freq.shape[0]
    if pad == 0:
        return inv_freq
    parts = [inv_freq, inv_freq.new_zeros(pad)]
    return torch.cat(parts[::-1] if partial == "trailing" else parts)


@dataclasses.dataclass(frozen=True)
class SectionMap:
    """Which axis each M-RoPE frequency takes its coordinate from: frequencies
    ``order[j]`` (``None``: ``j``) grouped by axis, ``counts[a]`` of them for axis ``a``."""

    counts: tuple[int, ...]
    order: tuple[int, ...] | None = None


def section_map(sections: tuple[int, ...], layout: SectionLayout, half: int) -> SectionMap:
    """The :class:`SectionMap` of validated ``sections`` over ``half = r/2`` frequencies.

    ``"contiguous"`` (Qwen2-VL; ``sections`` sum to ``half``): the first ``sections[0]``
    frequencies take axis 0, the next ``sections[1]`` axis 1, and so on. ``"interleaved"``
    (Qwen3-VL's ``apply_interleaved_mrope``): with ``n`` axes, frequency ``j`` takes axis
    ``a = j % n`` when ``a >= 1`` and ``j < n * sections[a]``, else axis 0, which takes all
    the others (``sections[0]`` is not read, as in transformers; with sections summing to
    ``half`` and ``n * sections[a] <= half`` it is the count of axis 0).
    ``"spatial_interleaved"`` (ERNIE 4.5-VL; sections summing to ``half``, those of axes
    ``1 .. n - 1`` alike): the first ``(n - 1) * sections[1]`` frequencies take axes ``1 .. n -
    1`` in turn (frequency ``j`` axis ``1 + j % (n - 1)``: H, W, H, W, ...), the last
    ``sections[0]`` axis 0 (T). ERNIE's ``mrope_section`` lists them (H, W, T): here they are
    in the positions' axis order (T, H, W).

    Examples:
        >>> from posenc.rotary.apply import section_map
        >>> section_map((2, 2, 2), "interleaved", 6)  # axes of frequencies 0..5: T H W T H W
        SectionMap(counts=(2, 2, 2), order=(0, 3, 1, 4, 2, 5))
        >>> section_map((2, 2, 2), "spatial_interleaved", 6)  # H W H W T T
        SectionMap(counts=(2, 2, 2), order=(4, 5, 0, 2, 1, 3))
    """
    check_choice("section_layout", layout, SECTION_LAYOUTS)
    if layout == "contiguous":
        return SectionMap(sections)
    n = len(sections)
    axis = [0] * half
    if layout == "spatial_interleaved":
        for j in range(min((n - 1) * sections[1], half)):
            axis[j] = 1 + j % (n - 1)
    else:
        for a in range(1, n):
            for j in range(a, min(n * sections[a], half), n):
                axis[j] = a
    counts = tuple(axis.count(a) for a in range(n))
    order = tuple(sorted(range(half), key=lambda j: (axis[j], j)))
    return SectionMap(counts, order)


_ORDERS: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def _order_on(order: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A section map's frequency order as an index tensor on ``device``, built once per
    device (not while tracing: a graph neither reads nor fills the cache)."""
    if tracing():
        return torch.tensor(order, device=device)
    key = (order, device)
    if key not in _ORDERS:
        if len(_ORDERS) >= 16:
            _ORDERS.clear()
        _ORDERS[key] = torch.tensor(order, device=device)
    return _ORDERS[key]


def _cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    attention_scale: float,
    sections: tuple[int, ...] | SectionMap | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rotary_cos_sin` on validated arguments."""
    if sections is None:
        theta = reduced_angles(positions, inv_freq)  # [*P, r/2] float64
    else:  # section a of the (reordered) frequencies takes the coordinate of axis a
        smap = sections if isinstance(sections, SectionMap) else SectionMap(sections)
        perm = smap.order
        w_all = inv_freq if perm is None else inv_freq[_order_on(perm, inv_freq.device)]
        blocks = torch.split(w_all, list(smap.counts))
        theta = torch.cat(
            [reduced_angles(positions[..., a], w) for a, w in enumerate(blocks)], dim=-1
        )  # [*P, r/2], frequencies in the order ``perm``
        if perm is not None:  # back to frequency order: column i is frequency perm[i]
            index = _order_on(perm, theta.device)
            theta = torch.empty_like(theta).index_copy_(-1, index, theta)
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
    check_rotary_input("x", x, layout, seq_dim)
    check_cos_sin(x, cos, sin, seq_dim)
    check_rotary_dim("x", x, cos, 2 * cos.shape[-1] if rotary_dim is None else rotary_dim)
    return dispatch_rotary(x, None, cos, sin, layout=layout, seq_dim=seq_dim)[0]
