"""The FlexAttention path of :func:`posenc.remap.remapped_attention`.

Each branch of the map is one ``flex_attention`` call on that branch's rotated queries and
keys, its block mask keeping the visible pairs whose offset falls in the branch (whole
blocks of other pairs are skipped); the calls return their log-sum-exp and are merged by
it, which is one softmax over every key a query sees. No ``[sq, sk]`` scores are kept.
Compiled once per device type, like :mod:`posenc.attend.flex`; CUDA only, since torch
compiles the log-sum-exp output on CUDA alone (tests run it uncompiled on the CPU).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from posenc._base import PositionMap
from posenc.positions import causal_pairs
from posenc.remap.blocks import rotated

__all__ = ["refusal", "run"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: Tests set this to False to run FlexAttention uncompiled (the same masks, no compile).
_COMPILED = True


@functools.cache
def _module() -> Any:
    """``torch.nn.attention.flex_attention``, or None where this torch lacks it."""
    try:
        from torch.nn.attention import flex_attention
    except ImportError:
        return None
    return flex_attention if hasattr(flex_attention, "AuxRequest") else None


def _call(flex_attention: Callable[..., Any], aux: Any) -> Callable[..., Any]:
    def flex(q, k, v, score_mod, block_mask, scale):
        out, extra = flex_attention(
            q,
            k,
            v,
            score_mod=score_mod,
            block_mask=block_mask,
            scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
            return_aux=aux(lse=True),
        )
        return out, extra.lse

    return flex


@functools.cache
def _compiled(device_type: str) -> Callable[..., Any]:
    mod = _module()
    fn = _call(mod.flex_attention, mod.AuxRequest)
    return torch.compile(fn)


def refusal(q: torch.Tensor, k: torch.Tensor | None = None, v: torch.Tensor | None = None):
    """Why the Flex path cannot run this call, or None when it can."""
    if _module() is None:
        return "this torch has no torch.nn.attention.flex_attention with AuxRequest"
    if q.device.type != "cuda" and (_COMPILED or q.device.type != "cpu"):
        return (
            f"the merge of branches needs FlexAttention's log-sum-exp, which torch compiles "
            f"on CUDA only, got device {q.device}; use backend='chunked'"
        )
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v))
    if q.device.type == "cpu" and grad:
        return "FlexAttention has no backward on CPU; use 'chunked' or call under no_grad()"
    if q.dtype not in _DTYPES:
        return f"FlexAttention takes float32, bfloat16 or float16, got {q.dtype}"
    return None


def _mask_mod(pmap: PositionMap, branch: int, qpos, kpos, keep):
    """The pairs of ``branch`` a query sees: ``k_pos <= q_pos``, the offset's branch, and
    ``keep [B, H, Q, K]`` (its dims of size 1 broadcast) when given."""
    if keep is None:

        def mask_mod(b, h, q_idx, kv_idx):
            qp, kp = qpos[q_idx], kpos[kv_idx]
            seen = causal_pairs(0, 0, at=(qp, kp))
            return seen & (pmap.branch_at(qp - kp) == branch)

        return mask_mod
    per = [n > 1 for n in keep.shape]

    def keep_mod(b, h, q_idx, kv_idx):
        qp, kp = qpos[q_idx], kpos[kv_idx]
        seen = causal_pairs(0, 0, at=(qp, kp)) & (pmap.branch_at(qp - kp) == branch)
        at = [i if p else 0 for i, p in zip((b, h, q_idx, kv_idx), per, strict=True)]
        return seen & keep[at[0], at[1], at[2], at[3]]

    return keep_mod


def _softcap_mod(softcap: float | None):
    if softcap is None:
        return None

    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / softcap) * softcap

    return score_mod


def run(q, k, v, rotates, pmap: PositionMap, q_positions, k_positions, scale, softcap, keep):
    """The output ``[b, h, sq, d_v]``: one Flex call per branch, merged by log-sum-exp
    (``rotates``: the queries' and the keys' rotation)."""
    b, h, sq, _ = q.shape
    sk = k.shape[2]
    mod = _module()
    fn = _compiled(q.device.type) if _COMPILED else _call(mod.flex_attention, mod.AuxRequest)
    full = None if keep is None else keep.contiguous()
    kb = None if full is None or full.shape[0] == 1 else b
    kh = None if full is None or full.shape[1] == 1 else h
    outs, lses = [], []
    branches = range(pmap.branches)
    qs = rotated(
        q, rotates[0], [pmap.query_positions_at(i, q_positions) for i in branches], q.dtype
    )
    ks = rotated(k, rotates[1], [pmap.key_positions_at(i, k_positions) for i in branches], k.dtype)
    for branch, qb, kr in zip(branches, qs, ks, strict=True):
        mask_mod = _mask_mod(pmap, branch, q_positions, k_positions, full)
        block_mask = mod.create_block_mask(mask_mod, kb, kh, sq, sk, device=q.device)
        out, lse = fn(qb, kr, v, _softcap_mod(softcap), block_mask, scale)
        outs.append(out.float())
        lses.append(lse.float())
    lse = torch.stack(lses)  # [branches, b, h, sq]
    top = lse.amax(dim=0)
    weights = torch.exp(lse - top.clamp_min(torch.finfo(torch.float32).min))
    total = weights.sum(dim=0)
    merged = sum(w[..., None] * o for w, o in zip(weights, outs, strict=True))
    out = torch.where(total[..., None] > 0, merged / total.clamp_min(1e-30)[..., None], 0.0)
    return out.to(q.dtype)
