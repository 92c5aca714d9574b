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
"""

from __future__ import annotations

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
)
from posenc.rotary.kernels import dispatch_rotary

__all__ = [
    "LAYOUTS",
    "SEQ_DIMS",
    "apply_rotary",
    "check_sections",
    "rotary_cos_sin",
    "xpos_scale",
]

Layout = Literal["half", "interleaved"]
LAYOUTS = ("half", "interleaved")
SEQ_DIMS = (-2, -3)


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
    check_finite("inv_freq", inv_freq)
    attention_scale = check_float("attention_scale", attention_scale)
    check_dtype("dtype", dtype)
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


def xpos_scale(positions: torch.Tensor, rotary_dim: int, scale_base: float) -> torch.Tensor:
    """xPos (Sun et al., 2022): ``zeta_i ^ (n / scale_base)`` with
    ``zeta_i = (2i + 0.4 r) / (1.4 r)``, in float64.

    Queries are multiplied by it and keys by its inverse, so ``q_m . k_n`` carries
    ``zeta^((m - n) / scale_base)``: attention decays with distance. Used through
    ``RotaryEmbedding(xpos_scale_base=...)`` / :class:`posenc.XPosEmbedding`.

    Shape: positions ``[*P]`` -> ``[*P, r/2]``.
    """
    i = torch.arange(rotary_dim // 2, dtype=torch.float64, device=positions.device)
    log_zeta = torch.log((2 * i + 0.4 * rotary_dim) / (1.4 * rotary_dim))  # [r/2]
    return torch.exp(positions.to(torch.float64).unsqueeze(-1) / scale_base * log_zeta)


def _check_cos_sin(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seq_dim: int) -> None:
    check_tensor("cos", cos, floating=True)
    check_tensor("sin", sin, floating=True)
    if cos.shape != sin.shape:
        raise PosEncError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    seq_len, batch = x.shape[seq_dim], x.shape[0]
    if cos.ndim not in (2, 3) or cos.shape[-2] != seq_len:
        raise PosEncError(
            f"cos must be [s, r/2] or [b, s, r/2] with s == {seq_len} (x's sequence length), "
            f"got shape {tuple(cos.shape)}"
        )
    if cos.ndim == 3 and cos.shape[0] not in (1, batch):
        raise PosEncError(
            f"cos of shape [b, s, r/2] must have b == {batch} (x's batch size) or 1, "
            f"got shape {tuple(cos.shape)}"
        )


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
    _check_cos_sin(x, cos, sin, seq_dim)
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
    return _rotate(x, cos, sin, layout, seq_dim)


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, seq_dim: int
) -> torch.Tensor:
    """The one place every rotation goes through (``apply_rotary`` and the modules),
    on already validated arguments. Fused kernels dispatch from here; the plain torch
    path below is the twin they are proven equal to."""
    return dispatch_rotary(x, None, cos, sin, layout=layout, seq_dim=seq_dim)[0]


def _apply_rotary_torch(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    seq_dim: int = -2,
) -> torch.Tensor:
    """Plain torch rotation (no validation): the reference the fast paths are tested against.

    ``x: [b, h, s, d]`` or ``[b, s, h, d]``; ``cos, sin: [s, r/2]`` or ``[b, s, r/2]``.
    """
    half = cos.shape[-1]
    rotary_dim = 2 * half
    compute = torch.promote_types(x.dtype, torch.float32)  # float32 math for bf16/fp16
    # Views that broadcast over heads: [.., s, r/2] -> [b|1, 1, s, r/2] or [b|1, s, 1, r/2].
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]  # [1, s, r/2]
    head_axis = 1 if seq_dim == -2 else 2
    c = cos.unsqueeze(head_axis).to(compute)
    s = sin.unsqueeze(head_axis).to(compute)
    x_rot = x[..., :rotary_dim]  # a view; channels past rotary_dim are untouched
    if layout == "half":
        x1, x2 = x_rot[..., :half].to(compute), x_rot[..., half:].to(compute)
    else:
        x1, x2 = x_rot[..., 0::2].to(compute), x_rot[..., 1::2].to(compute)
    o1 = x1 * c - x2 * s  # [b, h, s, r/2]
    o2 = x2 * c + x1 * s
    if layout == "half":
        out = torch.cat([o1, o2], dim=-1)
    else:
        out = torch.stack([o1, o2], dim=-1).flatten(-2)  # (o1_0, o2_0, o1_1, o2_1, ...)
    out = out.to(x.dtype)  # the one rounding to x's dtype
    if rotary_dim < x.shape[-1]:
        out = torch.cat([out, x[..., rotary_dim:]], dim=-1)
    return out
