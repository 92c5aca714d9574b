"""Attention under a position map: each (query, key) pair rotated where its branch says.

For every branch of the map the queries and keys are rotated once, at that branch's
positions (``O(s * d)`` each: the map moves positions, never pairs). A pair's logit is the
dot product of its branch's rotated query and key, chosen per pair by the branch of its
offset ``q_positions[i] - k_positions[j]``; one softmax then runs over every key the query
sees (``k_positions[j] <= q_positions[i]``, and ``keep``).

Paths (``backend``):

- ``"eager"``: all query rows at once (``[b, h, sq, sk]`` scores per branch);
- ``"chunked"``: blocks of ``block`` query rows, each against the keys up to the block's last
  query position when the key positions are sorted: memory ``O(s * block)``, never an
  ``[sq, sk]`` tensor; each block recomputed in the backward pass;
- ``"flex"``: one FlexAttention call per branch, its pairs chosen by a mask, merged by their
  log-sum-exp (:mod:`posenc.remap.flex`; where FlexAttention runs, float32 or narrower);
- ``"auto"``: on the CPU without gradients or softcap, torch's CPU flash kernel per block
  and branch, merged by log-sum-exp (:mod:`posenc.remap.fused`); else chunked (one block
  when the scores fit). Flex is asked for by name: its compiled CUDA kernel has not been
  checked against the others on a GPU yet.

Grouped-query attention reads each key/value head for its group of query heads without
repeating it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint

from posenc._base import PositionMap
from posenc._errors import (
    PosEncError,
    check_choice,
    check_float,
    check_int,
    check_positions,
    check_qkv,
    check_scale,
    check_tensor,
    describe,
)
from posenc.positions import causal_pairs, check_distances
from posenc.remap import flex as _flex
from posenc.remap import fused as _fused
from posenc.remap.blocks import Block, plan, rotated
from posenc.remap.maps import coerce

__all__ = ["BACKENDS", "BLOCK_SCORES", "remapped_attention", "remapped_attention_at"]

BACKENDS = ("auto", "eager", "chunked", "flex")

#: The chunked path's default block holds about this many scores (``b * h * rows * sk``)
#: per branch.
BLOCK_SCORES = 1 << 22

Rotate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# --- validation -------------------------------------------------------------------------


def _check_qkv(q: Any, k: Any, v: Any) -> None:
    check_qkv(q, k, v)
    b, h, sq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise PosEncError(
            f"k must be [b, h_kv, sk, d] with q's b={b} and d={d}, got shape {tuple(k.shape)}"
        )
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise PosEncError(
            f"v must be [b, h_kv, sk, d_v] with k's b, h_kv and sk, got shapes "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    hk, sk = k.shape[1], k.shape[2]
    if min(b, h, sq, d, hk, sk, v.shape[3]) < 1:
        raise PosEncError(
            f"q, k and v must be non-empty, got shapes {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if h % hk:
        raise PosEncError(
            f"k's heads ({hk}) must divide q's heads ({h}) (grouped-query attention), got "
            f"shapes {tuple(q.shape)}, {tuple(k.shape)}"
        )


def _check_pos(name: str, value: Any, length: int, device: torch.device) -> torch.Tensor:
    check_positions(name, value, seq_len=length, ndims=(1,))
    if value.is_floating_point():
        raise PosEncError(f"{name} must be an integer tensor (int64 positions), got {value.dtype}")
    if value.device != device:
        raise PosEncError(f"{name} must be on {device} (that of q), got {value.device}")
    return value.long()


def _check_keep(keep: Any, shape: tuple[int, ...], device: torch.device) -> torch.Tensor | None:
    if keep is None:
        return None
    check_tensor("keep", keep)
    if keep.dtype != torch.bool:
        raise PosEncError(f"keep must be a bool tensor (True = may attend), got {keep.dtype}")
    if keep.device != device:
        raise PosEncError(f"keep must be on {device} (that of q), got {keep.device}")
    fits = keep.ndim <= 4 and all(
        n in (1, m) for n, m in zip(keep.shape[::-1], shape[::-1], strict=False)
    )
    if not fits:
        raise PosEncError(
            f"keep must broadcast to [b, h, sq, sk] = {list(shape)}, got shape {tuple(keep.shape)}"
        )
    return keep.reshape((1,) * (4 - keep.ndim) + tuple(keep.shape))


# --- the computation ----------------------------------------------------------------------


def _block(qs, ks, v, qpos, kpos, keep, pmap: PositionMap, softcap, blk: Block) -> torch.Tensor:
    """Output rows ``[b, hk, g, rows, d_v]`` of one block: ``qs`` per branch ``[b, hk, g,
    rows, d]`` (scaled), ``ks`` per branch ``[b, hk, keys, d]``, ``v [b, hk, keys, d_v]``,
    ``qpos [rows]``, ``kpos [keys]``, ``keep [B, H, G, Q, keys]`` or None; branch ``i``
    reads its keys ``blk.ranges[i]`` only."""
    b, hk, g, rows, d = qs[0].shape
    keys = kpos.shape[0]
    branch = pmap.branch_at(qpos[:, None] - kpos[None, :])  # [rows, keys]
    logits = qs[0].new_full((b, hk, g, rows, keys), float("-inf"))
    for i, (qb, kb) in enumerate(zip(qs, ks, strict=True)):
        lo, hi = blk.ranges[i]
        if hi <= lo:
            continue
        part = qb.reshape(b, hk, g * rows, d) @ kb[:, :, lo:hi].transpose(-1, -2)
        at = branch[:, lo:hi] == i
        logits[..., lo:hi] = torch.where(at, part.view(b, hk, g, rows, -1), logits[..., lo:hi])
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    allowed = causal_pairs(0, 0, at=(qpos[:, None], kpos[None, :]))  # k_pos <= q_pos
    if keep is not None:
        allowed = allowed & (keep if keep.shape[3] == 1 else keep[:, :, :, blk.start : blk.stop])
    empty = ~allowed.any(dim=-1, keepdim=True)  # rows that see no key: output 0
    logits = logits.masked_fill(~(allowed | empty), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    out = (probs.reshape(b, hk, g * rows, -1) @ v).view(b, hk, g, rows, -1)
    return out.masked_fill(empty, 0.0)


def _keep5(keep: torch.Tensor | None, hk: int, g: int) -> torch.Tensor | None:
    """``keep [B, H, Q, K]`` as ``[B, hk|1, g|1, Q, K]`` (the query heads by key head)."""
    if keep is None:
        return None
    kb, kh = keep.shape[0], keep.shape[1]
    return keep.reshape(kb, hk if kh > 1 else 1, g if kh > 1 else 1, *keep.shape[2:])


def _chunked(q, k, v, rotates, pmap, q_positions, k_positions, scale, softcap, keep, rows):
    b, h, sq, d = q.shape
    hk, g = k.shape[1], h // k.shape[1]
    compute = torch.promote_types(q.dtype, torch.float32)
    qp = [pmap.query_positions_at(i, q_positions) for i in range(pmap.branches)]
    kp = [pmap.key_positions_at(i, k_positions) for i in range(pmap.branches)]
    qs = [(x * scale).view(b, hk, g, sq, d) for x in rotated(q, rotates[0], qp, compute)]
    ks = rotated(k, rotates[1], kp, compute)
    vf = v.to(compute)
    keep5 = _keep5(keep, hk, g)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (*qs, *ks, vf))
    outs = []
    for blk in plan(pmap, q_positions, k_positions, rows):
        r0, r1, end = blk.start, blk.stop, blk.end
        args = (
            [x[:, :, :, r0:r1] for x in qs],
            [x[:, :, :end] for x in ks],
            vf[:, :, :end],
            q_positions[r0:r1],
            k_positions[:end],
            None if keep5 is None else keep5[..., :end],
        )
        if grad:
            out = torch.utils.checkpoint.checkpoint(
                _block, *args, pmap, softcap, blk, use_reentrant=False
            )
        else:
            out = _block(*args, pmap, softcap, blk)
        outs.append(out)
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=3)
    return out.reshape(b, h, sq, -1).to(q.dtype)


# --- public -----------------------------------------------------------------------------


def remapped_attention_at(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    rotate: Rotate,
    position_map: PositionMap,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    scale: float | None = None,
    softcap: float | None = None,
    keep: torch.Tensor | None = None,
    backend: str = "auto",
    block: int | None = None,
    rotate_keys: Rotate | None = None,
) -> torch.Tensor:
    """:func:`remapped_attention` of arguments the caller has checked as it does (``keep``
    of 4 dims, int64 positions on q's device): nothing is validated again."""
    b, h, sq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    rotates = (rotate, rotate if rotate_keys is None else rotate_keys)
    if backend == "flex":
        return _flex.run(
            q, k, v, rotates, position_map, q_positions, k_positions, scale, softcap, keep
        )
    if backend == "eager":
        rows = sq
    elif block is not None:
        rows = min(block, sq)
    else:
        rows = min(sq, max(1, BLOCK_SCORES // (b * h * k.shape[2])))
    if backend == "auto" and _fused.refusal(q, k, v, softcap) is None:
        return _fused.run(
            q, k, v, rotates, position_map, q_positions, k_positions, scale, keep, rows
        )
    return _chunked(
        q, k, v, rotates, position_map, q_positions, k_positions, scale, softcap, keep, rows
    )


def remapped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    rotate: Rotate,
    position_map: PositionMap | dict[str, Any],
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    scale: float | None = None,
    softcap: float | None = None,
    keep: torch.Tensor | None = None,
    backend: str = "auto",
    block: int | None = None,
    rotate_keys: Rotate | None = None,
) -> torch.Tensor:
    """Attention whose (query, key) pairs are rotated where ``position_map`` says.

    Args:
        q, k, v: ``h_kv`` must divide ``h`` (grouped-query attention); one floating dtype.
        rotate: ``rotate(x, positions) -> x`` rotated, ``x [b, heads, s, d]`` at
            ``positions [s]`` (int64, or float64 where the map gives fractions): the
            caller's rotary encoding (:func:`posenc.attention` passes its encoding's).
        position_map: a :class:`~posenc.remap.SelfExtend`, :class:`~posenc.remap.String` or
            its config dict (:func:`~posenc.remap.position_map`).
        q_positions, k_positions: int64 ``[sq]`` / ``[sk]``, shared by the batch; key ``j``
            is visible to query ``i`` iff ``k_positions[j] <= q_positions[i]``.
        scale: logits multiplier, default ``1 / sqrt(d)``.
        softcap: ``None`` or ``> 0``: logits ``softcap * tanh(logits / softcap)`` after the
            scale, before the mask (Gemma 2).
        keep: a bool mask broadcastable to ``[b, h, sq, sk]``, True where a query may
            attend (combined with the positions' causality). A row seeing no key gives 0.
        backend: ``"auto"``, ``"eager"``, ``"chunked"`` or ``"flex"`` (module docstring).
        block: query rows per chunked block (default: about :data:`BLOCK_SCORES` scores).
        rotate_keys: the keys' rotation where it is not ``rotate`` (xPos scales them apart).

    Shape:
        ``q [b, h, sq, d]``, ``k [b, h_kv, sk, d]``, ``v [b, h_kv, sk, d_v]`` ->
        ``[b, h, sq, d_v]`` in q's dtype; the softmax in float32 (float64 for float64).

    Raises:
        PosEncError: a bad argument, naming it.
    """
    _check_qkv(q, k, v)
    b, h, sq, d = q.shape
    sk = k.shape[2]
    for name, f in (("rotate", rotate), ("rotate_keys", rotate_keys)):
        if not callable(f) and not (name == "rotate_keys" and f is None):
            raise PosEncError(f"{name} must be a callable {name}(x, positions), got {describe(f)}")
    pmap = coerce(position_map, "position_map")
    q_positions = _check_pos("q_positions", q_positions, sq, q.device)
    k_positions = _check_pos("k_positions", k_positions, sk, q.device)
    check_distances(q_positions, k_positions)  # offsets q - k exact in int64
    scale = None if scale is None else check_scale(scale, d, q.dtype)
    if softcap is not None:
        logits = torch.promote_types(q.dtype, torch.float32)
        top = float(torch.finfo(logits).max)
        softcap = check_float("softcap", softcap, min=0.0, min_exclusive=True)
        if softcap > top:
            raise PosEncError(f"softcap must be <= {top:.4g} (finite in {logits}), got {softcap:g}")
    keep = _check_keep(keep, (b, h, sq, sk), q.device)
    check_choice("backend", backend, BACKENDS)
    if block is not None:
        block = check_int("block", block, min=1)
    if backend == "flex" and (why := _flex.refusal(q, k, v)) is not None:
        raise PosEncError(f"backend='flex' cannot run here: {why}")
    return remapped_attention_at(
        q,
        k,
        v,
        rotate=rotate,
        position_map=pmap,
        q_positions=q_positions,
        k_positions=k_positions,
        scale=scale,
        softcap=softcap,
        keep=keep,
        backend=backend,
        block=block,
        rotate_keys=rotate_keys,
    )
