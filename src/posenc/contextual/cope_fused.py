"""CoPE's attention fused on the CPU: the kernel ``posenc.attention`` runs for a term of
CoPE's counted form on CPU tensors (:meth:`~posenc._base.ContextualEncoding.counted_table`).

The matrix products stay torch's (``q k^T``, the table logits ``F = q E^T``, ``P v`` and,
backward, their gradients), one block of query rows at a time; everything between them is
one C loop per query row (``cope_cpu.c``, built and cached by :mod:`posenc._native`): the
gates, their suffix sums (in float64), the interpolated term, the softmax, and backward the
logits' and the table logits' gradients, in place in the block's score buffer. Only ``q``,
``k``, ``v``, the table, the output and two numbers a row are saved for backward (no
``[q, k]`` tensor); the backward pass recomputes each block's scores, as flash attention
does. A causal row stops at its last visible key (the causal rule of
:func:`posenc.positions.causal_pairs`), and the table logits are computed only for the
positions a block reaches. The numbers equal the eager path's to float32's rounding,
gradients included; float64 inputs are computed in float64, 16-bit ones in float32.

It runs where :func:`applies` says (CPU tensors, no dropout, outside ``torch.compile`` and
``torch.func`` transforms, a library that builds; ``POSENC_CPU_FAST_PATH=0`` turns it off as
it does the rotary fast path); attention takes its eager or chunked path otherwise.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path

import torch

from posenc import _native
from posenc._errors import tracing, transformed
from posenc.positions import causal_pairs

__all__ = ["BLOCK_SCORES", "applies", "available", "fused"]

log = logging.getLogger("posenc")

_SOURCE = Path(__file__).with_name("cope_cpu.c")

#: Scores (``b * h * rows * k``) per block of query rows: the block's buffers stay in cache.
BLOCK_SCORES = 1 << 19

_FIELDS = ("rows", "R", "H", "n", "npos", "seen", "mb", "mh", "mr", "fcols", "threads")


class _Shape(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p if name == "seen" else ctypes.c_int64) for name in _FIELDS]


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_state: bool | None = None  # None: not decided yet


def _declare(lib: ctypes.CDLL) -> None:
    ptr = ctypes.c_void_p
    shape, real = ctypes.POINTER(_Shape), ctypes.c_double
    for suffix in ("f32", "f64"):
        positions = getattr(lib, f"posenc_cope_positions_{suffix}")
        positions.argtypes = [shape, ptr, ptr, ptr, ptr]
        fwd = getattr(lib, f"posenc_cope_forward_{suffix}")
        fwd.argtypes = [shape, ptr, ptr, ptr, ptr, ptr, real]
        bwd = getattr(lib, f"posenc_cope_backward_{suffix}")
        bwd.argtypes = [shape, ptr, ptr, ptr, ptr, ptr, ptr, ptr, real]
        positions.restype = fwd.restype = bwd.restype = ctypes.c_int


def _load() -> ctypes.CDLL:
    return _native.load(_SOURCE, _declare)


def available() -> bool:
    """Whether the fused path can run: decided once per process (``POSENC_CPU_FAST_PATH=0``
    turns it off; a failed build logs one line, logger ``"posenc"``, and keeps eager)."""
    global _lib, _state
    if _state is None:
        with _lock:
            if _state is None:
                if os.environ.get("POSENC_CPU_FAST_PATH", "").strip() == "0":
                    _state = False
                else:
                    try:
                        _lib = _load()
                        _state = True
                    except (RuntimeError, OSError, AttributeError) as err:
                        log.warning("posenc: CoPE's fused CPU path is off: %s", err)
                        _state = False
    return _state


def applies(q: torch.Tensor, table: torch.Tensor | None, dropout_p: float) -> bool:
    """Whether :func:`fused` serves a call with queries ``q`` and ``dropout_p``.

    ``table``: the term's ``[npos, d]`` table when it has CoPE's counted form, else None
    (never fused). A table whose ``d`` is not ``q``'s is left to the eager path, which
    says what is wrong."""
    return (
        table is not None
        and q.device.type == "cpu"
        and table.device.type == "cpu"
        and table.shape[-1] == q.shape[-1]
        and not dropout_p
        and not tracing()
        and not transformed(q)
        and available()
    )


def _mask_block(keep: torch.Tensor | None, rows: slice, kmax: int):
    """The block's bool mask (a view, keys contiguous) and its byte strides (b, h, row)."""
    if keep is None:
        return None, (0, 0, 0)
    m = keep[:, :, rows] if keep.shape[2] != 1 else keep
    m = m[..., :kmax]
    if m.stride(-1) != 1:
        m = m.contiguous()
    strides = tuple(0 if m.shape[i] == 1 else m.stride(i) for i in range(3))
    return m, strides


class _Block:
    """One block of query rows: its keys, its mask and the C shape (``fcols`` set later,
    once the block's largest position is known).

    Causal: the C loop reads how many keys each of its rows sees (the first ones, a view
    of :attr:`_Blocks.seen`); otherwise every key."""

    def __init__(self, blocks: _Blocks, start: int, stop: int) -> None:
        self.start, self.stop, self.rows = start, stop, stop - start
        seen = None if blocks.seen is None else blocks.seen[start:stop]
        self.kmax = blocks.k_len if seen is None else int(seen.max())
        self.mask, (mb, mh, mr) = _mask_block(blocks.keep, slice(start, stop), self.kmax)
        self.shape = _Shape(
            blocks.bh * self.rows, self.rows, blocks.h, self.kmax, blocks.npos, _ptr(seen),
            mb, mh, mr, 1, blocks.threads,
        )  # fmt: skip

    def columns(self, top: float) -> int:
        """The table logits this block needs: positions up to its largest, ``top`` (NaN:
        every one), and one more for the interpolation."""
        cols = self.shape.npos if top != top else min(self.shape.npos, int(top) + 2)
        self.shape.fcols = min(cols, self.kmax + 2, self.shape.npos)
        return self.shape.fcols


class _Blocks:
    """The blocks of query rows of one call, with buffers allocated once at the largest
    block's size and reused (a fresh multi-MiB tensor per block costs its page faults
    every time). ``seen``: causal, how many keys each query row sees (int64 ``[q]``, from
    :func:`~posenc.positions.causal_pairs`); else None."""

    def __init__(self, q, k, v_dim: int, weight, keep, causal: bool, backward: bool) -> None:
        b, self.h, self.q_len, _ = q.shape
        self.bh = b * self.h
        self.k_len, self.npos = k.shape[2], weight.shape[0]
        self.keep = keep
        self.seen = causal_pairs(self.q_len, self.k_len, counts=True) if causal else None
        self.rows = max(1, BLOCK_SCORES // max(1, self.bh * self.k_len))
        self.threads = torch.get_num_threads()
        scores = self.bh * min(self.rows, self.q_len) * self.k_len
        cols = self.bh * min(self.rows, self.q_len) * min(self.npos, self.k_len + 2)
        self.s, self.p = q.new_empty(scores), q.new_empty(scores)  # p: dP when backward
        grads = 1 if backward else 0  # the backward pass's buffers, empty in the forward
        self.f, self.df = q.new_empty(cols), q.new_empty(cols * grads)
        self.top, self.lse = q.new_empty(self.bh * self.rows), q.new_empty(self.bh * self.rows)
        self.delta = q.new_empty(self.bh * self.rows * grads)
        width = max(q.shape[-1], v_dim)
        self.tmp = q.new_empty(self.bh * self.k_len * width * grads)

    def __iter__(self):
        for start in range(0, self.q_len, self.rows):
            yield _Block(self, start, min(self.q_len, start + self.rows))

    def view(self, flat: torch.Tensor, *shape: int) -> torch.Tensor:
        n = 1
        for size in shape:
            n *= size
        return flat[:n].view(*shape)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _suffix(t: torch.Tensor) -> str:
    return "f64" if t.dtype == torch.float64 else "f32"


def _check(rc: int) -> None:
    if rc != 0:
        raise MemoryError("posenc's fused CoPE kernel could not allocate its row buffers")


def _forward(q, k, v, weight, keep, causal: bool, scale: float, a: float):
    b, h, q_len, d = q.shape
    bh = b * h
    q3, v3 = q.reshape(bh, q_len, d), v.reshape(bh, -1, v.shape[-1])
    k3 = (k * scale).reshape(bh, -1, d)
    out = q.new_empty(bh, q_len, v.shape[-1])
    lse, top = q.new_empty(bh, q_len), q.new_empty(bh, q_len)
    blocks = _Blocks(q, k, v.shape[-1], weight, keep, causal, backward=False)
    positions = getattr(_lib, f"posenc_cope_positions_{_suffix(q)}")
    forward = getattr(_lib, f"posenc_cope_forward_{_suffix(q)}")
    for blk in blocks:
        qb, rows, kmax, mask = q3[:, blk.start : blk.stop], blk.rows, blk.kmax, _ptr(blk.mask)
        s = blocks.view(blocks.s, bh, rows, kmax)
        torch.bmm(qb, k3[:, :kmax].transpose(1, 2), out=s)
        p, top_b = blocks.view(blocks.p, bh, rows, kmax), blocks.view(blocks.top, bh, rows)
        _check(positions(ctypes.byref(blk.shape), s.data_ptr(), p.data_ptr(), mask, _ptr(top_b)))
        top[:, blk.start : blk.stop] = top_b
        cols = blk.columns(float(top_b.max()))
        f = blocks.view(blocks.f, bh, rows, cols)
        torch.matmul(qb, weight[:cols].T, out=f)
        lse_b = blocks.view(blocks.lse, bh, rows)
        rc = forward(ctypes.byref(blk.shape), s.data_ptr(), f.data_ptr(), p.data_ptr(), mask,
                     lse_b.data_ptr(), a)  # fmt: skip
        _check(rc)  # now s holds the probabilities
        lse[:, blk.start : blk.stop] = lse_b
        torch.bmm(s, v3[:, :kmax], out=out[:, blk.start : blk.stop])
    return out.view(b, h, q_len, -1), lse, top


def _backward(ctx, dout):
    q, k, v, weight, keep, out, lse, top = ctx.saved_tensors
    b, h, q_len, d = q.shape
    bh = b * h
    q3, v3 = q.reshape(bh, q_len, d), v.reshape(bh, -1, v.shape[-1])
    k3 = (k * ctx.scale).reshape(bh, -1, d)
    do3 = dout.reshape(bh, q_len, -1).contiguous()
    delta = (do3 * out.reshape(bh, q_len, -1)).sum(-1)  # [b h, q]: sum_j P_ij dP_ij
    dq, dk, dv = torch.empty_like(q3), torch.zeros_like(k3), torch.zeros_like(v3)
    dweight = torch.zeros_like(weight)
    blocks = _Blocks(q, k, v.shape[-1], weight, keep, ctx.causal, backward=True)
    tops = torch.nan_to_num(top, nan=float("inf")).split(blocks.rows, dim=1)
    tops = [float(t.max()) for t in tops]
    backward = getattr(_lib, f"posenc_cope_backward_{_suffix(q)}")
    for blk, top_b in zip(blocks, tops):
        rows, kmax = blk.rows, blk.kmax
        cols = blk.columns(float("nan") if top_b == float("inf") else top_b)
        qb, dob = q3[:, blk.start : blk.stop], do3[:, blk.start : blk.stop]
        s, dp = blocks.view(blocks.s, bh, rows, kmax), blocks.view(blocks.p, bh, rows, kmax)
        f, df = blocks.view(blocks.f, bh, rows, cols), blocks.view(blocks.df, bh, rows, cols)
        torch.bmm(qb, k3[:, :kmax].transpose(1, 2), out=s)
        torch.matmul(qb, weight[:cols].T, out=f)
        torch.bmm(dob, v3[:, :kmax].transpose(1, 2), out=dp)
        lse_b, delta_b = blocks.view(blocks.lse, bh, rows), blocks.view(blocks.delta, bh, rows)
        lse_b.copy_(lse[:, blk.start : blk.stop])
        delta_b.copy_(delta[:, blk.start : blk.stop])
        rc = backward(
            ctypes.byref(blk.shape), s.data_ptr(), dp.data_ptr(), f.data_ptr(), df.data_ptr(),
            _ptr(blk.mask), lse_b.data_ptr(), delta_b.data_ptr(), ctx.a,
        )  # fmt: skip
        _check(rc)  # now s holds the logits' gradient, dp the probabilities, df F's
        # one product per term into a reused buffer, then one addition: baddbmm_ on these
        # views is a product per head
        dqb = dq[:, blk.start : blk.stop]
        torch.bmm(s, k3[:, :kmax], out=dqb)
        dqb += torch.mm(df.view(-1, cols), weight[:cols]).view(bh, rows, d)
        tmp = blocks.view(blocks.tmp, bh, kmax, d)
        dk[:, :kmax] += torch.bmm(s.transpose(1, 2), qb, out=tmp)
        tmp = blocks.view(blocks.tmp, bh, kmax, v3.shape[-1])
        dv[:, :kmax] += torch.bmm(dp.transpose(1, 2), dob, out=tmp)
        dweight[:cols].addmm_(df.view(-1, cols).T, qb.reshape(-1, d))
    return dq.view(q.shape), (dk * ctx.scale).view(k.shape), dv.view(v.shape), dweight


class _FusedCoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, weight, keep, causal, scale, a):  # type: ignore[override]
        out, lse, top = _forward(q, k, v, weight, keep, causal, scale, a)
        ctx.save_for_backward(q, k, v, weight, keep, out, lse, top)
        ctx.causal, ctx.scale, ctx.a = causal, scale, a
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):  # type: ignore[override]
        dq, dk, dv, dweight = _backward(ctx, dout)
        return dq, dk, dv, dweight, None, None, None, None


def _heads(t: torch.Tensor, dtype: torch.dtype, heads: int) -> torch.Tensor:
    """``t [b, h_kv, k, .]`` in ``dtype`` with its heads repeated to ``heads``, contiguous."""
    return t.to(dtype).repeat_interleave(heads // t.shape[1], dim=1).contiguous()


def fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    table: torch.Tensor,
    keep: torch.Tensor | None,
    *,
    causal: bool,
    scale: float,
    scaled: bool,
) -> torch.Tensor:
    """``softmax(q k^T * scale + the counted term + mask) v`` for a call :func:`applies`
    to, its inputs checked by the caller (:func:`posenc.attention`).

    Args:
        q: ``[b, h, q, d]``, any floating dtype (16-bit computed in float32).
        k, v: ``[b, h_kv, k, d]`` and ``[b, h_kv, k, d_v]``, ``h`` a multiple of ``h_kv``.
        table: ``[npos, d]``, the term's table (CoPE's ``weight``), shared by the heads.
        keep: bool ``[b|1, h|1, q|1, k]``, True where a query may attend a key, or None.
        causal: whether query ``i`` sees only the keys of
            :func:`~posenc.positions.causal_pairs` (the queries are the last keys).
        scale: of the logits ``q k^T``.
        scaled: whether the term is multiplied by ``scale`` too (CoPE's
            ``position_logit="scaled"``).

    Returns:
        ``[b, h, q, d_v]`` in ``q``'s dtype; a row that sees no key gives 0.
    """
    compute = torch.promote_types(q.dtype, torch.float32)
    qf = q.to(compute).contiguous()
    kf, vf = _heads(k, compute, q.shape[1]), _heads(v, compute, q.shape[1])
    a = scale if scaled else 1.0
    out = _FusedCoPE.apply(qf, kf, vf, table.to(compute), keep, causal, scale, a)
    return out.to(q.dtype)
