"""The fused CPU path: ``rope_cpu.c`` built once with the system C compiler, called via ctypes.

One pass over q and k (one read, one write), cos/sin loaded per token and reused across
heads, OpenMP threads sharing torch's own OpenMP runtime (``torch.get_num_threads()``).
The source is compiled on first use by posenc's C toolchain, :mod:`posenc._native` (flags,
the private cache and its checks are described there), so later processes only load it.
Without a working compiler the build raises :class:`RuntimeError` and the dispatch keeps
the plain torch path. ``-ffp-contract=off`` keeps every product rounded before the sum,
exactly like the plain torch twin, so the two paths agree bit for bit.
"""

from __future__ import annotations

import array
import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from posenc import _native
from posenc._native import cache_dir
from posenc.rotary.layout import bshd_order

__all__ = ["build", "cache_dir", "launch_cpu", "load", "table_entry", "table_template"]

_SOURCE = Path(__file__).with_name("rope_cpu.c")
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3}
# Below this many elements one thread is faster than waking the pool.
PARALLEL_MIN_ELEMENTS = 1 << 15

_lib: ctypes.CDLL | None = None


def build(source: Path | None = None) -> Path:
    """Compile ``rope_cpu.c`` (or ``source``) or find it, checked, in the cache, and return
    the library's path (:func:`posenc._native.build`).

    Raises:
        RuntimeError: no C compiler, compilation failed, or no private directory could be
            made to build in.
    """
    return _native.build(_SOURCE if source is None else source)


def _declare(lib: ctypes.CDLL) -> None:
    for name in ("posenc_rope_packed", "posenc_rope_table_packed"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p]  # the packed int64 arguments


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        _lib = _native.load(_SOURCE, _declare)
    return _lib


def load() -> None:
    """Build (if needed) and load the library; raises :class:`RuntimeError` on failure."""
    _library()


def _meta(
    x: tuple[tuple[int, ...], tuple[int, ...]],
    y_strides: tuple[int, ...],
    cos_strides: tuple[int, int],
) -> list[int]:
    """The 15 numbers ``rope_cpu.c`` reads per tensor: the outer dims (b, s, h), sorted by
    x's stride so rows are visited in memory order, then channel strides and d."""
    (b, s, h, d), (sb, ss, sh, sd) = x
    yb, ys, yh, yd = y_strides
    dims = [(b, sb, yb, cos_strides[0]), (s, ss, ys, cos_strides[1]), (h, sh, yh, 0)]
    dims.sort(key=lambda t: -abs(t[1]))
    return [v for dim in dims for v in dim] + [sd, yd, d]


# The slots of the int64 arguments the C entries read (rope_cpu.c: posenc_rope_packed,
# posenc_rope_table_packed): a template per call shape, the pointers written into a copy
# per call, so concurrent calls never share one.
SLOT_DTYPE, SLOT_INTERLEAVED, SLOT_SIGN, SLOT_INPLACE, SLOT_TENSORS = 0, 1, 2, 3, 4
SLOT_R2, SLOT_THREADS = 5, 6
SLOT_Q, SLOT_K, SLOT_Q_OUT, SLOT_K_OUT, SLOT_COS, SLOT_SIN = 7, 8, 9, 10, 11, 12
# posenc_rope_table_packed only: the positions (0: none), whether they are int32, the
# table's row stride and rows, the positions' batch and sequence sizes and their strides
SLOT_POSITIONS, SLOT_POSITIONS_INT32, SLOT_ROW_STRIDE, SLOT_ROWS = 13, 14, 15, 16
SLOT_POS_BATCH, SLOT_POS_SEQ, SLOT_POS_BATCH_STRIDE, SLOT_POS_SEQ_STRIDE = 17, 18, 19, 20
_META = {False: 13, True: 21}  # the first per-tensor slot: of the plain entry, of the table's

_PLANS: dict[tuple, array.array] = {}  # launch_cpu's templates per call shape
_PLANS_MAX = 256


def _plan(key: tuple) -> array.array:
    dtype, seq_dim, interleaved, conjugate, inplace, cos_strides, r2, threads, tensors = key
    meta: list[int] = []
    for shape, strides, y_strides in tensors:
        x = bshd_order(shape, strides, seq_dim)
        meta += _meta(x, bshd_order(shape, y_strides, seq_dim)[1], cos_strides)
    plan = array.array("q", [0] * _META[False] + meta)
    plan[SLOT_DTYPE], plan[SLOT_INTERLEAVED] = _DTYPES[dtype], int(interleaved)
    plan[SLOT_SIGN], plan[SLOT_INPLACE] = -1 if conjugate else 1, int(inplace)
    plan[SLOT_TENSORS], plan[SLOT_R2], plan[SLOT_THREADS] = len(tensors), r2, threads
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def packed_template(
    x_tensors: Sequence[torch.Tensor],
    y_strides: Sequence[Sequence[int]],
    cos: torch.Tensor,
    cos_strides: tuple[int, int],
    *,
    seq_dim: int,
    interleaved: bool,
    conjugate: bool = False,
    inplace: bool = False,
) -> array.array:
    """The arguments of :func:`packed_entry` for rotating ``x_tensors`` (q, and k if given)
    into outputs of ``y_strides``, pointers left 0 (written per call: ``SLOT_Q`` to
    ``SLOT_SIN``); built once per call shape and kept. cos/sin are ``[.., S, R/2]`` with a
    contiguous last dimension and (b, s) element strides ``cos_strides``."""
    q = x_tensors[0]
    elements = q.numel() + (x_tensors[1].numel() if len(x_tensors) == 2 else 0)
    threads = torch.get_num_threads() if elements >= PARALLEL_MIN_ELEMENTS else 1
    key = (
        q.dtype,
        seq_dim,
        interleaved,
        conjugate,
        inplace,
        cos_strides,
        cos.shape[-1],
        threads,
        tuple((x.shape, x.stride(), tuple(ys)) for x, ys in zip(x_tensors, y_strides)),
    )
    plan = _PLANS.get(key)
    return _plan(key) if plan is None else plan


def packed_entry() -> Callable[[int], int]:
    """``posenc_rope_packed`` (see ``rope_cpu.c``), taking the address of its packed
    arguments (a :func:`packed_template` copy with the pointers written in); returns 0."""
    return _library().posenc_rope_packed


def launch_cpu(
    x_tensors: list[torch.Tensor],
    y_tensors: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    cos_strides: tuple[int, int],
    *,
    seq_dim: int,
    interleaved: bool,
    conjugate: bool,
    inplace: bool,
) -> None:
    """Rotate ``x_tensors`` (q, and k if given) into ``y_tensors`` (the same tensors when
    ``inplace``), checked beforehand by :func:`posenc.rotary.kernels.ops.check_launch`.

    Tensors are ``[b, h, s, d]`` (``seq_dim=-2``) or ``[b, s, h, d]`` (``-3``) with any
    strides; cos/sin as :func:`packed_template` takes them. A call costs a dictionary
    lookup, six pointers and one foreign call.
    """
    template = packed_template(
        x_tensors,
        [y.stride() for y in y_tensors],
        cos,
        cos_strides,
        seq_dim=seq_dim,
        interleaved=interleaved,
        conjugate=conjugate,
        inplace=inplace,
    )
    args = array.array("q", template)
    q = x_tensors[0]
    args[SLOT_Q], args[SLOT_Q_OUT] = q.data_ptr(), y_tensors[0].data_ptr()
    if len(x_tensors) == 2:
        args[SLOT_K], args[SLOT_K_OUT] = x_tensors[1].data_ptr(), y_tensors[1].data_ptr()
    args[SLOT_COS], args[SLOT_SIN] = cos.data_ptr(), sin.data_ptr()
    rc = packed_entry()(args.buffer_info()[0])
    if rc != 0:  # pragma: no cover - the dtype table above and the C switch agree
        raise RuntimeError(f"posenc's CPU rotary kernel failed with code {rc}")


def table_entry() -> Callable[[int], int]:
    """``posenc_rope_table_packed`` (see ``rope_cpu.c``): the rotation at positions read
    from a cos/sin table in one foreign call, taking the address of its packed arguments
    (a :func:`table_template` copy with the pointers written in); returns 0, or 1 (nothing
    written) where a position lies outside the table's rows."""
    return _library().posenc_rope_table_packed


def table_template(
    dtype: torch.dtype,
    seq_dim: int,
    interleaved: bool,
    threads: int,
    tensors: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]],
    r2: int,
    positions: tuple[int, int, int, int, int] | None,
) -> array.array:
    """The arguments of :func:`table_entry` for one call shape, pointers and the table's
    row count left 0 (written per call: ``SLOT_Q`` to ``SLOT_POSITIONS`` and ``SLOT_ROWS``).

    Args:
        dtype: of q and k (float32, bfloat16 or float16: the table is float32).
        tensors: ``(shape, strides, output strides)`` of q and k, checked beforehand.
        r2: half the rotary dim; the table's rows are ``2 * r2`` float32 (cos, then sin).
        positions: ``(int32, batch, seq, batch stride, seq stride)`` of the positions
            (batch stride 0 when they are shared), or ``None``: the table's first rows.
    """
    if positions is None:  # the table's first rows: one "batch" of s positions
        int32, pb, ps, psb, pss = 0, 1, tensors[0][0][2 if seq_dim == -2 else 1], 0, 0
        cos_strides = (0, 2 * r2)
    else:
        int32, pb, ps, psb, pss = positions
        cos_strides = (psb, pss)
    meta: list[int] = []
    for shape, strides, y_strides in tensors:
        x = bshd_order(shape, strides, seq_dim)
        meta += _meta(x, bshd_order(shape, y_strides, seq_dim)[1], cos_strides)
    args = array.array("q", [0] * _META[True] + meta)
    args[SLOT_DTYPE], args[SLOT_INTERLEAVED], args[SLOT_SIGN] = _DTYPES[dtype], int(interleaved), 1
    args[SLOT_TENSORS], args[SLOT_R2], args[SLOT_THREADS] = len(tensors), r2, threads
    args[SLOT_POSITIONS_INT32], args[SLOT_ROW_STRIDE] = int(int32), 2 * r2
    args[SLOT_POS_BATCH], args[SLOT_POS_SEQ] = pb, ps
    args[SLOT_POS_BATCH_STRIDE], args[SLOT_POS_SEQ_STRIDE] = psb, pss
    return args
