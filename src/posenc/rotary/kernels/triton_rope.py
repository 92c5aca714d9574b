"""The fused RoPE kernel in Triton: q and k in one launch, any strides, both layouts.

Imported only when it is used (``triton`` is the optional extra ``posenc[triton]``).
One program handles one token ``(b, s)`` and a group of heads (all heads once there are
enough tokens to fill the GPU): it loads that token's cos/sin row ``[r/2]`` once and
reuses it for every head of q and of k. Offsets are computed in int64, so tensors past
2^31 elements are fine. Math runs in float32 (float64 for float64 inputs) with
``enable_fp_fusion=False``: every product is rounded before the sum, as in the plain
torch twin, so the two agree bit for bit.

Set ``TRITON_INTERPRET=1`` before triton is first imported to run the kernel on CPU
tensors through Triton's interpreter (that is how CI proves it without a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from posenc.rotary.layout import bshd_order

__all__ = ["launch_triton"]

# Enough programs to keep every SM of a large GPU busy before heads are split.
_TARGET_PROGRAMS = 1024
_TILE = 2048  # elements of one [heads, r/2] tile


@triton.jit
def _cast(v, DTYPE: tl.constexpr):
    """Round the float32/float64 result to the output dtype, to nearest even as torch does.

    bf16 is rounded with integer arithmetic on the float32 bits (what the GPU's
    round-to-nearest conversion does, and what Triton's CPU interpreter, which
    truncates, does not): the interpreter then checks bf16 outputs bit for bit too.
    """
    if DTYPE == tl.bfloat16:
        u = v.to(tl.uint32, bitcast=True)
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        bits = tl.where(v != v, (u >> 16) | 0x40, rounded)  # NaN stays a (quiet) NaN
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(DTYPE)


@triton.jit
def _rotate_heads(
    X,
    Y,
    x_tok,
    y_tok,
    sxh,
    sxd,
    syh,
    syd,
    h_start,
    h_end,
    c,
    s,
    R2,
    D,
    COMPUTE: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    COPY_REST: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Rotate heads ``[h_start, h_end)`` of one token; ``c``/``s`` are its ``[BLOCK_F]`` row."""
    f = tl.arange(0, BLOCK_F)
    f_ok = f < R2
    cc = c[None, :]
    ss = s[None, :]
    for h0 in range(h_start, h_end, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        h_ok = h < h_end
        hx = x_tok + h.to(tl.int64)[:, None] * sxh  # [BLOCK_H, 1] int64 offsets
        hy = y_tok + h.to(tl.int64)[:, None] * syh
        if INTERLEAVED:
            # One contiguous [BLOCK_H, 2 * BLOCK_F] tile, split into its even/odd channels.
            j = tl.arange(0, 2 * BLOCK_F)
            m2 = h_ok[:, None] & (j < 2 * R2)[None, :]
            x = tl.load(X + hx + j[None, :] * sxd, mask=m2, other=0.0).to(COMPUTE)
            x1, x2 = tl.split(tl.reshape(x, (BLOCK_H, BLOCK_F, 2)))
            o1 = x1 * cc - x2 * ss
            o2 = x2 * cc + x1 * ss
            o = tl.reshape(tl.join(o1, o2), (BLOCK_H, 2 * BLOCK_F))
            tl.store(Y + hy + j[None, :] * syd, _cast(o, Y.dtype.element_ty), mask=m2)
        else:
            m = h_ok[:, None] & f_ok[None, :]
            x1 = tl.load(X + hx + f[None, :] * sxd, mask=m, other=0.0).to(COMPUTE)
            x2 = tl.load(X + hx + (f + R2)[None, :] * sxd, mask=m, other=0.0).to(COMPUTE)
            o1 = x1 * cc - x2 * ss
            o2 = x2 * cc + x1 * ss
            tl.store(Y + hy + f[None, :] * syd, _cast(o1, Y.dtype.element_ty), mask=m)
            tl.store(Y + hy + (f + R2)[None, :] * syd, _cast(o2, Y.dtype.element_ty), mask=m)
        if COPY_REST:  # channels past rotary_dim pass through
            for p0 in range(2 * R2, D, BLOCK_P):
                p = p0 + tl.arange(0, BLOCK_P)
                mp = h_ok[:, None] & (p < D)[None, :]
                v = tl.load(X + hx + p[None, :] * sxd, mask=mp)
                tl.store(Y + hy + p[None, :] * syd, v, mask=mp)


@triton.jit
def _rope_kernel(
    Q,
    QO,
    K,
    KO,
    COS,
    SIN,
    S,
    HQ,
    HK,
    R2,
    D,
    q_per_group,
    k_per_group,
    sqb,
    sqs,
    sqh,
    sqd,
    sob,
    sos,
    soh,
    sod,
    skb,
    sks,
    skh,
    skd,
    spb,
    sps,
    sph,
    spd,
    scb,
    scs,
    COMPUTE: tl.constexpr,
    CONJUGATE: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    COPY_REST: tl.constexpr,
    HAS_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)  # token index b * S + s
    g = tl.program_id(1)  # head group
    b = tok // S
    s_idx = tok % S
    f = tl.arange(0, BLOCK_F)
    f_ok = f < R2
    c_off = b * scb + s_idx * scs + f
    c = tl.load(COS + c_off, mask=f_ok, other=0.0).to(COMPUTE)  # once per token ...
    s = tl.load(SIN + c_off, mask=f_ok, other=0.0).to(COMPUTE)
    if CONJUGATE:  # the backward pass: rotate by -angle
        s = -s
    # ... and reused for every head of q and of k.
    _rotate_heads(
        Q,
        QO,
        b * sqb + s_idx * sqs,
        b * sob + s_idx * sos,
        sqh,
        sqd,
        soh,
        sod,
        g * q_per_group,
        tl.minimum((g + 1) * q_per_group, HQ),
        c,
        s,
        R2,
        D,
        COMPUTE,
        INTERLEAVED,
        COPY_REST,
        BLOCK_H,
        BLOCK_F,
        BLOCK_P,
    )
    if HAS_K:
        _rotate_heads(
            K,
            KO,
            b * skb + s_idx * sks,
            b * spb + s_idx * sps,
            skh,
            skd,
            sph,
            spd,
            g * k_per_group,
            tl.minimum((g + 1) * k_per_group, HK),
            c,
            s,
            R2,
            D,
            COMPUTE,
            INTERLEAVED,
            COPY_REST,
            BLOCK_H,
            BLOCK_F,
            BLOCK_P,
        )


def launch_triton(
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
    """Rotate ``x_tensors`` (q, and k if given) into ``y_tensors`` in one launch, checked
    beforehand by :func:`posenc.rotary.kernels.ops.check_launch` (the CPU launcher's
    arguments: :func:`posenc.rotary.kernels.cpu.launch_cpu`).

    Tensors are ``[b, h, s, d]`` (``seq_dim=-2``) or ``[b, s, h, d]`` (``-3``) with any
    strides; cos/sin ``[.., S, R/2]`` with a contiguous last dimension and (b, s) element
    strides ``cos_strides``.
    """
    has_k = len(x_tensors) == 2
    q, qo = x_tensors[0], y_tensors[0]
    k, ko = (x_tensors[1], y_tensors[1]) if has_k else (q, qo)
    (bsz, seq, hq, d), _ = bshd_order(q.shape, q.stride(), seq_dim)
    hk = bshd_order(k.shape, k.stride(), seq_dim)[0][2] if has_k else 0
    # (b, s, h, d) element strides of q, its output, k and its output, in that order
    strides = [st for t in (q, qo, k, ko) for st in bshd_order(t.shape, t.stride(), seq_dim)[1]]
    r2 = cos.shape[-1]
    tokens = bsz * seq
    if tokens == 0 or max(hq, hk) == 0:
        return
    block_h, block_f, block_p, groups = _blocks(tokens, max(hq, hk), r2, d - 2 * r2)
    _rope_kernel[(tokens, groups)](
        q,
        qo,
        k,
        ko,
        cos,
        sin,
        seq,
        hq,
        hk,
        r2,
        d,
        triton.cdiv(hq, groups),
        triton.cdiv(hk, groups),
        *strides,
        *cos_strides,
        COMPUTE=tl.float64 if q.dtype == torch.float64 else tl.float32,
        CONJUGATE=conjugate,
        INTERLEAVED=interleaved,
        COPY_REST=(not inplace) and d > 2 * r2,
        HAS_K=has_k,
        BLOCK_H=block_h,
        BLOCK_F=block_f,
        BLOCK_P=block_p,
        num_warps=4,
        enable_fp_fusion=False,
    )


def _blocks(tokens: int, max_heads: int, r2: int, rest: int) -> tuple[int, int, int, int]:
    """``(BLOCK_H, BLOCK_F, BLOCK_P, head groups)`` of a launch: a ``[heads, r/2]`` tile
    of at most ``_TILE`` elements, ``rest`` pass-through channels copied ``BLOCK_P`` at a
    time, and heads split into groups only when too few tokens would fill the GPU."""
    block_f = triton.next_power_of_2(r2)
    block_h = max(1, min(triton.next_power_of_2(max_heads), _TILE // block_f))
    groups = max(1, min(triton.cdiv(max_heads, block_h), triton.cdiv(_TARGET_PROGRAMS, tokens)))
    return block_h, block_f, triton.next_power_of_2(max(rest, 1)), groups
