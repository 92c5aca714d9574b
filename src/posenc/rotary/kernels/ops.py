"""The fused rotation as torch custom ops, with autograd.

``posenc::rotary`` (out of place) and ``posenc::rotary_`` (in place) are
``torch.library.custom_op`` s: ``torch.compile(fullgraph=True)`` treats them as opaque
calls (shapes from ``register_fake``) instead of breaking the graph, and
``register_autograd`` gives the out-of-place op its backward, which is the same op with
the inverse rotation (sin negated): the Jacobian of a rotation is its transpose.

``backend`` names the launcher: ``"triton"`` (any device Triton runs on, including CPU
tensors under ``TRITON_INTERPRET=1``) or ``"cpu"`` (the compiled C loop).
"""

from __future__ import annotations

import torch

__all__ = ["bshd", "rotary_op", "rotary_op_", "rotate_eager"]

_COMPUTE = {torch.float64: torch.float64}


def bshd(x: torch.Tensor, seq_dim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Sizes ``(B, S, H, D)`` and element strides of ``x`` (``[b, h, s, d]`` for
    ``seq_dim=-2``, ``[b, s, h, d]`` for ``seq_dim=-3``): the kernels' view, no copy."""
    b, n1, n2, d = x.shape
    sb, s1, s2, sd = x.stride()
    if seq_dim == -2:  # [b, h, s, d]
        return (b, n2, n1, d), (sb, s2, s1, sd)
    return (b, n1, n2, d), (sb, s1, s2, sd)


def _table(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, tuple[int, int]]:
    """cos or sin ``[s, r/2]`` / ``[b|1, s, r/2]`` in the compute dtype with a contiguous
    last dimension, and its (b, s) element strides (b stride 0 when broadcast)."""
    t = t.to(dtype)
    if t.stride(-1) != 1:
        t = t.contiguous()
    if t.ndim == 2:
        return t, (0, t.stride(0))
    return t, (0 if t.shape[0] == 1 else t.stride(0), t.stride(1))


def _empty_like(x: torch.Tensor) -> torch.Tensor:
    """Allocation of every output (tests replace it to poison outputs with NaN)."""
    return torch.empty_like(x)


def _launch(
    backend: str,
    xs: list[torch.Tensor],
    ys: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool,
    conjugate: bool,
    seq_dim: int,
    inplace: bool,
) -> None:
    compute = _COMPUTE.get(xs[0].dtype, torch.float32)
    cos, cs = _table(cos, compute)
    sin, ss = _table(sin, compute)
    if ss != cs:  # one set of strides for both tables
        cos, cs = _table(cos.contiguous(), compute)
        sin, ss = _table(sin.contiguous(), compute)
    views = [bshd(x, seq_dim) for x in xs]
    y_strides = [bshd(y, seq_dim)[1] for y in ys]
    if backend == "cpu":
        from posenc.rotary.kernels.cpu import launch_cpu as launch
    else:
        from posenc.rotary.kernels.triton_rope import launch_triton as launch
    launch(
        views,
        xs,
        y_strides,
        ys,
        cos,
        sin,
        cs,
        interleaved=interleaved,
        conjugate=conjugate,
        inplace=inplace,
    )


def rotate_eager(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool,
    seq_dim: int,
    backend: str,
    inplace: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The launch without the custom-op layers (tens of microseconds per call, which
    decoding steps notice), for calls that need neither autograd nor tracing."""
    xs = [q] if k is None else [q, k]
    ys = xs if inplace else [_empty_like(x) for x in xs]
    _launch(
        backend,
        xs,
        ys,
        cos,
        sin,
        interleaved=interleaved,
        conjugate=False,
        seq_dim=seq_dim,
        inplace=inplace,
    )
    return ys[0], ys[1] if k is not None else None


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
    xs = [q] if k is None else [q, k]
    ys = [_empty_like(x) for x in xs]
    _launch(
        backend,
        xs,
        ys,
        cos,
        sin,
        interleaved=interleaved,
        conjugate=conjugate,
        seq_dim=seq_dim,
        inplace=False,
    )
    return ys[0], ys[1] if k is not None else q.new_empty(0)


@rotary_op.register_fake
def _(q, k, cos, sin, interleaved, conjugate, seq_dim, backend):
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
    xs = [q] if k is None else [q, k]
    _launch(
        backend,
        xs,
        xs,
        cos,
        sin,
        interleaved=interleaved,
        conjugate=conjugate,
        seq_dim=seq_dim,
        inplace=True,
    )


@rotary_op_.register_fake
def _(q, k, cos, sin, interleaved, conjugate, seq_dim, backend):
    return None
