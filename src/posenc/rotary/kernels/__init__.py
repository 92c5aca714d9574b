"""Fast paths for rotary embeddings: one fused pass over q and k, on GPU and CPU.

RoPE is memory bound: the least it can cost is one read and one write of q and k. The
plain torch path (:func:`posenc.rotary.kernels.plain.apply_rotary_torch`) makes several passes
and temporaries; the fused paths make one, loading each token's cos/sin row once and
reusing it for every head of q and of k:

- ``"triton"``: a Triton kernel (:mod:`posenc.rotary.kernels.triton_rope`), used
  automatically for CUDA tensors when ``triton`` is installed (``pip install
  'posenc[triton]'``); disable with :func:`enable_triton` or ``POSENC_TRITON=0``;
- ``"cpu"``: a C loop with OpenMP (:mod:`posenc.rotary.kernels.cpu`), the default for
  CPU tensors wherever a C compiler exists: built on the first CPU call (a second or two,
  under a file lock, then cached in a private directory and checked before every load).
  Without a compiler the plain path runs and one ``logging`` line (logger ``"posenc"``)
  says why. Off with :func:`enable_cpu_fast_path` or ``POSENC_CPU_FAST_PATH=0``;
- ``"torch"``: the plain twin (:mod:`posenc.rotary.kernels.plain`), everywhere else
  (float64 cos/sin with gradients, meta tensors, ...).

All three compute the same function bit for bit (products rounded before the sum, math
in float32 for bf16/fp16/fp32 inputs, float64 for float64). Both fused paths handle
both layouts, partial rotary, per-token positions ``[b, s]``, packed sequences, GQA (q
and k with different head counts), any strides (``[b, s, h, d]`` views are not copied)
and an in-place mode; they are torch custom ops, so ``torch.compile(fullgraph=True)``
keeps them in the graph, and they have a backward (the inverse rotation).

This package imports only torch, triton, :mod:`posenc._errors` and
:mod:`posenc.rotary.layout`: the code that calls it (:mod:`posenc.rotary.apply`, the
modules) sits above it, never the other way round.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings
from typing import Any, overload

import torch

from posenc._errors import PosEncError, check_choice, check_int, check_tensor
from posenc.rotary.kernels.plain import (
    apply_rotary_torch,
    check_cos_sin,
    check_devices,
    check_inplace_memory,
)
from posenc.rotary.layout import LAYOUTS, SEQ_DIMS

__all__ = [
    "BACKENDS",
    "cpu_fast_path_enabled",
    "enable_cpu_fast_path",
    "enable_triton",
    "fused_rotary",
    "select_backend",
]

BACKENDS = ("auto", "triton", "cpu", "torch")
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

_triton_on = importlib.util.find_spec("triton") is not None and (
    os.environ.get("POSENC_TRITON", "1") != "0"
)
# None: not decided yet (POSENC_CPU_FAST_PATH is read, and the library built, on the
# first CPU call outside tracing).
_cpu_on: bool | None = None
_OFF = ("0", "false", "off", "no")


def enable_triton(enabled: bool = True) -> None:
    """Use (or stop using) the Triton kernel for CUDA tensors.

    Args:
        enabled: ``True`` (the default when ``triton`` is installed) or ``False``.

    Raises:
        ImportError: ``enabled=True`` without triton installed.
    """
    global _triton_on
    if enabled and importlib.util.find_spec("triton") is None:
        raise ImportError("the Triton fast path needs triton: pip install 'posenc[triton]'")
    _triton_on = bool(enabled)


def enable_cpu_fast_path(enabled: bool = True) -> None:
    """Turn the fused CPU path on (compiling it now if it is not cached) or off.

    It is on by default where it can be built (see :func:`cpu_fast_path_enabled`); this
    switch overrides that for the rest of the process. The first build in a fresh cache
    compiles ``rope_cpu.c`` with the system C compiler (``$CC``, default ``cc``; a second
    or two); the library is cached (see :func:`posenc.rotary.kernels.cpu.cache_dir`) and
    only loaded, after its owner, mode and hash are checked, afterwards.

    Args:
        enabled: ``True`` to use the fused loop for CPU tensors, ``False`` for the plain
            torch path.

    Raises:
        RuntimeError: ``enabled=True`` and the library could not be compiled (no C
            compiler, ...); the plain path stays in use.
    """
    global _cpu_on
    if enabled:
        from posenc.rotary.kernels import cpu

        cpu.load()
    _cpu_on = bool(enabled)


def _tracing() -> bool:
    """Under ``torch.compile`` / ``torch.export`` or ``torch.jit.trace``: launch through the
    torch custom ops (which the trace records), never through a direct library call."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def _assume_constant_result(fn: Any) -> Any:
    """What ``torch.compiler.assume_constant_result`` does (it marks the function for
    dynamo), without importing ``torch._dynamo`` as it does: that import costs every
    ``import posenc`` (the CLI, each study worker) 3-4 seconds. A test checks that the
    marker is still torch's own."""
    fn._dynamo_marked_constant = True
    return fn


@_assume_constant_result
def _cpu_decided() -> bool:
    """The one decision (see :func:`cpu_fast_path_enabled`). Traced code reads it as a
    constant (computed outside the trace), so graphs never guard on the module's state and
    a graph compiled before the first eager call does not recompile after it."""
    global _cpu_on
    if _cpu_on is None:
        setting = os.environ.get("POSENC_CPU_FAST_PATH", "").strip().lower()
        _cpu_on = False
        if setting in _OFF:
            return False
        try:
            enable_cpu_fast_path(True)
        except RuntimeError as err:
            if setting:  # asked for explicitly
                warnings.warn(f"{err}; using the plain torch path", RuntimeWarning, stacklevel=3)
            else:
                logging.getLogger("posenc").warning(
                    "%s; using the plain torch path (the same results, slower). "
                    "POSENC_CPU_FAST_PATH=0 chooses it without this message.",
                    err,
                )
    return _cpu_on


def cpu_fast_path_enabled() -> bool:
    """Whether CPU tensors go through the fused CPU path (see :func:`enable_cpu_fast_path`).

    Decided once per process, on the first call (under ``torch.compile`` too, outside the
    trace, as a constant of the graph: compiled graphs keep the choice they were made with):
    on unless
    ``POSENC_CPU_FAST_PATH=0``, and only if the library builds and loads. If it cannot
    (no C compiler, a failed build), the plain torch path is used and one line is logged
    (logger ``"posenc"``, level WARNING); with ``POSENC_CPU_FAST_PATH=1`` that failure is a
    :class:`RuntimeWarning` instead.
    """
    return _cpu_decided()


def select_backend(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> str:
    """The backend ``fused_rotary(..., backend="auto")`` uses for these tensors:
    ``"triton"`` (CUDA, triton installed), ``"cpu"`` (CPU with the fast path enabled) or
    ``"torch"`` (anything else, and whenever cos/sin need gradients)."""
    if x.dtype not in _KERNEL_DTYPES:
        return "torch"
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        return "torch"  # the kernels do not differentiate through cos/sin
    if x.device.type == "cuda" and _triton_on:
        return "triton"
    if x.device.type == "cpu" and cpu_fast_path_enabled():
        return "cpu"
    return "torch"


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
    (:func:`posenc.rotary.kernels.plain.check_inplace_memory`: here for the plain path,
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

        def plain(x: torch.Tensor) -> torch.Tensor:
            out = apply_rotary_torch(x, cos, sin, layout=layout, seq_dim=seq_dim)
            return x.copy_(out) if inplace else out

        return plain(q), None if k is None else plain(k)
    from posenc.rotary.kernels.ops import rotary_op, rotary_op_, rotate_eager

    interleaved = layout == "interleaved"
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k))
    if not needs_grad and not _tracing():  # traced code records the custom ops below
        return rotate_eager(
            q,
            k,
            cos,
            sin,
            interleaved=interleaved,
            seq_dim=seq_dim,
            backend=backend,
            inplace=inplace,
        )
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
    one launch: each token's cos/sin row is loaded once and used for every head of both.

    Args:
        q: queries ``[b, h_q, s, d]`` (or ``[b, s, h_q, d]`` with ``seq_dim=-3``), any
            strides; float32, bf16, fp16 or float64.
        k: keys with the same ``b``, ``s``, ``d`` and dtype as q and any head count, or
            ``None`` to rotate q alone.
        cos, sin: one value per frequency, ``[s, r/2]`` or ``[b, s, r/2]`` (from
            :func:`posenc.rotary_cos_sin`; packed sequences take their positions from
            :func:`posenc.positions.from_cu_seqlens`).
        layout: ``"half"`` (channel ``i`` pairs with ``i + r/2``) or ``"interleaved"``
            (``2i`` with ``2i + 1``).
        rotary_dim: ``r``; ``None`` means ``2 * cos.shape[-1]``. Channels ``r..d`` pass
            through (in place: are not touched).
        seq_dim: ``-2`` for ``[b, h, s, d]``, ``-3`` for ``[b, s, h, d]``.
        inplace: write the result into q and k (inference only: not with autograd). q
            and k must each own their memory: not an ``expand()`` ed or otherwise
            overlapping view, and ``k`` sharing none of ``q``'s (slices of one qkv buffer
            are fine). Out of place, any views may share memory.
        backend: ``"auto"`` (see :func:`select_backend`), ``"triton"``, ``"cpu"`` or
            ``"torch"`` (the plain twin).

    Shape:
        q ``[b, h_q, s, d]``, k ``[b, h_k, s, d]`` (or ``[b, s, h, d]``), cos/sin ``[s, r/2]``
        or ``[b, s, r/2]`` -> ``(q_out, k_out)`` shaped like q and k (``k_out`` is None
        when ``k`` is None).

    Raises:
        PosEncError: bad shapes, dtypes or options; q, k, cos and sin not on one device;
            in place on overlapping memory (see ``inplace``); meta tensors with
            ``backend="cpu"`` or ``"triton"`` (``"auto"`` rotates them on the plain path).

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
    check_tensor("q", q, floating=True)
    check_choice("layout", layout, LAYOUTS)
    check_choice("seq_dim", seq_dim, SEQ_DIMS)
    check_choice("backend", backend, BACKENDS)
    if q.ndim != 4:
        raise PosEncError(
            f"q must be [b, h, s, d] (seq_dim=-2) or [b, s, h, d] (seq_dim=-3), "
            f"got shape {tuple(q.shape)}"
        )
    if k is not None:
        check_tensor("k", k, floating=True)
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
    check_cos_sin(q, cos, sin, seq_dim, name="q")
    half = cos.shape[-1]
    if rotary_dim is not None:
        rotary_dim = check_int("rotary_dim", rotary_dim, min=2)
        if rotary_dim != 2 * half:
            raise PosEncError(
                f"rotary_dim must equal 2 * cos.shape[-1] = {2 * half}, got {rotary_dim}"
            )
    if 2 * half > q.shape[-1]:
        raise PosEncError(f"rotary_dim must be <= q's last dimension {q.shape[-1]}, got {2 * half}")
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
    if backend in ("triton", "cpu") and q.dtype not in _KERNEL_DTYPES:
        raise PosEncError(
            f"backend={backend!r} supports float32, bfloat16, float16 and float64, got {q.dtype}"
        )
    if backend in ("triton", "cpu") and (cos.requires_grad or sin.requires_grad):
        if torch.is_grad_enabled():
            raise PosEncError(
                f"backend={backend!r} does not differentiate through cos/sin, which "
                "require grad; use backend='auto' or 'torch'"
            )
    if backend == "triton" and importlib.util.find_spec("triton") is None:
        raise ImportError("backend='triton' needs triton: pip install 'posenc[triton]'")
    return dispatch_rotary(
        q, k, cos, sin, layout=layout, seq_dim=seq_dim, inplace=inplace, backend=backend
    )
