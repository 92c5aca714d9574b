"""The checks every rotary path shares (the plain rotation, the fused launches, the
public entries), all from metadata, never a device sync: :func:`check_rotary_input` (the
tensor and its options), :func:`check_rotary_dim`, :func:`check_cos_sin` (shapes and
device of cos/sin), :func:`check_devices` (q, k, cos and sin on one device) and
:func:`check_inplace_memory` (in place needs q and k in memory of their own: no expanded
or overlapping views, ``k`` not sharing ``q``'s), with :func:`memory_range`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posenc._errors import PosEncError, check_choice, check_int, check_tensor
from posenc.rotary.layout import LAYOUTS, SEQ_DIMS

__all__ = [
    "check_cos_sin",
    "check_devices",
    "check_inplace_memory",
    "check_rotary_dim",
    "check_rotary_input",
    "memory_range",
]


def check_rotary_input(name: str, x: Any, layout: Any, seq_dim: Any) -> None:
    """The tensor a public rotation takes (``x`` of :func:`posenc.apply_rotary`, ``q`` of
    :func:`posenc.rotary.kernels.fused_rotary`) and its options: floating, 4-D, a known
    ``layout`` and ``seq_dim``."""
    check_tensor(name, x, floating=True)
    check_choice("layout", layout, LAYOUTS)
    check_choice("seq_dim", seq_dim, SEQ_DIMS)
    if x.ndim != 4:
        raise PosEncError(
            f"{name} must be [b, h, s, d] (seq_dim=-2) or [b, s, h, d] (seq_dim=-3), "
            f"got shape {tuple(x.shape)}"
        )


def check_rotary_dim(name: str, x: torch.Tensor, cos: torch.Tensor, rotary_dim: Any) -> None:
    """``rotary_dim`` (``None``: not given) equals ``2 * cos.shape[-1]``, which is at most
    the last dimension of ``x`` (called ``name`` in messages)."""
    half = cos.shape[-1]
    if rotary_dim is not None:
        rotary_dim = check_int("rotary_dim", rotary_dim, min=2)
        if rotary_dim != 2 * half:
            raise PosEncError(
                f"rotary_dim must equal 2 * cos.shape[-1] = {2 * half}, got {rotary_dim}"
            )
    if 2 * half > x.shape[-1]:
        raise PosEncError(
            f"rotary_dim must be <= {name}'s last dimension {x.shape[-1]}, got {2 * half}"
        )


def check_cos_sin(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seq_dim: int, *, name: str = "x"
) -> None:
    """Validate ``cos``/``sin`` for ``x`` (called ``name`` in messages): floating, the same
    shape, ``[s, r/2]`` or ``[b, s, r/2]`` with ``s`` x's sequence length and ``b`` its
    batch size (or 1), on x's device."""
    check_tensor("cos", cos, floating=True)
    check_tensor("sin", sin, floating=True)
    if cos.shape != sin.shape:
        raise PosEncError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    seq_len, batch = x.shape[seq_dim], x.shape[0]
    if cos.ndim not in (2, 3) or cos.shape[-2] != seq_len:
        raise PosEncError(
            f"cos must be [s, r/2] or [b, s, r/2] with s == {seq_len} ({name}'s sequence length), "
            f"got shape {tuple(cos.shape)}"
        )
    if cos.ndim == 3 and cos.shape[0] not in (1, batch):
        raise PosEncError(
            f"cos of shape [b, s, r/2] must have b == {batch} ({name}'s batch size) or 1, "
            f"got shape {tuple(cos.shape)}"
        )
    device = x.device
    if cos.device != device or sin.device != device:
        other = cos.device if cos.device != device else sin.device
        raise PosEncError(f"cos and sin must be on {name}'s device {device}, got {other}")


def check_devices(
    q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """q, k (when given), cos and sin on one device (metadata only: no device sync)."""
    device = q.device
    if k is not None and k.device != device:
        raise PosEncError(f"k must be on q's device {device}, got {k.device}")
    if cos.device != device or sin.device != device:
        other = cos.device if cos.device != device else sin.device
        raise PosEncError(f"cos and sin must be on q's device {device}, got {other}")


def memory_range(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[start, end)`` from a tensor's first element to past its last (empty
    for an empty tensor); metadata only."""
    start = t.data_ptr()
    if t.is_contiguous():
        count = t.numel()
    else:
        count = 0 if 0 in t.shape else 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return start, start + count * t.element_size()


def _injective(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether no two elements of a strided view share memory (a sufficient test: sorted
    by stride, each dimension steps past everything the smaller ones reach)."""
    if 0 in sizes:
        return True
    reach = 0
    for n, st in sorted(((n, st) for n, st in zip(sizes, strides) if n > 1), key=lambda d: d[1]):
        if st <= reach:
            return False
        reach += (n - 1) * st
    return True


def _disjoint(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share no element of memory: their address ranges are
    apart, or (slices of one fused buffer, e.g. q and k of a qkv tensor) ``b`` is ``a``'s
    layout moved along one dimension past ``a``'s end, in a layout with no overlap.
    Anything else that shares a range counts as overlapping."""
    (a0, a_end), (b0, b_end) = memory_range(a), memory_range(b)
    if a_end <= b0 or b_end <= a0 or a0 == a_end or b0 == b_end:
        return True
    size = a.element_size()
    if a.stride() != b.stride() or b.element_size() != size or a0 == b0:
        return False
    if b0 < a0:
        a, b, a0, b0 = b, a, b0, a0
    delta, rest = divmod(b0 - a0, size)
    if rest:
        return False
    strides = a.stride()
    for i, st in enumerate(strides):
        if st <= 0 or delta % st or delta // st < a.shape[i]:
            continue
        # b is a's box shifted by delta // st along i: both sit in one larger view.
        sizes = [max(m, n) for m, n in zip(a.shape, b.shape)]
        sizes[i] = delta // st + b.shape[i]
        if _injective(sizes, strides):
            return True
    return False


def check_inplace_memory(xs: Sequence[torch.Tensor]) -> None:
    """In place, each of q (and k) must own its memory: no two elements of one tensor in
    the same place (``expand()`` and other stride-0 or overlapping views), and k sharing
    none of q's (``k is q`` would be rotated twice). Metadata only."""
    if len(xs) == 2 and xs[1] is xs[0]:  # first: the one check that reads no strides
        raise PosEncError(
            "inplace=True needs k and q in separate memory (each would be rotated twice), "
            "got k is q; use inplace=False or pass k=None"
        )
    for name, x in zip(("q", "k"), xs):
        if not x.is_contiguous() and not _injective(x.shape, x.stride()):
            raise PosEncError(
                f"inplace=True needs {name} with every element in memory of its own (not an "
                f"expand()ed or overlapping view), got {name} of shape {tuple(x.shape)} with "
                f"strides {x.stride()}; use inplace=False or {name}.contiguous()"
            )
    if len(xs) == 2 and not _disjoint(xs[0], xs[1]):
        raise PosEncError(
            "inplace=True needs k and q in separate memory (shared elements would be "
            "rotated twice), got k overlapping q's memory; use inplace=False"
        )
