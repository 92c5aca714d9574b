"""A separable gated term folded into SDPA's own logits: forgetting attention at SDPA's speed.

A gated encoding whose term is ``D_ij = c_i - c_j`` (forgetting attention: ``c`` the
cumulative sum of the log forget gates) needs no ``[b, h, q, k]`` bias: in the softmax of
row ``i`` the row's own ``c_i`` cancels, and ``-c_j`` is one more channel of the keys.
With ``q' = [q * scale, 1, c_i - r]``, ``k' = [k, r - c_j, 1]`` (``r`` a constant of the
block of rows, below) and ``v`` zero-padded to the same width (SDPA's fused CPU kernel
wants equal head dims), ``softmax(q' k'^T) v'`` is the attention with the term, through
SDPA's fused kernels. The queries' channel adds a row constant, which changes nothing
forward; it is for the backward pass, where the gradient of ``c`` (so of the gates) then
takes each pair's share from both of SDPA's sums, over keys and over queries, as the eager
path's does (from the column sums alone it would be far less precise).

Precision: the channel holds ``r - c_j``, and a float32 logit of magnitude ``M`` carries
an error of about ``M * 6e-8``. So the queries are cut into blocks within which ``c``
falls by at most :data:`FOLD_RANGE`, with ``r`` the ``c`` of the block's first query: the
keys that matter to a row (those near it) then hold values in ``[0, FOLD_RANGE]``, those
far back large negative values whose weights vanish, each differenced in float64 and
rounded once. A block of one row serves any gate, so every call is served:

- heads are grouped by the number of blocks their decay needs (within 2x), and each
  group cut on its own, so a head that remembers is not cut as finely as one that forgets;
- a group whose decay never exceeds ``FOLD_RANGE`` is one SDPA call (``is_causal`` for
  self-attention); the others one call per block, with the causal rule as an additive mask
  (:func:`~posenc.positions.causal_pairs`' one fill and ``triu_``; the caller's
  ``attn_mask`` merged in as a bool one), but for a block whose first query sees no key
  before its own (self-attention's first block): square, it takes SDPA's ``is_causal``;
- a block skips the keys whose weight is below ``e^-u`` of the row's largest in each of
  its rows (:func:`_horizon`: in float32 no weight SDPA computes is then a subnormal, and
  the skipped ones are below float32's rounding of the sum). A head that forgets fast so
  attends in a band; many short blocks are padded to one size and sent as one batch when
  that costs less than the calls (:data:`CALL_PAIRS`);
- blocks whose pairs reach :data:`CHUNK_SCORES` in all are recomputed in the backward pass
  instead of keeping their masks.

Blocks need the host to see ``c`` (one synchronisation, after the one that checks the
gates), so under ``torch.compile`` the bias is materialised instead
(:func:`posenc.attend.paths.sdpa`), as it is for 16-bit queries off the CPU. The path's
costs, measured: ``benchmarks/RESULTS.md``; in words: ``docs/contextual.md``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from posenc._errors import tracing
from posenc.attend.paths import allowed_pairs
from posenc.positions import causal_pairs

__all__ = [
    "CALL_PAIRS",
    "CHUNK_SCORES",
    "EAGER_PAIRS",
    "FOLD_RANGE",
    "applies",
    "blocks",
    "eager_is_cheaper",
    "folded",
]

#: Within a block of queries every head's cumulative gate sum falls by at most this much:
#: the folded channel's values near each query lie in ``[0, FOLD_RANGE]``.
FOLD_RANGE = 16.0

#: Blocks whose (query, key) pairs reach this many in all are recomputed in the backward
#: pass (as the chunked path's blocks are) instead of keeping their masks.
CHUNK_SCORES = 1 << 22

#: What one more SDPA call costs, in (query, key) pairs of one head's arithmetic (about
#: 0.3 ms against 10 ns a pair, forward and backward, on one CPU thread): blocks are padded
#: to one size and sent as one batch when the padding (at 1.5x, for its mask) costs less
#: than the calls it saves (a head that forgets fast: many short blocks).
CALL_PAIRS = 30_000

#: Up to this many (query, key) pairs a head (``q_len * k_len``: 256 tokens), a call whose
#: gates fall by more than :data:`FOLD_RANGE` over its queries (so it is cut into blocks)
#: costs more folded than on the eager path: the blocks' calls and gathers outweigh a
#: ``[b, h, q, k]`` bias that small (at 64-128 tokens, gates that forget fast: 5.0-9.0x
#: SDPA's step folded, 1.6-3.2x eager; ``benchmarks/RESULTS.md``), so ``backend="auto"``
#: takes the eager path for it (:func:`eager_is_cheaper`).
EAGER_PAIRS = 1 << 16


def applies(q: torch.Tensor, enc: Any) -> bool:
    """Whether the call can fold its gated term: a separable encoding, not traced, float32
    or float64 queries (16-bit ones on CPU, widened to float32 as the eager path does)."""
    if not getattr(enc, "separable", False) or tracing():
        return False
    return q.dtype in (torch.float32, torch.float64) or q.device.type == "cpu"


def eager_is_cheaper(c: torch.Tensor, q_len: int, k_len: int) -> bool:
    """Whether a call with cumulative gate sums ``c`` (float64 ``[b, h, k]``) is cheaper on
    the eager path than folded: at most :data:`EAGER_PAIRS` pairs a head, and cut into
    blocks (see :data:`EAGER_PAIRS`). One synchronisation, as :func:`folded` has."""
    if q_len * k_len > EAGER_PAIRS:
        return False
    rows = c[..., k_len - q_len :].detach().reshape(-1, q_len)
    return float((rows[:, 0] - rows[:, -1]).max()) > FOLD_RANGE


def blocks(c: torch.Tensor, first: int, q_len: int, limit: float | None = None) -> list[int]:
    """Row boundaries ``[0, .., q_len]`` of the query blocks: greedy, each block as long as
    every head's ``c`` (float64 ``[b, h, k]``, non-increasing; queries at keys ``first +
    row``) falls by at most ``limit`` from its first row to its last (a block has at least
    one row)."""
    limit = FOLD_RANGE if limit is None else limit
    rows = c[..., first : first + q_len].detach().reshape(-1, q_len)  # [bh, q], non-increasing
    if float((rows[:, 0] - rows[:, -1]).max()) <= limit:
        return [0, q_len]
    ascending = (-rows).contiguous()
    edges, start = [0], 0
    while start < q_len:
        # per head the first row whose c lies below c[start] - limit
        ends = torch.searchsorted(ascending, (ascending[:, start] + limit)[:, None], right=True)
        start = max(start + 1, min(int(ends.min()), q_len))
        edges.append(start)
    return edges


def _horizon(q: torch.Tensor, k: torch.Tensor, scale: float) -> float:
    """A decay past which a key's weight is negligible in every row: a row's largest logit
    is at least that of its own key (term 0), and ``|scale q . k| <= scale |q| |k|``, so a
    key with term ``< -(B + u)``, ``B = 2 scale max|q| max|k|``, sits more than ``u`` below
    the row's largest logit.

    float64: ``u = 760`` (``exp(-u)`` is 0). float32: the kept keys' logits then lie within
    ``2 B + u`` of the row's largest, so ``u = 87 - 2 B`` keeps every weight SDPA computes
    a normal float (``e^-87``, not a subnormal, which the CPU's arithmetic is much slower
    on: ``benchmarks/RESULTS.md``), as long as the skipped
    weights stay below ``2^-24`` of the row's sum (``u >= 17 + ln k``); within ``[17 + ln
    k, 110]`` in any case (110: every skipped weight 0)."""
    qn = q.detach().to(torch.float64).norm(dim=-1).max()
    kn = k.detach().to(torch.float64).norm(dim=-1).max()
    bound = 2.0 * abs(scale) * float(qn * kn)
    if torch.promote_types(q.dtype, torch.float32) == torch.float64:
        return bound + 760.0
    least = 17.0 + math.log(k.shape[2])
    return bound + min(110.0, max(least, 87.0 - 2.0 * bound))


def _fold_inputs(q, k, v, scale: float):
    """``q' = [q * scale, 1, 0]`` and ``k' = [k, 0, 1]`` (channels ``d`` of the keys and
    ``d + 1`` of the queries are written per block), both repeated to ``q``'s heads, and
    the values, zero-padded: all to one width ``max(d + 2, d_v)`` (off the CPU rounded up
    to a multiple of 8)."""
    compute = torch.promote_types(q.dtype, torch.float32)
    rep = q.shape[1] // k.shape[1]
    qf, kf, vf = q.to(compute), k.to(compute), v.to(compute)
    if rep > 1:
        kf, vf = kf.repeat_interleave(rep, dim=1), vf.repeat_interleave(rep, dim=1)
    d, d_v = q.shape[-1], v.shape[-1]
    width = max(d + 2, d_v)
    if q.device.type != "cpu":  # CUDA's fused kernels want head dims in multiples of 8
        width = -(-width // 8) * 8
    ones = qf.new_ones(*qf.shape[:-1], 1)
    qp = F.pad(torch.cat([qf * scale, ones], dim=-1), (0, width - d - 1))
    kp = F.pad(
        torch.cat(
            [kf, torch.zeros_like(kf[..., :1]), ones[:, :, :1].expand(*kf.shape[:-1], 1)], dim=-1
        ),
        (0, width - d - 2),
    )
    return qp, kp, F.pad(vf, (0, width - d_v))


def _write(t: torch.Tensor, at: int, channel: torch.Tensor) -> torch.Tensor:
    """``t`` with its channel ``at`` replaced by ``channel [.., 1]`` (a new tensor)."""
    return torch.cat([t[..., :at], channel.to(t.dtype), t[..., at + 1 :]], dim=-1)


def _groups(c: torch.Tensor, first: int, q_len: int) -> list[torch.Tensor]:
    """The ``b * h`` rows of ``c`` grouped by how many blocks their decay needs (within a
    factor 2): a head that forgets fast needs many short blocks, one that remembers few
    long ones, and each group is cut into its own."""
    rows = c[..., first : first + q_len].detach().reshape(-1, q_len)
    need = (rows[:, 0] - rows[:, -1]) / FOLD_RANGE
    bucket = torch.where(need <= 1, 0, torch.floor(torch.log2(need.clamp(min=1))) + 1).long()
    return [torch.nonzero(bucket == u).flatten() for u in torch.unique(bucket)]


def _starts(c: torch.Tensor, first: int, edges: list[int], horizon: float | None) -> list[int]:
    """Per block the first key it needs: 0, or past the keys whose weight is 0 (in the dtype) in
    every row of the block (a term below ``-horizon`` at the block's first query)."""
    if horizon is None:
        return [0] * (len(edges) - 1)
    k_len = c.shape[-1]
    ascending = (-c).detach().reshape(-1, k_len).contiguous()
    starts = torch.tensor(edges[:-1], device=c.device) + first
    return torch.searchsorted(ascending, ascending[:, starts] - horizon).amin(0).tolist()


def _attend(qp, kp, vp, c, call: Any, d: int, horizon: float | None) -> torch.Tensor:
    """One group's blocks: ``qp [b, h, q, w]``, ``kp [b, h, k, w]`` (channel ``d`` written
    here, per block), ``vp``, ``c [b, h, k]``; the outputs of every query row ``[b, h, q, w]``."""
    q_len, k_len = qp.shape[2], kp.shape[2]
    first = k_len - q_len
    edges = blocks(c, first, q_len)
    los = _starts(c, first, edges, None if len(edges) == 2 else horizon)
    spans = list(zip(edges[:-1], edges[1:], los, strict=True))
    rows = max(stop - start for start, stop, _ in spans)
    keys = max(first + stop - lo for _, stop, lo in spans)
    pairs = sum((e - a) * (first + e - lo) for a, e, lo in spans)
    padded = len(spans) * rows * keys
    heads = qp.shape[0] * qp.shape[1]
    if call.keep is None and heads * (1.5 * padded - pairs) < CALL_PAIRS * (len(spans) - 1):
        return _batched(qp, kp, vp, c, call, d, spans, (rows, keys))
    lengths = (q_len, k_len)
    windows = _windows(qp, kp, vp, spans, first)
    if pairs > CHUNK_SCORES and torch.is_grad_enabled():
        # many long blocks: their masks would be kept for the backward pass (O(q k)
        # bytes), so each block is recomputed there instead (O(rows k) at a time)
        outs = [
            torch.utils.checkpoint.checkpoint(
                lambda qw, kw, vw, c, span=span: _block(qw, kw, vw, c, call, d, span, lengths),
                *window,
                c,
                use_reentrant=False,
            )
            for window, span in zip(windows, spans, strict=True)
        ]
    else:
        outs = [
            _block(qw, kw, vw, c, call, d, span, lengths)
            for (qw, kw, vw), span in zip(windows, spans, strict=True)
        ]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


class _Windows(torch.autograd.Function):
    """Windows ``t[:, :, lo:hi]`` of one tensor (views), whose gradients are summed into
    one tensor of ``t``'s shape: a slice's own backward fills a tensor of ``t``'s whole
    shape for each window (the largest cost of a folded backward pass, measured in
    ``benchmarks/RESULTS.md``)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(spans, t):  # type: ignore[override]
        return tuple(t.narrow(2, lo, hi - lo) for lo, hi in spans)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[override]
        ctx.spans, ctx.shape = inputs[0], inputs[1].shape
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        given = [(span, g) for span, g in zip(ctx.spans, grads, strict=True) if g is not None]
        if not given:
            return None, None
        total = given[0][1].new_zeros(ctx.shape)
        for (lo, hi), g in given:
            total.narrow(2, lo, hi - lo).add_(g)
        return None, total


def _windows(
    qp, kp, vp, spans, first: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per block (``spans``: query rows ``start:stop``, first key ``lo``) its rows of ``qp``
    and its keys ``lo:first + stop`` of ``kp`` and ``vp`` (:class:`_Windows`; the tensors
    themselves for one block over every row and key)."""
    if len(spans) == 1 and spans[0] == (0, qp.shape[2], 0) and first + qp.shape[2] == kp.shape[2]:
        return [(qp, kp, vp)]
    rows = tuple((start, stop) for start, stop, _ in spans)
    keys = tuple((lo, first + stop) for _, stop, lo in spans)
    qs, ks, vs = _Windows.apply(rows, qp), _Windows.apply(keys, kp), _Windows.apply(keys, vp)
    return list(zip(qs, ks, vs, strict=True))


def _block(qw, kw, vw, c, call: Any, d: int, span, lengths: tuple[int, int]) -> torch.Tensor:
    """Query rows ``start:stop`` (``qw``: those rows of the folded queries) over keys ``lo:``
    to their last query (``kw``, ``vw``: those keys), of a call of ``lengths = (q_len,
    k_len)``: one SDPA call."""
    start, stop, lo = span
    q_len, k_len = lengths
    first = k_len - q_len
    keys = first + stop  # the block's queries see keys [0, keys)
    ref = c[..., first + start].detach()[..., None]
    kb = _write(kw, d, (ref - c[..., lo:keys])[..., None])  # [b, h, keys - lo, w]
    qc = c[..., first + start : first + stop]
    qb = _write(qw, d + 1, (qc - ref)[..., None])  # [b, h, rows, w]
    # causal only, and the block's first query sees its first key and no earlier one: the
    # block is square and its rule SDPA's own (top-left) causal one, no mask built
    plain = call.keep is None and lo == first + start
    mask = None
    if call.keep is None and not plain:  # causal only: an additive mask SDPA reads as is
        mask = causal_pairs(
            q_len, k_len, rows=(start, stop), keys=(lo, keys), device=qw.device, additive=qw.dtype
        )
    elif not plain:
        mask, _ = allowed_pairs(call.keep, True, q_len, k_len, qw.device, rows=(start, stop))
        mask = None if mask is None else mask[..., lo:keys]
    return F.scaled_dot_product_attention(
        qb,
        kb,
        vw,
        attn_mask=mask,
        dropout_p=call.dropout_p,
        is_causal=plain,
        scale=1.0,
    )


def _batched(qp, kp, vp, c, call: Any, d: int, spans, size: tuple[int, int]) -> torch.Tensor:
    """Many short blocks (a head that forgets fast) as the batch of one SDPA call: each
    padded to ``size = (rows, keys)``, the padding masked out and its rows dropped."""
    b, h, q_len, w = qp.shape
    k_len = kp.shape[2]
    first = k_len - q_len
    rows, keys = size
    dev = qp.device
    start = torch.tensor([s for s, _, _ in spans], device=dev)
    stop = torch.tensor([e for _, e, _ in spans], device=dev)
    lo = torch.tensor([lo for _, _, lo in spans], device=dev)
    qi = start[:, None] + torch.arange(rows, device=dev)  # [n, rows], query rows
    ki = lo[:, None] + torch.arange(keys, device=dev)  # [n, keys], key indices
    mask = causal_pairs(q_len, k_len, at=(qi[:, :, None], ki[:, None, :]))
    mask = mask & (qi < stop[:, None])[:, :, None]  # [n, rows, keys]
    mask = mask | ~mask.any(-1, keepdim=True)  # a padding row sees every key (then dropped)
    qs, ks = qi.clamp(max=q_len - 1).flatten(), ki.clamp(max=k_len - 1).flatten()
    n = len(spans)

    def gather(t, index, length):  # [b, h, L, w] -> [n * b, h, length, w]
        g = t.index_select(2, index).reshape(b, h, n, length, t.shape[-1])
        return g.permute(2, 0, 1, 3, 4).reshape(n * b, h, length, t.shape[-1])

    ref = c[..., first + start].detach()[..., None]  # [b, h, n, 1]
    kc = (ref - c.index_select(2, ks).reshape(b, h, n, keys)).permute(2, 0, 1, 3)
    kg = _write(gather(kp, ks, keys), d, kc.reshape(n * b, h, keys, 1))
    qc = (c.index_select(2, qs + first).reshape(b, h, n, rows) - ref).permute(2, 0, 1, 3)
    qg = _write(gather(qp, qs, rows), d + 1, qc.reshape(n * b, h, rows, 1))
    out = F.scaled_dot_product_attention(
        qg,
        kg,
        gather(vp, ks, keys),
        attn_mask=(mask if b == 1 else mask.repeat_interleave(b, 0))[:, None],  # n-major
        dropout_p=call.dropout_p,
        scale=1.0,
    )
    out = out.reshape(n, b, h, rows, w).permute(1, 2, 0, 3, 4).reshape(b, h, n * rows, w)
    real = (qi < stop[:, None]).flatten().nonzero().flatten()
    return out.index_select(2, real)


def folded(q, k, v, call: Any, c: torch.Tensor) -> torch.Tensor:
    """The SDPA path of :func:`posenc.attention` for a separable gated term ``c_i - c_j`` (``c``
    float64 ``[b, h, k]``, differentiable): the term folded into the keys, per group of
    heads and block of query rows (see the module docs)."""
    b, h, q_len, d = q.shape
    k_len, d_v = k.shape[2], v.shape[-1]
    qp, kp, vp = _fold_inputs(q, k, v, call.scale)
    keep = call.keep
    groups = [torch.arange(b * h)] if keep is not None else _groups(c, k_len - q_len, q_len)
    horizon = None if keep is not None else _horizon(q, k, call.scale)
    if len(groups) == 1:
        out = _attend(qp, kp, vp, c, call, d, horizon)
    else:  # each group as the heads of one batch: [1, rows, ...], then back in order

        def flat(t):
            return t.reshape(1, b * h, *t.shape[2:])

        parts = [
            _attend(flat(qp)[:, g], flat(kp)[:, g], flat(vp)[:, g], flat(c)[:, g], call, d, horizon)
            for g in groups
        ]
        order = torch.argsort(torch.cat(groups))
        out = torch.cat(parts, dim=1)[:, order].reshape(b, h, q_len, -1)
    out = out[..., :d_v]
    if keep is not None:  # the rows that may attend to no key: output 0, not NaN
        _, empty = allowed_pairs(keep, True, q_len, k_len, q.device)
        if empty is not None:
            out = out.masked_fill(empty, 0.0)
    return out.to(q.dtype)
