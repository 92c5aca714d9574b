"""The common CPU rotation in a few microseconds: a call shape checked once, then one launch.

A decoding step rotates a few kilobytes, where the Python between a call and the fused loop
costs more than the loop. Two callers make that call many times a step:

- :func:`fast_forward`: ``RotaryEmbedding.forward`` (positions read from the module's
  cos/sin table inside the C call, ``posenc_rope_table_packed``; with the fused path off,
  the torch engine on the table's rows);
- :func:`rotate_planned`: transformers' ``apply_rotary_pos_emb`` in a patched model (the
  cos/sin its rotary module handed over, ``posenc_rope_packed``).

Both serve only the common call (q and k of one kernel dtype, plain CPU tensors, no
tracing; no autograd on the fused path) and return ``None`` for anything else, which then
takes the general path with its full validation and messages. The first call of a call
shape (sizes, strides, dtypes and devices, ``seq_dim``, the switch, torch's thread count)
runs every check of the general path and keeps a :class:`Plan` (the C arguments as a
template, written by :mod:`posenc.rotary.kernels.cpu`'s named ``SLOT_*``; or the torch
engine) or :data:`NOT_SERVED`; a later call checks only what the key cannot hold. Whatever
is served computes the bits of the general path: the same engine on the same rows
(``tests/rotary/test_fast.py``, ``test_planned.py``).
"""

from __future__ import annotations

import array
from typing import Any, NamedTuple

import torch

from posenc._errors import PosEncError, transformed
from posenc.rotary.kernels import cpu as cpu_kernel
from posenc.rotary.kernels.backends import (
    cpu_fast_path_off,
    cpu_fast_path_ready,
    select_backend,
)
from posenc.rotary.kernels.checks import check_cos_sin, check_rotary_dim, check_rotary_input
from posenc.rotary.kernels.cpu import (
    SLOT_COS,
    SLOT_K,
    SLOT_K_OUT,
    SLOT_POSITIONS,
    SLOT_Q,
    SLOT_Q_OUT,
    SLOT_ROWS,
    SLOT_SIN,
)
from posenc.rotary.kernels.dispatch import _check_k, _check_options
from posenc.rotary.kernels.ops import _COMPUTE, _tables, check_launch
from posenc.rotary.kernels.torch_engine import rotate_paired

__all__ = ["NOT_SERVED", "PLANS_MAX", "FastRotation", "Plan", "fast_forward", "rotate_planned"]

#: Call shapes remembered per caller's dictionary (then forgotten all at once).
PLANS_MAX = 64
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INDEX = (torch.int64, torch.int32)


class Plan(NamedTuple):
    """A call shape's checked plan: the engine that serves it (``"cpu"``: the C loop with
    ``template``, its arguments with the pointers left 0; ``"torch"``: the torch engine, the
    fused path off) and ``r2``, half the rotary dim (the table's sin starts ``r2`` floats
    after its cos)."""

    template: array.array
    r2: int
    engine: str = "cpu"


#: What a call shape that is never served is remembered as.
NOT_SERVED = Plan(array.array("q"), 0, "none")
_EMPTY = array.array("q")


def _remember(plans: dict, key: tuple, plan: Plan) -> None:
    if len(plans) >= PLANS_MAX:
        plans.clear()
    plans[key] = plan


# ---- RotaryEmbedding.forward: rows of the module's table ------------------------------


class FastRotation(NamedTuple):
    """What :func:`fast_forward` needs of a rotary module whose cos/sin are its table's rows:
    its ``cos_sin_table`` (:class:`posenc.rotary.cache.CosSinTable`), ``head_dim``, whether
    its layout is interleaved, and ``plans``, the call shapes seen (filled here)."""

    table: Any
    head_dim: int
    interleaved: bool
    plans: dict


def fast_forward(
    rotation: FastRotation,
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor | None,
    seq_dim: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``rope(q, k, positions, seq_dim=seq_dim)`` of the module ``rotation`` describes, or
    ``None`` where the call is not the common one (see the module docstring). With the fused
    path off the same call shapes go to the torch engine, autograd included."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None  # first: a trace reads no state here (no guard on the CPU switch)
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(seq_dim) is not int:
        return None
    if positions is not None and type(positions) is not torch.Tensor:
        return None  # a list, a number, an array: the general path's checks name it
    fused = cpu_fast_path_ready()
    if fused:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            return None
    elif not cpu_fast_path_off():
        return None  # not decided yet: the general path decides
    if transformed(q, k, positions):
        return None  # vmap / grad: the general path, which they see through
    try:
        pos = None if positions is None else (positions.shape, positions.stride(),
                                              positions.dtype, positions.device)  # fmt: skip
        key = (
            q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
            pos, seq_dim, fused, torch.get_num_threads(),
        )  # fmt: skip
    except (RuntimeError, NotImplementedError):  # no strides (sparse, nested tensors)
        return None
    plan = rotation.plans.get(key)
    if plan is None:
        plan = _table_plan(rotation, q, k, positions, seq_dim, fused)
        if plan is None:
            return None  # not this time (the table lacks these positions): not remembered
        _remember(rotation.plans, key, plan)
    if plan.engine == "torch":
        return _torch_engine(rotation, q, k, positions, seq_dim)
    if plan is NOT_SERVED:
        return None
    table = rotation.table.current(torch.float32)
    if table is None:
        return None
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    args = array.array("q", plan.template)
    start = table.data_ptr()
    args[SLOT_Q], args[SLOT_K] = q.data_ptr(), k.data_ptr()
    args[SLOT_Q_OUT], args[SLOT_K_OUT] = q_out.data_ptr(), k_out.data_ptr()
    args[SLOT_COS], args[SLOT_SIN], args[SLOT_ROWS] = start, start + 4 * plan.r2, table.shape[0]
    if positions is not None:
        args[SLOT_POSITIONS] = positions.data_ptr()
    if cpu_kernel.table_entry()(args.buffer_info()[0]) != 0:
        return None  # a position outside the table: the general path grows it or computes
    return q_out, k_out


def _torch_engine(rotation: FastRotation, q, k, positions, seq_dim: int) -> tuple | None:
    """The torch engine on the paired table's rows (cos and the partners' signed sin per
    channel, :meth:`~posenc.rotary.cache.CosSinTable.lookup_paired`: the values the general
    path pairs on every call, the same bits), or ``None`` where the table does not hold the
    positions."""
    layout = "interleaved" if rotation.interleaved else "half"
    table = rotation.table
    pairs = (
        table.leading_paired(q.shape[2 if seq_dim == -2 else 1], layout)
        if positions is None
        else table.lookup_paired(positions, layout)
    )
    if pairs is None:
        return None
    q_out, k_out = rotate_paired([q, k], *pairs, layout=layout, seq_dim=seq_dim)
    return q_out, k_out


def _table_plan(
    rotation: FastRotation,
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor | None,
    seq_dim: int,
    fused: bool,
) -> Plan | None:
    """The plan of this call shape after every check of the general launch,
    :data:`NOT_SERVED`, or ``None`` where the table does not hold this call's positions
    (negative, past its cap: the general path computes them)."""
    if not _common(q, k, seq_dim, rotation.head_dim):
        return NOT_SERVED
    axis = 2 if seq_dim == -2 else 1
    batch, seq = q.shape[0], q.shape[axis]
    layout = _positions_layout(positions, batch, seq)
    if layout is NOT_SERVED:
        return NOT_SERVED
    if not fused:  # the general path's checks all pass: its rotation, without them
        return Plan(_EMPTY, 0, "torch")
    rows = _rows(rotation.table, positions, seq)  # grows the table as the call needs
    if rows is None or rotation.table.current(torch.float32) is None:
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
    return Plan(template, r2)


def _rows(table: Any, positions: torch.Tensor | None, seq: int) -> Any:
    """The table's float32 cos/sin of ``positions`` (``None``: ``arange(seq)``), or ``None``
    where the table does not hold them."""
    if positions is None:
        return table.leading(seq, torch.float32)  # arange(s): the table's first rows
    return table.lookup(positions, torch.float32)


def _positions_layout(positions: torch.Tensor | None, batch: int, seq: int) -> Any:
    """``(int32, batch, seq, batch stride, seq stride)`` of positions the common call has
    (``None`` for none: ``arange(seq)``), else :data:`NOT_SERVED`."""
    if positions is None:
        return None
    if not (
        positions.dtype in _INDEX
        and positions.is_cpu
        and (positions.ndim == 1 or (positions.ndim == 2 and positions.shape[0] in (1, batch)))
        and positions.shape[-1] == seq
    ):
        return NOT_SERVED
    int32 = positions.dtype == torch.int32
    if positions.ndim == 1:
        return int32, 1, seq, 0, positions.stride(0)
    pb = positions.shape[0]
    return int32, pb, seq, positions.stride(0) if pb > 1 else 0, positions.stride(1)


def _common(q: torch.Tensor, k: torch.Tensor, seq_dim: int, d: int) -> bool:
    """Whether q and k are the common call's: strided CPU tensors of one kernel dtype, 4-D
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
    return (
        q.shape[3] == d
        and k.shape[3] == d
        and k.shape[0] == q.shape[0]
        and k.shape[axis] == q.shape[axis]
    )


# ---- a patched transformers apply: the cos/sin it was handed ----------------------------


def rotate_planned(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str,
    seq_dim: int,
    plans: dict[tuple, Any],
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``fused_rotary(q, k, cos, sin, layout=layout, seq_dim=seq_dim)`` where the call is
    the common one (see the module docstring), else ``None``; ``plans`` is the caller's own
    dictionary of call shapes (one per apply function)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None
    plain = torch.Tensor
    if not cpu_fast_path_ready() or not (
        type(q) is plain and type(k) is plain and type(cos) is plain and type(sin) is plain
    ):
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return None
    if transformed(q, k, cos, sin):
        return None
    try:
        key = (
            q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
            cos.shape, cos.stride(), cos.dtype, cos.device, sin.shape, sin.stride(),
            sin.dtype, sin.device, cos.requires_grad or sin.requires_grad, layout, seq_dim,
            torch.get_num_threads(),
        )  # fmt: skip
    except (RuntimeError, NotImplementedError):  # no strides (sparse, nested tensors)
        return None
    plan = plans.get(key)
    if plan is None:
        plan = _given_plan(q, k, cos, sin, layout, seq_dim)
        _remember(plans, key, plan)
    if plan is NOT_SERVED:
        return None
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    args = array.array("q", plan.template)
    args[SLOT_Q], args[SLOT_K] = q.data_ptr(), k.data_ptr()
    args[SLOT_Q_OUT], args[SLOT_K_OUT] = q_out.data_ptr(), k_out.data_ptr()
    args[SLOT_COS], args[SLOT_SIN] = cos.data_ptr(), sin.data_ptr()
    rc = cpu_kernel.packed_entry()(args.buffer_info()[0])
    if rc != 0:  # pragma: no cover - the checks of the plan and the C switch agree
        raise RuntimeError(f"posenc's CPU rotary kernel failed with code {rc}")
    return q_out, k_out


def _given_plan(q, k, cos, sin, layout: str, seq_dim: int) -> Plan:
    """The plan of this call shape, or :data:`NOT_SERVED`: a check of
    :func:`~posenc.rotary.kernels.fused_rotary` or of the launch refuses it (the general
    path then raises its message), it takes another backend, or cos/sin would be converted
    first."""
    try:
        check_rotary_input("q", q, layout, seq_dim)
        _check_k(q, k, seq_dim)
        check_cos_sin(q, cos, sin, seq_dim, name="q")
        check_rotary_dim("q", q, cos, None)
        _check_options(q, k, cos, sin, False, "auto")
        if q.dtype != k.dtype or select_backend(q, cos, sin) != "cpu":
            return NOT_SERVED
        if q.device != cos.device or q.device != sin.device or k.device != q.device:
            return NOT_SERVED
        check_launch("cpu", [q, k], cos, sin, seq_dim=seq_dim, inplace=False)
    except PosEncError:
        return NOT_SERVED
    cos2, sin2, strides = _tables(cos, sin, _COMPUTE.get(q.dtype, torch.float32))
    if cos2 is not cos or sin2 is not sin:  # converted or copied: the general path's work
        return NOT_SERVED
    y_strides = [torch.empty_like(x).stride() for x in (q, k)]
    template = cpu_kernel.packed_template(
        [q, k], y_strides, cos, strides, seq_dim=seq_dim, interleaved=layout == "interleaved"
    )
    return Plan(template, cos.shape[-1])
