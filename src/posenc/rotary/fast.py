"""The common rotary call in a few microseconds: ``RotaryEmbedding.forward`` on the CPU.

A decoding step rotates a few kilobytes; there the Python between the call and the fused
loop costs more than the loop. :func:`fast_forward` serves the call every model makes (q
and k of one dtype on the CPU, integer positions the cos/sin table holds, no autograd, no
tracing, the fused CPU path on) and returns ``None`` for anything else, which then takes
the general path with its full validation and messages. Whatever it accepts, the general
path accepts too and computes the same bits: the same table rows and the same loop;
``tests/rotary/test_fast.py`` compares the two on every case it serves.

What a call costs is what its shape has not already paid:

- **checked once per call shape.** The first call of a shape (q's and k's sizes, strides,
  dtypes and devices, the positions' sizes, strides, dtype and device, ``seq_dim``, torch's
  thread count) runs every check of the general launch
  (:func:`posenc.rotary.kernels.ops.check_launch` on the table's rows) and keeps the C
  loop's arguments as a template (:class:`_Plan`); a later call of that shape checks only
  what its key cannot hold (the tensor types, autograd, tracing) and writes six pointers;
- **gathered where it is rotated.** The positions are read and their cos/sin rows found
  inside the same foreign call that rotates (``posenc_rope_table_packed`` in
  ``rope_cpu.c``), which first checks every position lies in the table and otherwise
  writes nothing and answers 1: the call then takes the general path, which grows the
  table (or computes past its cap).

With the fused path off (``POSENC_CPU_FAST_PATH=0``, no compiler) the same call shapes
are served on the plain path (:func:`_plain_forward`): checked once per shape, then the
paired table's rows (cos and the partners' signed sin per channel,
:meth:`~posenc.rotary.cache.CosSinTable.lookup_paired`) and
:func:`posenc.rotary.kernels.plain.rotate_paired`, autograd included (a small 16-bit q and
k outside autograd: :func:`~posenc.rotary.kernels.plain.rotate_joined`, decided once per
call shape).

What a module hands it is a :class:`FastRotation`, built once at construction from the
module's public attributes (``cos_sin_table``, ``head_dim``, ``layout``); a module whose
rotation is not the table's (xPos, M-RoPE, position-dependent scalings) has none.
"""

from __future__ import annotations

import array
from typing import Any, NamedTuple

import torch

from posenc._errors import transformed
from posenc.rotary.cache import CosSinTable
from posenc.rotary.kernels import cpu as cpu_kernel
from posenc.rotary.kernels.backends import cpu_fast_path_off, cpu_fast_path_ready
from posenc.rotary.kernels.ops import check_launch
from posenc.rotary.kernels.plain import joinable, rotate_joined, rotate_paired

__all__ = ["FastRotation", "fast_forward"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INDEX = (torch.int64, torch.int32)
_PLANS_MAX = 64  # call shapes remembered per module (then forgotten all at once)
_NOT_SERVED = False  # a call shape the fast path leaves to the general one
_JOINED = "joined"  # a plain call shape whose q and k are rotated joined (plain.joinable)


class FastRotation(NamedTuple):
    """What :func:`fast_forward` needs of a rotary module whose cos/sin are its table's rows.

    Attributes:
        table: the module's ``cos_sin_table``.
        head_dim: the module's ``head_dim``: q and k must end in it.
        interleaved: the module's ``layout == "interleaved"``.
        plans: the call shapes seen, each with its :class:`_Plan` (or ``False``: not
            served); filled by :func:`fast_forward`.
        plain_plans: the call shapes seen with the fused path off, each ``True`` (served
            on the plain path), ``"joined"`` (served, q and k rotated joined) or ``False``;
            filled by :func:`fast_forward`.
    """

    table: CosSinTable
    head_dim: int
    interleaved: bool
    plans: dict
    plain_plans: dict


class _Plan(NamedTuple):
    """A call shape's checked arguments: the C loop's template and the table's half width."""

    template: array.array
    r2: int


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
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor:
        return None
    if not cpu_fast_path_ready():
        return _plain_forward(rotation, q, k, positions, seq_dim) if cpu_fast_path_off() else None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return None
    key = _served_key(q, k, positions, seq_dim)
    if key is None:  # vmap / grad (the plain path, which they see through), no strides
        return None
    plans = rotation.plans
    plan = plans.get(key, None)
    if plan is None:
        plan = _new_plan(rotation, q, k, positions, seq_dim)
        if plan is None:
            return None  # not this time (the table lacks these positions): not remembered
        if len(plans) >= _PLANS_MAX:
            plans.clear()
        plans[key] = plan
    if not isinstance(plan, _Plan):  # _NOT_SERVED
        return None
    table = rotation.table.current(torch.float32)
    if table is None:
        return None
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    args = array.array("q", plan.template)
    start = table.data_ptr()
    args[7], args[8], args[9], args[10] = (
        q.data_ptr(),
        k.data_ptr(),
        q_out.data_ptr(),
        k_out.data_ptr(),
    )
    args[11], args[12], args[16] = start, start + 4 * plan.r2, table.shape[0]
    if positions is not None:
        args[13] = positions.data_ptr()
    if cpu_kernel.table_entry()(args.buffer_info()[0]) != 0:
        return None  # a position outside the table: the general path grows it or computes
    return q_out, k_out


def _plain_forward(
    rotation: FastRotation,
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor | None,
    seq_dim: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The common call with the fused path off: a call shape the fused path would serve
    (:func:`_common`, :func:`_positions_layout`: the general path's checks all pass) is
    remembered as such, and its later calls go straight to the paired table's rows and
    :func:`~posenc.rotary.kernels.plain.rotate_paired`: the general path's rotation
    (autograd included) with the same bits, without its checks, position rules, dispatch
    and pairing of the tables (at a decoding step they cost as much as the rotation). A
    call shape whose q and k the plain path joins (a small 16-bit q and k:
    :func:`~posenc.rotary.kernels.plain.joinable`, asked on its first call) goes outside
    autograd to :func:`~posenc.rotary.kernels.plain.rotate_joined` without deciding again."""
    key = _served_key(q, k, positions, seq_dim)
    if key is None:  # vmap / grad (the general path, with its messages), no strides
        return None
    plans = rotation.plain_plans
    axis = 2 if seq_dim == -2 else 1
    serve = plans.get(key, None)
    seen = serve is not None
    if not seen:
        serve = _common(q, k, seq_dim, rotation.head_dim) and (
            _positions_layout(positions, q.shape[0], q.shape[axis]) is not _NOT_SERVED
        )
    if not serve:
        _remember(plans, key, serve, seen)
        return None
    layout = "interleaved" if rotation.interleaved else "half"
    table, seq = rotation.table, q.shape[axis]
    pairs = (
        table.leading_paired(seq, layout)
        if positions is None
        else table.lookup_paired(positions, layout)
    )
    if pairs is None:  # negative, or past the table's cap: the general path computes them
        return None  # (the shape is decided on a call the table holds)
    if not seen:  # whether q and k join is a function of the call shape: asked once
        serve = _JOINED if joinable(q, k, pairs[0], seq_dim=seq_dim) else True
        _remember(plans, key, serve, seen)
    if serve is _JOINED and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)):
        q_out, k_out = rotate_joined(q, k, *pairs, layout=layout, seq_dim=seq_dim)
    else:
        q_out, k_out = rotate_paired([q, k], *pairs, layout=layout, seq_dim=seq_dim)
    return q_out, k_out


def _remember(plans: dict, key: tuple, serve: Any, seen: bool) -> None:
    """Keep a new call shape's decision (at most ``_PLANS_MAX``, then forgotten all at once)."""
    if seen:
        return
    if len(plans) >= _PLANS_MAX:
        plans.clear()
    plans[key] = serve


def _served_key(q: torch.Tensor, k: torch.Tensor, positions: Any, seq_dim: int) -> tuple | None:
    """The call shape's :func:`_key`, or ``None`` for a call no plan serves: tensors of a
    ``torch.func`` transform, tensors without strides (sparse, nested), positions that are
    not a plain tensor."""
    if transformed(q, k, positions):
        return None
    try:
        return _key(q, k, positions, seq_dim)
    except (RuntimeError, NotImplementedError):  # no strides
        return None


def _key(q: torch.Tensor, k: torch.Tensor, positions: Any, seq_dim: int) -> tuple | None:
    """What a call shape is: everything a plan's checks read (``None``: positions that are
    not a plain tensor, never served)."""
    if positions is None:
        pos: tuple | None = None
    elif type(positions) is torch.Tensor:
        pos = (positions.shape, positions.stride(), positions.dtype, positions.device)
    else:
        return None
    return (
        q.shape,
        q.stride(),
        q.dtype,
        q.device,
        k.shape,
        k.stride(),
        k.dtype,
        k.device,
        pos,
        seq_dim,
        torch.get_num_threads(),
    )


def _new_plan(
    rotation: FastRotation,
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor | None,
    seq_dim: int,
) -> _Plan | bool | None:
    """The plan of this call's shape after every check of the general launch,
    ``_NOT_SERVED`` (never served), or ``None`` where the table does not hold this call's
    positions (negative, past its cap: the general path computes them)."""
    if not _common(q, k, seq_dim, rotation.head_dim):
        return _NOT_SERVED
    axis = 2 if seq_dim == -2 else 1
    batch, seq = q.shape[0], q.shape[axis]
    layout = _positions_layout(positions, batch, seq)
    if layout is _NOT_SERVED:
        return _NOT_SERVED
    rows = _rows(rotation.table, positions, batch, seq)  # grows the table as the call needs
    table = rotation.table.current(torch.float32)
    if rows is None or table is None:
        return None
    cos, sin = rows
    check_launch("cpu", [q, k], cos, sin, seq_dim=seq_dim, inplace=False)
    y_strides = [torch.empty_like(x).stride() for x in (q, k)]
    elements = q.numel() + k.numel()
    threads = torch.get_num_threads() if elements >= cpu_kernel.PARALLEL_MIN_ELEMENTS else 1
    r2 = cos.shape[-1]
    template = cpu_kernel.table_template(
        q.dtype,
        seq_dim,
        rotation.interleaved,
        threads,
        [(x.shape, x.stride(), ys) for x, ys in zip((q, k), y_strides)],
        r2,
        layout,  # type: ignore[arg-type]
    )
    return _Plan(template, r2)


def _positions_layout(
    positions: torch.Tensor | None, batch: int, seq: int
) -> tuple[int, int, int, int, int] | bool | None:
    """``(int32, batch, seq, batch stride, seq stride)`` of positions the common call has
    (``None`` for none: ``arange(seq)``), else ``_NOT_SERVED``."""
    if positions is None:
        return None
    if not (
        positions.dtype in _INDEX
        and positions.is_cpu
        and (positions.ndim == 1 or (positions.ndim == 2 and positions.shape[0] in (1, batch)))
        and positions.shape[-1] == seq
    ):
        return _NOT_SERVED
    int32 = positions.dtype == torch.int32
    if positions.ndim == 1:
        return int32, 1, seq, 0, positions.stride(0)
    pb = positions.shape[0]
    return int32, pb, seq, positions.stride(0) if pb > 1 else 0, positions.stride(1)


def _common(q: torch.Tensor, k: torch.Tensor, seq_dim: int, d: int) -> bool:
    """Whether q and k are the common call's: plain CPU tensors of one kernel dtype, 4-D
    with the same batch size and sequence length, ``d`` channels."""
    if (
        q.dtype not in _DTYPES
        or k.dtype is not q.dtype
        or not (q.is_cpu and k.is_cpu)
        or q.ndim != 4
        or k.ndim != 4
        or (seq_dim != -2 and seq_dim != -3)
        or q.layout is not torch.strided
        or k.layout is not torch.strided
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
    where the table does not hold them."""
    if positions is None:
        return table.leading(seq, torch.float32)  # arange(s): the table's first rows
    return table.lookup(positions, torch.float32)
