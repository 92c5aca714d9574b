"""CoPE attention fused on the CPU: what ``backend="auto"`` runs for CoPE on CPU tensors.

The eager path builds CoPE's term as ``[b, h, q, k]`` tensors (gates, their suffix sums,
two gathers from the table logits, the interpolation) and autograd keeps them; the chunked
path keeps fewer but recomputes them all in torch's ops. Here the matrix products stay
torch's (``q k^T``, the table logits ``F = q E^T``, ``P v`` and, backward, their
gradients), one block of query rows at a time, and everything between them is one C loop
per query row (``cope_cpu.c``, built and cached like the rotary fast path,
:func:`posenc.rotary.kernels.cpu.build`): gates, the suffix sum (in float64), the
interpolated term, the softmax, and backward the logits' and the table logits' gradients,
in place in the block's score buffer. Only ``q``, ``k``, ``v``, the table, the output and
one log-sum-exp per row are saved for backward (``O(s (d + 1))``, no ``[q, k]`` tensor);
the backward pass recomputes each block's scores, as flash attention does.

Causal blocks stop at their last visible key, so a causal step does half the work of a
full one; the table logits are computed after the positions, for the positions the block
reaches (its rows' largest, kept per row for the backward pass), not the whole table. The
same numbers as the eager path to float32's rounding (the gates summed in float64),
gradients included; float64 inputs are computed in float64.

It serves a contextual encoding whose term has CoPE's counted form (its
:meth:`~posenc._base.ContextualEncoding.counted_table` is not None: CoPE's, not a subclass
that overrides its ``contextual_bias_at``) on CPU tensors of any floating dtype (16-bit widened to
float32, as eager), without dropout, outside ``torch.compile`` and ``torch.func``
transforms, when the C library builds: the same switch as the rotary fast path
(``POSENC_CPU_FAST_PATH=0`` turns both off); anything else takes eager or chunked.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path
from typing import Any

import torch

from posenc._base import ContextualEncoding
from posenc._errors import PosEncError, tracing, transformed
from posenc.attend.paths import Call, _widened

__all__ = ["BLOCK_SCORES", "applies", "available", "fused"]

log = logging.getLogger("posenc")

_SOURCE = Path(__file__).with_name("cope_cpu.c")

#: Scores (``b * h * rows * k``) per block of query rows: the block's buffers stay in cache.
BLOCK_SCORES = 1 << 19

_FIELDS = ("rows", "R", "H", "n", "npos", "first", "mb", "mh", "mr", "fcols", "threads")


class _Shape(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in _FIELDS]


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_state: bool | None = None  # None: not decided yet


def _load() -> ctypes.CDLL:
    from posenc.rotary.kernels.cpu import build  # the C toolchain only when asked for

    lib = ctypes.CDLL(str(build(_SOURCE)))
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
    return lib


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


def applies(q: torch.Tensor, enc: Any, dropout_p: float) -> bool:
    """Whether this call of CoPE takes the fused path (see the module docs)."""
    counted = enc.counted_table() if isinstance(enc, ContextualEncoding) else None
    return (
        counted is not None
        and q.device.type == "cpu"
        and counted[0].device.type == "cpu"
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
    once the block's largest position is known)."""

    def __init__(self, blocks: _Blocks, start: int, stop: int) -> None:
        off = blocks.k_len - blocks.q_len
        self.start, self.stop, self.rows = start, stop, stop - start
        self.kmax = min(blocks.k_len, off + stop) if blocks.causal else blocks.k_len
        self.mask, (mb, mh, mr) = _mask_block(blocks.keep, slice(start, stop), self.kmax)
        first = off + start if blocks.causal else -1
        self.shape = _Shape(
            blocks.bh * self.rows, self.rows, blocks.h, self.kmax, blocks.npos, first, mb, mh,
            mr, 1, blocks.threads,
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
    every time)."""

    def __init__(self, q, k, v_dim: int, weight, keep, causal: bool, backward: bool) -> None:
        b, self.h, self.q_len, _ = q.shape
        self.bh = b * self.h
        self.k_len, self.npos = k.shape[2], weight.shape[0]
        self.keep, self.causal = keep, causal
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


def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: Call) -> torch.Tensor:
    """``softmax(q k^T * scale + CoPE's term + mask) v`` for a call :func:`applies` to
    (validated by :func:`posenc.attention`): ``[b, h, q, d_v]`` in ``q``'s dtype."""
    enc = call.prep.encoding
    table, scaled = enc.counted_table()
    if table.shape[-1] != q.shape[-1]:  # the words of its eager path
        raise PosEncError(
            f"encoding {enc.name!r} has head_dim={table.shape[-1]}; q has head dim {q.shape[-1]}"
        )
    qf, kf, vf = _widened(q, k, v)
    qf, kf, vf = qf.contiguous(), kf.contiguous(), vf.contiguous()
    weight = table.to(qf.dtype)
    a = call.scale if scaled else 1.0
    out = _FusedCoPE.apply(qf, kf, vf, weight, call.keep, call.causal, call.scale, a)
    return out.to(q.dtype)
