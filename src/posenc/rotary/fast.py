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

What a module hands it is a :class:`FastRotation`, built once at construction from the
module's public attributes (``cos_sin_table``, ``head_dim``, ``layout``); a module whose
rotation is not the table's (xPos, M-RoPE, position-dependent scalings) has none.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from posenc.rotary.cache import CosSinTable
from posenc.rotary.kernels.backends import cpu_fast_path_ready
from posenc.rotary.kernels.ops import launch

__all__ = ["FastRotation", "fast_forward"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INDEX = (torch.int64, torch.int32)


class FastRotation(NamedTuple):
    """What :func:`fast_forward` needs of a rotary module whose cos/sin are its table's rows.

    Attributes:
        table: the module's ``cos_sin_table``.
        head_dim: the module's ``head_dim``: q and k must end in it.
        interleaved: the module's ``layout == "interleaved"``.
    """

    table: CosSinTable
    head_dim: int
    interleaved: bool


def fast_forward(
    rotation: FastRotation,
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor | None,
    seq_dim: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``rope(q, k, positions, seq_dim=seq_dim)`` (``k_positions`` not given) of the module
    ``rotation`` describes, or ``None`` where the call is not the common one (see the
    module docstring)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None  # first: a trace reads no state here (no guard on the CPU switch)
    if not (cpu_fast_path_ready() and _common(q, k, seq_dim, rotation.head_dim)):
        return None
    rows = _rows(rotation.table, positions, q.shape[0], q.shape[2 if seq_dim == -2 else 1])
    if rows is None:
        return None
    cos, sin = rows
    q_out, k_out = launch(  # the launch every path shares: check_launch first
        "cpu", [q, k], cos, sin, interleaved=rotation.interleaved, seq_dim=seq_dim, inplace=False
    )
    return q_out, k_out


def _common(q: torch.Tensor, k: torch.Tensor, seq_dim: int, d: int) -> bool:
    """Whether q and k are the common call's: plain CPU tensors of one kernel dtype, 4-D
    with the same batch size and sequence length, ``d`` channels, no autograd."""
    if (
        type(q) is not torch.Tensor
        or type(k) is not torch.Tensor
        or q.dtype not in _DTYPES
        or k.dtype is not q.dtype
        or not (q.is_cpu and k.is_cpu)
        or q.ndim != 4
        or k.ndim != 4
        or (seq_dim != -2 and seq_dim != -3)
        or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
    ):
        return False
    axis = 2 if seq_dim == -2 else 1
    q_shape, k_shape = q.shape, k.shape
    return (
        q_shape[3] == d
        and k_shape[3] == d
        and k_shape[0] == q_shape[0]
        and k_shape[axis] == q_shape[axis]
    )


def _rows(
    table: CosSinTable, positions: torch.Tensor | None, batch: int, seq: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The table's float32 cos/sin of ``positions`` (``None``: ``arange(seq)``), or ``None``
    for positions the common call does not have (or the table does not hold)."""
    if positions is None:
        return table.leading(seq, torch.float32)  # arange(s): the table's first rows
    if (
        type(positions) is torch.Tensor
        and positions.dtype in _INDEX
        and positions.is_cpu
        and (positions.ndim == 1 or (positions.ndim == 2 and positions.shape[0] in (1, batch)))
        and positions.shape[-1] == seq
    ):
        return table.lookup(positions, torch.float32)
    return None
