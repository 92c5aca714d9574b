"""``fused_rotary(q, k, cos, sin)`` for a call shape already checked: one dictionary lookup.

A patched transformers model rotates with the cos/sin its rotary module handed over
(``posenc.integrations``' stand-in for ``apply_rotary_pos_emb``), 30 times a decoding step
on tensors of a few kilobytes, where the checks and layers of :func:`fused_rotary` cost
more than the fused loop. :func:`rotate_planned` serves the common call (q and k of one
dtype, plain CPU tensors, cos/sin already float32 rows with one set of strides, no
autograd, no tracing, the fused CPU path on) and returns ``None`` for anything else, which
then takes :func:`fused_rotary` with its full validation and messages.

The first call of a shape (q's, k's, cos's and sin's sizes, strides, dtypes and devices,
the layout, ``seq_dim``, torch's thread count) runs every check :func:`fused_rotary` and
the launch run, and remembers whether the shape is served; a later call of that shape
checks only what its key cannot hold (the tensor types, autograd, tracing) and launches.
Whatever it serves, :func:`fused_rotary` computes the same bits: the same loop on the same
tensors (``tests/rotary/test_planned.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from posenc._errors import PosEncError, transformed
from posenc.rotary.kernels import cpu as cpu_kernel
from posenc.rotary.kernels.backends import cpu_fast_path_ready, select_backend
from posenc.rotary.kernels.checks import check_cos_sin, check_rotary_dim, check_rotary_input
from posenc.rotary.kernels.dispatch import _check_k, _check_options
from posenc.rotary.kernels.ops import _COMPUTE, _tables, check_launch

__all__ = ["PLANS_MAX", "rotate_planned"]

#: Call shapes remembered per caller's dictionary (then forgotten all at once).
PLANS_MAX = 64
_NOT_SERVED = ()


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
    the common one (see the module docs), else ``None``; ``plans`` is the caller's own
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
        plan = _plan(q, k, cos, sin, layout, seq_dim)
        if len(plans) >= PLANS_MAX:
            plans.clear()
        plans[key] = plan
    if plan is _NOT_SERVED:
        return None
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    cpu_kernel.launch_cpu(
        [q, k], [q_out, k_out], cos, sin, plan, seq_dim=seq_dim,
        interleaved=layout == "interleaved", conjugate=False, inplace=False,
    )  # fmt: skip
    return q_out, k_out


def _plan(q, k, cos, sin, layout: str, seq_dim: int) -> tuple:
    """The cos/sin element strides the launch takes for this call shape, or
    :data:`_NOT_SERVED`: a check of :func:`fused_rotary` or of the launch refuses it (the
    general path then raises its message), it takes another backend, or cos/sin would be
    converted first."""
    try:
        check_rotary_input("q", q, layout, seq_dim)
        _check_k(q, k, seq_dim)
        check_cos_sin(q, cos, sin, seq_dim, name="q")
        check_rotary_dim("q", q, cos, None)
        _check_options(q, k, cos, sin, False, "auto")
        if q.dtype != k.dtype or select_backend(q, cos, sin) != "cpu":
            return _NOT_SERVED
        if q.device != cos.device or q.device != sin.device or k.device != q.device:
            return _NOT_SERVED
        check_launch("cpu", [q, k], cos, sin, seq_dim=seq_dim, inplace=False)
    except PosEncError:
        return _NOT_SERVED
    cos2, sin2, strides = _tables(cos, sin, _COMPUTE.get(q.dtype, torch.float32))
    if cos2 is not cos or sin2 is not sin:  # converted or copied: the general path's work
        return _NOT_SERVED
    return strides
