"""The fused CPU path of :func:`posenc.remap.remapped_attention` (``backend="auto"``).

Per block of query rows and per branch, torch's CPU flash kernel (the one
``scaled_dot_product_attention`` runs on the CPU) attends the branch's rotated queries to
the keys it reads (:mod:`posenc.remap.blocks`) under a mask of the branch's pairs, and gives
its log-sum-exp; the branches are merged by it, one softmax over every key a query sees.
The kernel's entry point returning the log-sum-exp is private
(``aten::_scaled_dot_product_flash_attention_for_cpu``): the path runs only where it exists,
without gradients (none flows through the log-sum-exp), without a softcap, and with
``d_v == d``; the chunked path is its readable twin, and the tests hold them equal.
"""

from __future__ import annotations

from typing import Any

import torch

from posenc._base import PositionMap
from posenc.positions import causal_pairs
from posenc.remap.blocks import Block, plan, rotated

__all__ = ["refusal", "run"]

_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _op() -> Any:
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def refusal(q, k, v, softcap: float | None) -> str | None:
    """Why the fused path cannot run this call, or None when it can."""
    if _op() is None:
        return "this torch has no CPU flash kernel returning its log-sum-exp"
    if q.device.type != "cpu":
        return f"the fused path runs on the CPU, got {q.device}"
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return "no gradient flows through the kernel's log-sum-exp"
    if softcap is not None:
        return "the kernel has no softcap"
    if v.shape[-1] != q.shape[-1] or q.dtype not in _DTYPES:
        return "the kernel needs d_v == d and a float dtype"
    return None


def _merge(parts: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype) -> torch.Tensor:
    """One softmax from the branches' outputs and log-sum-exps (``-inf``: no key)."""
    if len(parts) == 1:
        out, lse = parts[0]
        return out.masked_fill(~torch.isfinite(lse)[..., None], 0.0)
    lse = torch.stack([torch.broadcast_to(p[1], parts[0][0].shape[:-1]) for p in parts])
    top = lse.amax(dim=0)
    top = torch.where(torch.isfinite(top), top, 0.0)
    weights = torch.exp(lse - top)  # [branches, b, h, rows]; 0 for a branch with no key
    total = weights.sum(dim=0)
    merged = sum(w[..., None] * o.to(w.dtype) for w, (o, _) in zip(weights, parts, strict=True))
    out = merged / torch.where(total > 0, total, 1.0)[..., None]
    return out.to(dtype)


def _mask(pmap: PositionMap, branch: int, blk: Block, qpos, k_positions, keep, dtype):
    """``(mask, seen)``: the additive mask ``[.., rows, keys]`` of the branch's pairs over its
    keys ``blk.ranges[branch]``, and the rows that see a key there (None: all do). Without
    ``keep`` only the keys outside ``blk.whole[branch]`` (two bands) are compared."""
    lo, hi = blk.ranges[branch]
    a, c = blk.whole[branch] if blk.whole and keep is None else (lo, lo)
    mask = torch.zeros((qpos.shape[0], hi - lo), dtype=dtype)
    seen = None
    for u, w in ((lo, a), (c, hi)):
        if w <= u:
            continue
        kpos = k_positions[None, u:w]
        sel = causal_pairs(0, 0, at=(qpos, kpos)) & (pmap.branch_at(qpos - kpos) == branch)
        if keep is not None:
            rows = keep if keep.shape[2] == 1 else keep[:, :, blk.start : blk.stop]
            sel = sel & (rows if rows.shape[3] == 1 else rows[..., u:w])
            mask = mask.expand(*sel.shape[:-1], hi - lo).clone() if mask.ndim < sel.ndim else mask
        mask[..., u - lo : w - lo].masked_fill_(~sel, float("-inf"))
        rows = sel.any(dim=-1)
        seen = rows if seen is None else seen | rows
    return mask, (None if c > a else seen)


def run(q, k, v, rotates, pmap: PositionMap, q_positions, k_positions, scale, keep, rows):
    """The output ``[b, h, sq, d]`` of a call :func:`refusal` lets through."""
    op = _op()
    branches = range(pmap.branches)
    qs = rotated(
        q, rotates[0], [pmap.query_positions_at(i, q_positions) for i in branches], q.dtype
    )
    ks = rotated(k, rotates[1], [pmap.key_positions_at(i, k_positions) for i in branches], k.dtype)
    out = q.new_empty(q.shape)
    for blk in plan(pmap, q_positions, k_positions, rows):
        r0, r1 = blk.start, blk.stop
        qpos = q_positions[r0:r1, None]  # [rows, 1]
        parts = []
        for i in branches:
            lo, hi = blk.ranges[i]
            if hi <= lo:
                continue
            mask, seen = _mask(pmap, i, blk, qpos, k_positions, keep, q.dtype)
            o, lse = op(
                qs[i][:, :, r0:r1],
                ks[i][:, :, lo:hi],
                v[:, :, lo:hi],
                0.0,
                False,
                attn_mask=mask,
                scale=scale,
            )
            parts.append((o, lse if seen is None else lse.masked_fill(~seen, float("-inf"))))
        if parts:
            out[:, :, r0:r1] = _merge(parts, q.dtype)
        else:
            out[:, :, r0:r1] = 0.0
    return out
