"""Sinusoidal encodings (Vaswani et al., 2017): fixed tables added to token embeddings.

``PE[p, 2i] = sin(p / base^(2i/dim))``, ``PE[p, 2i+1] = cos(p / base^(2i/dim))``; three
layouts (``LAYOUTS``): the paper's ``"interleaved"``, ``"half"`` (the same rates, all sines
then all cosines: the TensorFlow tutorial's concatenated table) and ``"flax"`` (all sines then
all cosines, rates ``base^(-i / (dim/2 - 1))``: Flax examples, tensor2tensor, T5X, MaxText,
fairseq).

Shapes: positions ``[*P]`` (int or float, negative allowed) -> table ``[*P, dim]``;
the module takes embeddings ``x: [b, s, dim]`` and positions ``[s]`` or ``[b, s]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
from torch import nn

import posenc.positions as _positions
from posenc._angles import reduced_angles
from posenc._base import AdditiveEncoding
from posenc._errors import (
    PosEncError,
    check_alloc,
    check_choice,
    check_dtype,
    check_float,
    check_int,
)
from posenc._layouts import LAYOUTS as PAIR_LAYOUTS
from posenc._layouts import Layout as PairLayout

__all__ = ["LAYOUTS", "ORDERS", "SinusoidalEmbedding", "sinusoidal_table", "sinusoidal_table_nd"]

#: The sinusoidal layouts: the two pairings RoPE shares (``posenc._layouts``) and ``"flax"``,
#: which only a sinusoidal table has (its rates differ, not only its channel order).
Layout = Literal[PairLayout, "flax"]
LAYOUTS: tuple[Layout, ...] = (*PAIR_LAYOUTS, "flax")
Order = Literal["sin_cos", "cos_sin"]
ORDERS = ("sin_cos", "cos_sin")


def _check_options(dim: int, base: float, layout: str, order: str) -> int:
    check_choice("layout", layout, LAYOUTS)
    check_choice("order", order, ORDERS)
    check_float("base", base, min=1.0, min_exclusive=True)
    dim = check_int("dim", dim, min=1)
    if layout == "flax" and dim < 4:
        # rates log-spaced over dim // 2 - 1 steps: none for dim < 4 (Flax's sinusoidal_init
        # gives NaN there, fairseq divides by zero, tensor2tensor clamps the step count to 1)
        raise PosEncError(
            f"dim must be >= 4 for layout='flax' (rates spaced over dim // 2 - 1 steps), got {dim}"
        )
    return dim


def _frequencies(dim: int, base: float, layout: str, device: torch.device) -> torch.Tensor:
    """The rates of the first member of each pair, float64 ``[n]``: ``base^(-2i/dim)`` for
    ``i < ceil(dim/2)``, or for ``"flax"`` ``base^(-i/(n-1))`` for ``i < n = dim // 2`` (the
    last exactly ``1 / base``)."""
    if layout == "flax":
        n = dim // 2
        exponent = torch.arange(n, dtype=torch.float64, device=device) / (n - 1)
    else:
        exponent = torch.arange((dim + 1) // 2, dtype=torch.float64, device=device) * 2.0 / dim
    return float(base) ** -exponent


def sinusoidal_table(
    positions: torch.Tensor | Sequence[float],
    dim: int,
    *,
    base: float = 10000.0,
    layout: Layout = "interleaved",
    order: Order = "sin_cos",
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The sinusoidal table at the given positions.

    Args:
        positions: int or float positions of any shape (fractional and negative allowed).
        dim: number of channels, ``>= 1``; odd allowed.
        base: the wavelength base (10000 in the paper).
        layout: ``"interleaved"`` pairs channels ``(2i, 2i+1)`` as in the paper;
            ``"half"`` puts all sines first, then all cosines, with the same
            frequencies (the TensorFlow tutorial's concatenated ``positional_encoding``).
            For odd ``dim``, interleaved follows the formula (the last channel is the first
            member of the next pair) and half gives the extra column to the first block.
            ``"flax"``: all sines, then all cosines, at the rates ``base^(-i / (n - 1))``,
            ``i < n = dim // 2``, log-spaced so the last is exactly ``1 / base`` (Flax
            examples' ``sinusoidal_init``, tensor2tensor's ``get_timing_signal_1d``, T5X,
            MaxText, fairseq); odd ``dim`` gets a zero last channel, and ``dim >= 4``.
        order: ``"sin_cos"`` (the paper) or ``"cos_sin"`` (cosine first in each pair).
        dtype: output dtype (default: torch's default dtype). Values are computed in
            float64 and rounded once.
        device: output device (default: that of ``positions``).

    Shape:
        positions ``[*P]`` -> ``[*P, dim]``.

    Examples:
        >>> import torch, posenc
        >>> posenc.sinusoidal_table(torch.arange(3), 4)  # [sin p, cos p, sin(p/100), cos(p/100)]
        tensor([[ 0.0000,  1.0000,  0.0000,  1.0000],
                [ 0.8415,  0.5403,  0.0100,  0.9999],
                [ 0.9093, -0.4161,  0.0200,  0.9998]])
    """
    dim = _check_options(dim, base, layout, order)
    pos = _positions.as_tensor(positions, device=device)
    dtype = torch.get_default_dtype() if dtype is None else check_dtype("dtype", dtype)
    # float64 angles, sines and cosines before the table: about 3 tables of float64
    check_alloc("dim", dim, (3, pos.numel(), dim), torch.float64, pos.device)
    return _table(pos, dim, base, layout, order, dtype)


def _table(
    pos: torch.Tensor, dim: int, base: float, layout: str, order: str, dtype: torch.dtype
) -> torch.Tensor:
    """:func:`sinusoidal_table` of validated arguments."""
    n_second = dim // 2
    frequencies = _frequencies(dim, base, layout, pos.device)  # [n_first]
    theta = reduced_angles(pos, frequencies)  # [*P, n_first] float64
    first, second = (torch.sin, torch.cos) if order == "sin_cos" else (torch.cos, torch.sin)
    a = first(theta)
    b = second(theta[..., :n_second])
    if layout == "half":
        table = torch.cat([a, b], dim=-1)
    elif layout == "flax":  # [first | second | 0 for odd dim]
        table = torch.cat([a, b, a.new_zeros(*pos.shape, dim - 2 * n_second)], dim=-1)
    else:
        table = torch.empty(*pos.shape, dim, dtype=torch.float64, device=pos.device)
        table[..., 0::2] = a
        table[..., 1::2] = b
    return table.to(dtype)


def sinusoidal_table_nd(
    grid: Sequence[int] | torch.Tensor,
    dim: int,
    *,
    base: float = 10000.0,
    layout: Layout = "interleaved",
    order: Order = "sin_cos",
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """N-D sinusoidal table: channels split evenly across axes, axis 0 first.

    Each block of ``dim / n_axes`` channels is the 1-D table (same options) of that
    axis' coordinate, as in image and video transformers.

    Args:
        grid: a shape such as ``(H, W)`` or ``(T, H, W)``, or a coordinate tensor
            ``[..., n_axes]`` (e.g. from :func:`posenc.positions.grid`).
        dim: total channels; must be divisible by the number of axes.

    Shape:
        ``(n_0, ..., n_{k-1})`` -> ``[n_0, ..., n_{k-1}, dim]``; coordinates ``[..., k]`` -> ``[..., dim]``.

    Examples:
        >>> import posenc
        >>> posenc.sinusoidal_table_nd((2, 3), 8).shape
        torch.Size([2, 3, 8])
    """
    dim = _check_options(dim, base, layout, order)
    if isinstance(grid, torch.Tensor):
        if grid.ndim < 1 or grid.shape[-1] < 1:
            raise PosEncError(
                f"grid coordinates must be [..., n_axes], got shape {tuple(grid.shape)}"
            )
        coords = _positions.as_tensor(grid, device=device)
    else:
        coords = _positions.grid_of(grid, device=device, name="grid")
    n_axes = coords.shape[-1]
    if dim % n_axes:
        raise PosEncError(f"dim must be divisible by the number of axes ({n_axes}), got {dim}")
    if layout == "flax" and dim // n_axes < 4:
        raise PosEncError(
            f"dim {dim} over {n_axes} axes gives {dim // n_axes} channels per axis; "
            "layout='flax' needs >= 4 per axis (rates spaced over channels // 2 - 1 steps): "
            f"dim >= {4 * n_axes}"
        )
    blocks = [
        sinusoidal_table(
            coords[..., a], dim // n_axes, base=base, layout=layout, order=order, dtype=dtype
        )
        for a in range(n_axes)
    ]
    return torch.cat(blocks, dim=-1)


def _check_scale_fits(scale: float, dtype: torch.dtype, what: str) -> None:
    """``|scale|`` at most the largest finite value of ``dtype``: ``scale * PE`` (``|PE| <=
    1``) rounded to it stays finite (``scale=1e308`` gave ``inf`` embeddings)."""
    top = float(torch.finfo(dtype).max)
    if abs(scale) > top:
        raise PosEncError(
            f"scale must be within +-{top:.4g} (finite in {dtype}, {what}), got {scale:g}"
        )


class _RoundedAdd(torch.autograd.Function):
    """``(x + addend)`` formed in float64 (``addend`` is float64) and rounded once to ``x``'s
    dtype, with the gradient autograd would give: the casts of the gradient are exact, so it
    passes through as it is. Saves a float64 copy of ``x`` forward and two full-size
    conversions backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, addend: torch.Tensor) -> torch.Tensor:
        ctx.addend_shape = addend.shape
        return torch.add(x, addend).to(x.dtype)  # promoted to float64 as it is read

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        grad_addend = None
        if ctx.needs_input_grad[1]:  # a learnable scale: summed to the table's shape
            grad_addend = grad.double().sum_to_size(ctx.addend_shape)
        return grad if ctx.needs_input_grad[0] else None, grad_addend


class SinusoidalEmbedding(AdditiveEncoding):
    """Adds the sinusoidal table to token embeddings: ``dropout(x + scale * PE)``.

    The table is computed from the positions in float64 at every call (no cache,
    nothing in ``state_dict``), so ``.to(torch.bfloat16)`` never lowers its precision:
    ``x + scale * PE`` is formed in float64 and rounded once, to ``x``'s dtype.

    Args:
        dim: embedding size.
        base, layout, order: as in :func:`sinusoidal_table`.
        dropout: dropout probability applied after the addition.
        scale: multiplier of the table, finite; a call refuses one beyond the range of its
            embeddings' dtype (``scale * PE`` would round to ``inf``), a learnable one is
            refused here beyond that of the default dtype (its parameter's).
        learnable_scale: make ``scale`` a trained parameter (as in ESPnet's ScaledPositionalEncoding).

    Shape:
        ``x: [b, s, dim]``, ``positions: [s]`` or ``[b, s]`` (``None``: ``arange(s) + offset``)
        -> ``[b, s, dim]``.

    Examples:
        >>> import torch, posenc
        >>> pe = posenc.SinusoidalEmbedding(8)
        >>> pe(torch.zeros(1, 3, 8)).shape
        torch.Size([1, 3, 8])
    """

    name: ClassVar[str] = "sinusoidal"

    def __init__(
        self,
        dim: int,
        *,
        base: float = 10000.0,
        layout: Layout = "interleaved",
        order: Order = "sin_cos",
        dropout: float = 0.0,
        scale: float = 1.0,
        learnable_scale: bool = False,
    ) -> None:
        super().__init__()
        self.dim = _check_options(dim, base, layout, order)
        self.base, self.layout, self.order = float(base), layout, order
        dropout = check_float("dropout", dropout, min=0.0, max=1.0)
        scale = check_float("scale", scale)
        learnable_scale = check_choice("learnable_scale", learnable_scale, (True, False))
        self.dropout = nn.Dropout(dropout)
        self.scale: nn.Parameter | float
        if learnable_scale:
            _check_scale_fits(scale, torch.get_default_dtype(), "the parameter's dtype")
            self.scale = nn.Parameter(torch.tensor(scale))
        else:
            self.scale = scale
        self._set_config(
            dim=self.dim,
            base=self.base,
            layout=layout,
            order=order,
            dropout=dropout,
            scale=scale,
            learnable_scale=bool(learnable_scale),
        )

    def table(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The table at ``positions`` (``[*P]`` -> ``[*P, dim]``), float32 by default."""
        return sinusoidal_table(
            positions,
            self.dim,
            base=self.base,
            layout=self.layout,
            order=self.order,
            dtype=dtype,
        )

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, *, offset: int = 0
    ) -> torch.Tensor:
        pos = self._embeddings_positions(x, positions, offset)
        if not isinstance(self.scale, torch.Tensor):
            _check_scale_fits(self.scale, x.dtype, "x's dtype")
        # [s, dim] or [b, s, dim], exact in float64 (positions validated once, by resolve)
        pe = _table(pos, self.dim, self.base, self.layout, self.order, torch.float64)
        scale = self.scale.double() if isinstance(self.scale, torch.Tensor) else self.scale
        # the sum is formed in float64 and rounded once, to x's dtype: a bf16 model gets
        # exactly (x + PE) rounded, never a bf16 table
        return self.dropout(_RoundedAdd.apply(x, scale * pe))
