"""The fused rotation as torch custom ops, with autograd.

``posenc::rotary`` (out of place) and ``posenc::rotary_`` (in place) are
``torch.library.custom_op`` s: ``torch.compile(fullgraph=True)`` treats them as opaque
calls (shapes from ``register_fake``) instead of breaking the graph, and
``register_autograd`` gives the out-of-place op its backward, which is the same op with
the inverse rotation (sin negated): the Jacobian of a rotation is its transpose.

``backend`` names the launcher: ``"triton"`` (any device Triton runs on, including CPU
tensors under ``TRITON_INTERPRET=1``) or ``"cpu"`` (the compiled C loop).

Every launch passes through :func:`launch`, which checks everything a launcher reads
(:func:`check_launch`: devices, dtypes, shapes, memory overlap in place) from metadata
alone, before any data pointer is taken: a bad call raises
:class:`~posenc._errors.PosEncError` instead of reading or writing the wrong memory.
The fake implementations check devices too: a call mixing devices (e.g. meta cos/sin)
would otherwise be dispatched to them and return uninitialised memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch

from posenc._errors import PosEncError
from posenc.rotary.kernels.checks import (
    check_cos_sin,
    check_devices,
    check_inplace_memory,
    memory_range,
)

__all__ = ["KERNEL_DTYPES", "check_launch", "launch", "rotary_op", "rotary_op_"]

_COMPUTE = {torch.float64: torch.float64}
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _tables(
    cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """cos and sin ``[s, r/2]`` / ``[b|1, s, r/2]`` in the compute dtype with a contiguous
    last dimension and one set of strides, and their (b, s) element strides (b stride 0
    when broadcast). Tensors that already are so pass untouched."""
    if cos.dtype != dtype or sin.dtype != dtype:
        cos, sin = cos.to(dtype), sin.to(dtype)
    strides = cos.stride()
    if strides[-1] != 1 or sin.stride() != strides:
        cos, sin = cos.contiguous(), sin.contiguous()
        strides = cos.stride()
    if len(strides) == 2:
        return cos, sin, (0, strides[0])
    return cos, sin, (0 if cos.shape[0] == 1 else strides[0], strides[1])


def _empty_like(x: torch.Tensor) -> torch.Tensor:
    """Allocation of every output (tests replace it to poison outputs with NaN)."""
    return torch.empty_like(x)


def check_launch(
    backend: str,
    xs: Sequence[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    seq_dim: int,
    inplace: bool,
) -> None:
    """Everything a launcher reads, checked from metadata only (no device sync) before a
    data pointer is taken: q (and k) 4-D, one kernel dtype and one real device (CPU for
    ``"cpu"``; never meta), k with q's batch size, sequence length and head dim, cos/sin
    ``[s, r/2]`` or ``[b|1, s, r/2]`` on that device with ``r <= d``, and in place, q
    and k each in memory of its own. The outputs are allocated after it, like q and k.
    A few microseconds: one comparison per rule; messages are built only to raise.

    Raises:
        PosEncError: naming the parameter, the rule and the value.
    """
    if len(xs) not in (1, 2):
        raise PosEncError(f"a launch rotates q (and k), got {len(xs)} tensors")
    q = xs[0]
    k = xs[1] if len(xs) == 2 else None
    _check_device(backend, q, k, cos, sin)
    if q.dtype not in KERNEL_DTYPES:
        raise PosEncError(
            f"backend={backend!r} supports float32, bfloat16, float16 and float64, got {q.dtype}"
        )
    _check_shapes(q, k, cos, sin, seq_dim)
    if inplace:
        check_inplace_memory(xs)


def _check_device(
    backend: str, q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """:func:`check_launch`'s device rules: one device, one the ``backend`` runs on."""
    if backend == "cpu":  # is_cpu is False for meta and every accelerator
        if not (q.is_cpu and cos.is_cpu and sin.is_cpu and (k is None or k.is_cpu)):
            check_devices(q, k, cos, sin)  # a mismatch raises here; else all on q's device
            hint = ""
            if q.is_meta:
                hint = " (meta tensors have no memory: use backend='auto' or 'torch')"
            raise PosEncError(f"backend='cpu' needs CPU tensors, got q on {q.device}{hint}")
    elif backend == "triton":
        device = q.device
        if (k is not None and k.device != device) or cos.device != device or sin.device != device:
            check_devices(q, k, cos, sin)
        if q.is_meta or (q.is_cpu and os.environ.get("TRITON_INTERPRET") != "1"):
            raise PosEncError(
                f"backend='triton' needs CUDA tensors (CPU ones under TRITON_INTERPRET=1), "
                f"got q on {device}"
            )
    else:
        raise PosEncError(f"backend must be one of 'cpu', 'triton', got {backend!r}")


def _check_shapes(
    q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, seq_dim: int
) -> None:
    """:func:`check_launch`'s shape rules: k fits q, cos/sin fit both, ``r <= d``."""
    shape = q.shape
    if len(shape) != 4:
        raise PosEncError(f"q must be 4-D, got shape {tuple(shape)}")
    seq_axis = 2 if seq_dim == -2 else 1
    b, s, d = shape[0], shape[seq_axis], shape[3]
    if k is not None:
        if k.dtype != q.dtype:
            raise PosEncError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
        k_shape = k.shape
        if len(k_shape) != 4 or (k_shape[0], k_shape[seq_axis], k_shape[3]) != (b, s, d):
            raise PosEncError(
                f"k must have q's batch size, sequence length and head dim "
                f"(q has shape {tuple(shape)}), got shape {tuple(k_shape)}"
            )
    c_shape = cos.shape
    if (
        sin.shape != c_shape
        or len(c_shape) not in (2, 3)
        or c_shape[-2] != s
        or (len(c_shape) == 3 and c_shape[0] not in (1, b))
        or not (cos.is_floating_point() and sin.is_floating_point())
    ):
        check_cos_sin(q, cos, sin, seq_dim, name="q")  # raises, naming the rule
        raise PosEncError(f"cos and sin must be [s, r/2] or [b, s, r/2], got {tuple(c_shape)}")
    if 2 * c_shape[-1] > d:
        raise PosEncError(
            f"rotary_dim (2 * cos.shape[-1]) must be <= q's last dimension {d}, "
            f"got {2 * c_shape[-1]}"
        )


def _apart(
    xs: Sequence[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, copied if they share memory with a tensor rotated in place (the
    launch would otherwise read values it has already overwritten)."""
    spans = [memory_range(x) for x in xs]
    for t in (cos, sin):
        t0, t_end = memory_range(t)
        if any(t0 < x_end and x0 < t_end for x0, x_end in spans):
            return cos.clone(), sin.clone()
    return cos, sin


def _launcher(backend: str) -> Callable[..., None]:
    """The ``backend``'s launch function, imported when first used (the C loader and
    triton stay out of ``import posenc``; read at each call, so tests may replace it)."""
    if backend == "cpu":
        from posenc.rotary.kernels.cpu import launch_cpu

        return launch_cpu
    from posenc.rotary.kernels.triton_rope import launch_triton

    return launch_triton


def launch(
    backend: str,
    xs: Sequence[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool,
    seq_dim: int,
    inplace: bool,
    conjugate: bool = False,
) -> list[torch.Tensor]:
    """Check (:func:`check_launch`), then rotate ``xs`` (q, or q and k) into new tensors
    (or in place) with the ``backend``'s launcher; returns the outputs, one per input.

    Called directly (no custom-op layers: tens of microseconds per call, which decoding
    steps notice) for calls that need neither autograd nor tracing, and by the custom ops.
    ``conjugate``: rotate by minus the angles (the backward pass).
    """
    check_launch(backend, xs, cos, sin, seq_dim=seq_dim, inplace=inplace)
    if inplace:
        ys = list(xs)
        cos, sin = _apart(xs, cos, sin)
    else:
        ys = [_empty_like(x) for x in xs]
    cos, sin, cs = _tables(cos, sin, _COMPUTE.get(xs[0].dtype, torch.float32))
    _launcher(backend)(
        xs,
        ys,
        cos,
        sin,
        cs,
        seq_dim=seq_dim,
        interleaved=interleaved,
        conjugate=conjugate,
        inplace=inplace,
    )
    return ys


def _op_launch(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    options: tuple[bool, bool, int, str],
    inplace: bool,
) -> list[torch.Tensor]:
    """:func:`launch` of the custom ops' arguments: ``options`` are their
    ``(interleaved, conjugate, seq_dim, backend)``."""
    interleaved, conjugate, seq_dim, backend = options
    xs = [q] if k is None else [q, k]
    return launch(
        backend,
        xs,
        cos,
        sin,
        interleaved=interleaved,
        conjugate=conjugate,
        seq_dim=seq_dim,
        inplace=inplace,
    )


@torch.library.custom_op("posenc::rotary", mutates_args=())
def rotary_op(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    conjugate: bool,
    seq_dim: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of q and k (an empty tensor in place of k when k is None)."""
    ys = _op_launch(q, k, cos, sin, (interleaved, conjugate, seq_dim, backend), False)
    return ys[0], ys[1] if k is not None else q.new_empty(0)


@rotary_op.register_fake
def _(q, k, cos, sin, interleaved, conjugate, seq_dim, backend):
    check_devices(q, k, cos, sin)
    return torch.empty_like(q), torch.empty_like(k) if k is not None else q.new_empty(0)


def _setup_context(ctx, inputs, output) -> None:
    _, k, cos, sin, interleaved, conjugate, seq_dim, backend = inputs
    ctx.save_for_backward(cos, sin)
    ctx.args = (interleaved, not conjugate, seq_dim, backend)
    ctx.has_k = k is not None


def _backward(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    # The inverse rotation of the incoming gradients; pass-through channels copy through.
    gq, gk = rotary_op(grad_q, grad_k if ctx.has_k else None, cos, sin, *ctx.args)
    return gq, (gk if ctx.has_k else None), None, None, None, None, None, None


rotary_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("posenc::rotary_", mutates_args=("q", "k"))
def rotary_op_(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    conjugate: bool,
    seq_dim: int,
    backend: str,
) -> None:
    """Rotate q (and k) in place; channels past rotary_dim are not touched."""
    _op_launch(q, k, cos, sin, (interleaved, conjugate, seq_dim, backend), True)


@rotary_op_.register_fake
def _(q, k, cos, sin, interleaved, conjugate, seq_dim, backend):
    check_devices(q, k, cos, sin)
    return None
