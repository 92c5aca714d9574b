"""The one place every rotation goes through: :func:`dispatch_rotary` picks the fused launch
(:mod:`posenc.rotary.kernels.ops`) or the plain twin (:mod:`posenc.rotary.kernels.plain`),
and :func:`fused_rotary`, its public form, validates first.

Imports point down only: this module imports :mod:`~posenc.rotary.kernels.backends` (the
switches), :mod:`~posenc.rotary.kernels.ops` (the launch) and
:mod:`~posenc.rotary.kernels.plain`; the package's ``__init__`` re-exports it.
"""

from __future__ import annotations

import importlib.util
from typing import overload

import torch

from posenc._errors import PosEncError, check_choice, check_tensor, transformed
from posenc.rotary.kernels.backends import BACKENDS, select_backend, tracing
from posenc.rotary.kernels.checks import (
    check_cos_sin,
    check_devices,
    check_inplace_memory,
    check_rotary_dim,
    check_rotary_input,
)
from posenc.rotary.kernels.ops import KERNEL_DTYPES, launch, rotary_op, rotary_op_
from posenc.rotary.kernels.torch_engine import rotate_torch

__all__ = ["dispatch_rotary", "fused_rotary"]


@overload
def dispatch_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = ...,
    seq_dim: int = ...,
    inplace: bool = ...,
    backend: str = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def dispatch_rotary(
    q: torch.Tensor,
    k: None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = ...,
    seq_dim: int = ...,
    inplace: bool = ...,
    backend: str = ...,
) -> tuple[torch.Tensor, None]: ...


def dispatch_rotary(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    seq_dim: int = -2,
    inplace: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`fused_rotary` on already validated shapes: the one place every rotation
    goes through (:func:`posenc.apply_rotary` and the rotary modules call it, with
    ``k=None`` to rotate one tensor). q and k of different dtypes are rotated one after
    the other.

    Checked on every path, from metadata only (no device sync): q, k, cos and sin on one
    device (here), and in place, q and k each in memory of its own
    (:func:`posenc.rotary.kernels.checks.check_inplace_memory`: here for the plain path,
    by :func:`posenc.rotary.kernels.ops.check_launch` for the fused ones, which checks
    everything a launcher reads before it touches a pointer). With ``backend="auto"``,
    meta tensors take the plain path.

    Raises:
        PosEncError: a tensor on another device; in place on an expanded or overlapping
            view, or with ``k`` sharing ``q``'s memory.
    """
    check_devices(q, k, cos, sin)
    if inplace and k is not None and (k is q or k.dtype != q.dtype):
        if k is q or not torch.compiler.is_compiling():  # no data pointers while tracing
            check_inplace_memory([q, k])  # here, as q and k are rotated one by one below
    if k is not None and k.dtype != q.dtype:
        q_out, _ = dispatch_rotary(
            q, None, cos, sin, layout=layout, seq_dim=seq_dim, inplace=inplace, backend=backend
        )
        k_out, _ = dispatch_rotary(
            k, None, cos, sin, layout=layout, seq_dim=seq_dim, inplace=inplace, backend=backend
        )
        return q_out, k_out
    if backend == "auto":
        backend = select_backend(q, cos, sin)
    if backend == "torch":
        if inplace and not torch.compiler.is_compiling():  # the fused launches check their own
            check_inplace_memory([q] if k is None else [q, k])

        xs = [q] if k is None else [q, k]
        outs = rotate_torch(xs, cos, sin, layout=layout, seq_dim=seq_dim)  # tables once
        if inplace:
            outs = [x.copy_(out) for x, out in zip(xs, outs)]
        return outs[0], None if k is None else outs[1]
    return _fused(q, k, cos, sin, layout == "interleaved", seq_dim, inplace, backend)


def _fused(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    seq_dim: int,
    inplace: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused ``backend``'s rotation: the launch itself when neither autograd nor a
    trace needs to see it, else through the custom ops (which both record)."""
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k))
    if not needs_grad and not tracing():  # traced code records the custom ops below
        xs = [q] if k is None else [q, k]
        ys = launch(
            backend, xs, cos, sin, interleaved=interleaved, seq_dim=seq_dim, inplace=inplace
        )
        return ys[0], None if k is None else ys[1]
    if inplace:
        rotary_op_(q, k, cos, sin, interleaved, False, seq_dim, backend)
        return q, k
    q_out, k_out = rotary_op(q, k, cos, sin, interleaved, False, seq_dim, backend)
    return q_out, k_out if k is not None else None


def fused_rotary(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    rotary_dim: int | None = None,
    seq_dim: int = -2,
    inplace: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q and k (same tokens, any head counts) in one fused pass.

    The same function as :func:`posenc.apply_rotary` applied to q and to k, computed in
    one launch: each token's cos/sin row is loaded once and used for every head of both
    (the paths and what they cover: ``docs/fast-paths.md``).

    Args:
        q: queries, any strides; float32, bf16, fp16 or float64.
        k: keys with q's ``b``, ``s``, ``d`` and dtype and any head count, or ``None``.
        cos, sin: one value per frequency (from :func:`posenc.rotary_cos_sin`).
        layout: ``"half"`` (channel ``i`` pairs with ``i + r/2``) or ``"interleaved"``
            (``2i`` with ``2i + 1``).
        rotary_dim: ``r``; ``None`` means ``2 * cos.shape[-1]``. Channels ``r..d`` pass
            through (in place: are not touched).
        seq_dim: ``-2`` for ``[b, h, s, d]``, ``-3`` for ``[b, s, h, d]``.
        inplace: write the result into q and k (inference only), which must each own their
            memory (slices of one qkv buffer are fine, an ``expand()`` ed view is not).
        backend: ``"auto"`` (see :func:`~posenc.rotary.kernels.select_backend`),
            ``"triton"``, ``"cpu"`` or ``"torch"`` (the plain twin).

    Shape:
        q ``[b, h_q, s, d]``, k ``[b, h_k, s, d]`` (or ``[b, s, h, d]``), cos/sin ``[s, r/2]``
        or ``[b, s, r/2]`` -> ``(q_out, k_out)`` shaped like q and k (``k_out`` is None
        when ``k`` is None).

    Raises:
        PosEncError: bad shapes, dtypes or options; q, k, cos and sin not on one device;
            in place on overlapping memory; meta tensors with ``backend="cpu"`` or
            ``"triton"``.

    Examples:
        >>> import torch, posenc
        >>> from posenc.rotary.kernels import fused_rotary
        >>> q, k = torch.randn(2, 8, 5, 64), torch.randn(2, 2, 5, 64)  # GQA: 8 and 2 heads
        >>> from posenc.rotary.apply import apply_rotary, rotary_cos_sin
        >>> cos, sin = rotary_cos_sin(torch.arange(5), torch.rand(32))
        >>> q_out, k_out = fused_rotary(q, k, cos, sin, backend="torch")
        >>> torch.equal(q_out, apply_rotary(q, cos, sin))
        True
    """
    check_rotary_input("q", q, layout, seq_dim)
    check_choice("backend", backend, BACKENDS)
    if k is not None:
        _check_k(q, k, seq_dim)
    check_cos_sin(q, cos, sin, seq_dim, name="q")
    check_rotary_dim("q", q, cos, rotary_dim)
    _check_options(q, k, cos, sin, inplace, backend)
    return dispatch_rotary(
        q, k, cos, sin, layout=layout, seq_dim=seq_dim, inplace=inplace, backend=backend
    )


def _check_k(q: torch.Tensor, k: object, seq_dim: int) -> None:
    """:func:`fused_rotary`'s rules for ``k``: a floating tensor with q's batch size,
    sequence length, head dim, dtype and device."""
    k = check_tensor("k", k, floating=True)
    batch_seq = (0, seq_dim % 4)
    if (
        k.ndim != 4
        or [k.shape[i] for i in batch_seq] != [q.shape[i] for i in batch_seq]
        or k.shape[-1] != q.shape[-1]
    ):
        raise PosEncError(
            f"k must have q's batch size, sequence length and head dim "
            f"(q has shape {tuple(q.shape)}), got shape {tuple(k.shape)}"
        )
    if k.dtype != q.dtype:
        raise PosEncError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    if k.device != q.device:
        raise PosEncError(f"k must be on q's device {q.device}, got {k.device}")


def _check_options(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    inplace: object,
    backend: str,
) -> None:
    """:func:`fused_rotary`'s rules for ``inplace`` and a named fused ``backend``."""
    if not isinstance(inplace, bool):
        raise PosEncError(f"inplace must be a bool, got {inplace!r}")
    if (
        inplace
        and torch.is_grad_enabled()
        and any(t is not None and t.requires_grad for t in (q, k))
    ):
        raise PosEncError(
            "inplace=True cannot be used on tensors that require grad "
            "(autograd needs the unrotated inputs); use inplace=False"
        )
    if backend not in ("triton", "cpu"):
        return
    if transformed(q, k, cos, sin):
        raise PosEncError(
            f"backend={backend!r} cannot run under torch.func transforms (vmap, grad: their "
            "tensors have no storage to launch on); use backend='auto' or 'torch'"
        )
    if q.dtype not in KERNEL_DTYPES:
        raise PosEncError(
            f"backend={backend!r} supports float32, bfloat16, float16 and float64, got {q.dtype}"
        )
    if (cos.requires_grad or sin.requires_grad) and torch.is_grad_enabled():
        raise PosEncError(
            f"backend={backend!r} does not differentiate through cos/sin, which "
            "require grad; use backend='auto' or 'torch'"
        )
    if backend == "triton" and importlib.util.find_spec("triton") is None:
        raise ImportError("backend='triton' needs triton: pip install 'posenc[triton]'")
