"""The common rotary call in a few microseconds: ``RotaryEmbedding.forward`` on the CPU.

A decoding step rotates a few kilobytes; there the Python between the call and the fused
loop costs more than the loop. :func:`fast_forward` serves the call every model makes (q
and k of one dtype on the CPU, integer positions the cos/sin table holds, no autograd, no
tracing, the fused CPU path on) with the checks that call needs, written for it, and
returns ``None`` for anything else, which then takes the general path with its full
validation and messages. Whatever it accepts, the general path accepts too and computes
the same bits: the same table rows, the same launch check
(:func:`posenc.rotary.kernels.ops.check_launch`, before any pointer is read) and the same
loop; ``tests/rotary/test_fast.py`` compares the two on every case it serves.
"""

from __future__ import annotations

from typing import Any

import torch

from posenc.rotary import kernels
from posenc.rotary.kernels import ops

__all__ = ["fast_forward"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INDEX = (torch.int64, torch.int32)


def fast_forward(
    rope: Any,  # a posenc.RotaryEmbedding (not imported: the module imports this file)
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor | None,
    seq_dim: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``rope(q, k, positions, seq_dim=seq_dim)`` (``k_positions`` not given), or ``None``
    where the call is not the common one (see the module docstring)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None  # first: a trace reads no state here (no guard on the CPU switch)
    table = rope._table
    if (
        table is None
        or not rope._fast  # a subclass with rotations of its own (xPos)
        or kernels._cpu_on is not True  # decided, and on (the first call decides)
        or type(q) is not torch.Tensor
        or type(k) is not torch.Tensor
        or q.dtype not in _DTYPES
        or k.dtype is not q.dtype
        or not (q.is_cpu and k.is_cpu)
        or q.ndim != 4
        or k.ndim != 4
        or (seq_dim != -2 and seq_dim != -3)
        or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
    ):
        return None
    axis = 2 if seq_dim == -2 else 1
    q_shape, k_shape = q.shape, k.shape
    seq, batch, d = q_shape[axis], q_shape[0], rope._head_dim
    if q_shape[3] != d or k_shape[3] != d or k_shape[0] != batch or k_shape[axis] != seq:
        return None
    if positions is None:
        rows = table.leading(seq, torch.float32)  # arange(s): the table's first rows
    elif (
        type(positions) is torch.Tensor
        and positions.dtype in _INDEX
        and positions.is_cpu
        and (positions.ndim == 1 or (positions.ndim == 2 and positions.shape[0] in (1, batch)))
        and positions.shape[-1] == seq
    ):
        rows = table.lookup(positions, torch.float32)
    else:
        return None
    if rows is None:
        return None
    cos, sin = rows
    q_out, k_out = ops.rotate_eager(  # the launch every path shares: check_launch first
        q,
        k,
        cos,
        sin,
        interleaved=rope._layout == "interleaved",
        seq_dim=seq_dim,
        backend="cpu",
        inplace=False,
    )
    return q_out, k_out  # type: ignore[return-value]
