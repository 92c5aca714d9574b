"""The words every rotary module shares: the two pairing layouts, the two sequence axes,
and the rule for ``head_dim`` / ``rotary_dim``.

- ``layout="half"``: channel ``i`` pairs with ``i + r/2`` (GPT-NeoX, Llama as ported to
  transformers, Qwen, ...);
- ``layout="interleaved"``: channel ``2i`` pairs with ``2i + 1`` (RoFormer, GPT-J, Meta's
  original Llama checkpoints, rotary-embedding-torch).

``seq_dim=-2`` means queries and keys are ``[b, h, s, d]``, ``seq_dim=-3`` ``[b, s, h, d]``.

``LAYOUTS`` and ``Layout`` are :mod:`posenc._layouts`' (the one layout tuple, shared with
the sinusoidal tables), re-exported here. This module is the bottom of
:mod:`posenc.rotary`: it imports nothing from it, so every other rotary module (the kernels
included) may import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posenc._errors import PosEncError, check_int
from posenc._layouts import LAYOUTS, Layout

__all__ = ["LAYOUTS", "SEQ_DIMS", "Layout", "bshd_order", "check_rotary_dims"]

SEQ_DIMS = (-2, -3)


def bshd_order(
    shape: Sequence[int], strides: Sequence[int], seq_dim: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Sizes and strides of a 4-D q/k tensor in ``(b, s, h, d)`` order: swapped from
    ``[b, h, s, d]`` for ``seq_dim=-2``, as they are for ``[b, s, h, d]`` (``-3``)."""
    b, n1, n2, d = shape
    sb, s1, s2, sd = strides
    if seq_dim == -2:
        return (b, n2, n1, d), (sb, s2, s1, sd)
    return (b, n1, n2, d), (sb, s1, s2, sd)


def check_rotary_dims(head_dim: Any, rotary_dim: Any) -> tuple[int, int]:
    """Validate ``head_dim`` and ``rotary_dim`` (``None``: the whole head): both even,
    ``rotary_dim <= head_dim``."""
    head_dim = check_int("head_dim", head_dim, min=2)
    if head_dim % 2:
        raise PosEncError(f"head_dim must be even (RoPE rotates pairs of channels), got {head_dim}")
    rotary_dim = head_dim if rotary_dim is None else check_int("rotary_dim", rotary_dim, min=2)
    if rotary_dim % 2:
        raise PosEncError(
            f"rotary_dim must be even (RoPE rotates pairs of channels), got {rotary_dim}"
        )
    if rotary_dim > head_dim:
        raise PosEncError(f"rotary_dim must be <= head_dim ({head_dim}), got {rotary_dim}")
    return head_dim, rotary_dim
