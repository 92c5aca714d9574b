"""The eager, chunked and SDPA paths of :func:`posenc.attention`, and the mask rule.

All compute ``softmax(q k^T * scale + bias + mask) v``. The pairs that may attend come
from one function, :func:`allowed_pairs`: the causal rule (queries are the last ``q`` of
the ``k`` keys) and the bool ``attn_mask``. A query row that may attend to no key returns
0, not NaN: its row is opened up before the softmax and its output zeroed after.

The eager path is also where contextual encodings (CoPE: a bias from the logits, queries
and keys) and gated ones (forgetting attention: a bias from per-token gates) add their
term; the chunked path is the eager one over blocks of query rows, each recomputed in the
backward pass, for sequences whose ``[b, h, q, k]`` tensors do not fit many times over.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from posenc._base import ContextualEncoding, GatedEncoding
from posenc.positions import causal_pairs

__all__ = ["CHUNK_SCORES", "Call", "allowed_pairs", "chunked", "eager", "sdpa"]


@dataclasses.dataclass(frozen=True)
class Call:
    """What every path of one attention call needs besides ``q``, ``k``, ``v`` (validated
    by :func:`posenc.attention`).

    Attributes:
        prep: the bias, contextual or gated encoding with its positions
            (:class:`~posenc.attend.PreparedEncoding`), or None (no term; a rotary
            encoding has rotated ``q`` and ``k`` already).
        keep: the validated bool mask ``[b|1, h|1, q|1, k]`` (True = may attend), or None.
        causal, scale, dropout_p: as :func:`posenc.attention` takes them.
        gates: a gated encoding's per-token gates ``[b, h, k]``, or None.
        attn_mask: the caller's own mask object (``keep`` is a view of it): the key under
            which a prepared SDPA mask is kept for the layers of one forward pass.
    """

    prep: Any
    keep: torch.Tensor | None
    causal: bool
    scale: float
    dropout_p: float = 0.0
    gates: torch.Tensor | None = None
    attn_mask: Any = None

    def checked_gates(self) -> torch.Tensor:
        """``gates`` of a gated encoding: :func:`posenc.attention` has checked they are given
        (and fit), so they are never None here."""
        return cast(torch.Tensor, self.gates)


def allowed_pairs(
    keep: torch.Tensor | None,
    causal: bool,
    q_len: int,
    k_len: int,
    device: Any,
    *,
    rows: tuple[int, int] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(allowed, empty)``: bool ``[.., q, k]`` of the pairs that may attend (None: all),
    with the rows that may attend to no key opened up, and those rows ``[.., q, 1]`` (None
    when there are none by construction: without ``keep`` every causal row sees a key).

    ``keep`` is the validated ``attn_mask`` ``[b|1, h|1, q|1, k]`` or None; ``rows =
    (start, stop)`` restricts the answer to those query rows (of ``q_len``).
    """
    start, stop = (0, q_len) if rows is None else rows
    allowed = keep
    if keep is not None and rows is not None and keep.shape[2] != 1:
        allowed = keep[:, :, start:stop]
    if causal:
        tri = causal_pairs(q_len, k_len, rows=(start, stop), device=device)  # [q, k]
        allowed = tri if allowed is None else allowed & tri
    if allowed is None or keep is None:
        return allowed, None
    empty = ~allowed.any(dim=-1, keepdim=True)  # rows with no key: output 0, not NaN
    return allowed | empty, empty


def _block(qf, kf, vf, call: Call, start: int, q_len: int, bias=None) -> torch.Tensor:
    """Output rows ``start : start + qf.shape[2]`` (of ``q_len`` queries) of the eager path.

    ``bias``: a bias encoding's term of these rows, computed by the caller (the chunked
    path: once, outside the recomputed blocks); None: computed here."""
    prep = call.prep
    stop = start + qf.shape[2]
    logits = (qf * call.scale) @ kf.transpose(-1, -2)  # [b, h, rows, k]
    allowed, empty = allowed_pairs(
        call.keep, call.causal, q_len, kf.shape[2], qf.device, rows=(start, stop)
    )
    enc = None if prep is None else prep.encoding
    if isinstance(enc, ContextualEncoding):
        bias = enc.contextual_bias_at(logits, qf, kf, allowed=allowed, scale=call.scale)
        logits = logits + bias.to(logits.dtype)
    elif isinstance(enc, GatedEncoding):
        bias = enc.gate_bias_at(call.checked_gates(), q_len, start=start, stop=stop)
        logits = logits + bias.to(logits.dtype)
    elif enc is not None:
        if bias is None:
            bias = prep.bias(qf, call.scale)
            if (start, stop) != (0, q_len):
                bias = bias[..., start:stop, :]
        logits = logits + bias.to(logits.dtype)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if call.dropout_p:
        probs = F.dropout(probs, p=call.dropout_p)
    out = probs @ vf  # [b, h, rows, d_v]
    if prep is not None and prep.value_dependent:
        out = out + prep.value_bias(probs).to(out.dtype)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return out


def _widened(q, k, v):
    """``q``, ``k``, ``v`` in float32 or wider, the key/value heads repeated to ``q``'s."""
    compute = torch.promote_types(q.dtype, torch.float32)
    rep = q.shape[1] // k.shape[1]
    kf = k.to(compute).repeat_interleave(rep, dim=1)  # [b, h, k, d]
    vf = v.to(compute).repeat_interleave(rep, dim=1)  # [b, h, k, d_v]
    return q.to(compute), kf, vf


def eager(q, k, v, call: Call) -> torch.Tensor:
    """softmax(q k^T * scale + bias + mask) v with plain tensor operations, float32 or wider."""
    qf, kf, vf = _widened(q, k, v)
    return _block(qf, kf, vf, call, 0, q.shape[2]).to(q.dtype)


#: The chunked path computes this many attention scores (``b * h * rows * k``) per block.
CHUNK_SCORES = 1 << 22


def chunked(q, k, v, call: Call, block_scores: int | None = None) -> torch.Tensor:
    """The eager path one block of query rows at a time, each block recomputed in the
    backward pass (:func:`torch.utils.checkpoint.checkpoint`) instead of kept: memory
    ``O(b h rows k)`` instead of ``O(b h q k)`` per tensor. The same numbers as
    :func:`eager` (the rows do not interact), gradients included.

    A bias of positions (T5, FIRE, Kerple, ALiBi: no query in it) is computed once, before
    the blocks, and each block is handed its rows as an input: the prepared encoding keeps
    its bias after the first use, so a block computing it would save other tensors in its
    forward than in its recomputation (which ``checkpoint`` refuses), and the learned
    parameters get their gradient through that one bias."""
    qf, kf, vf = _widened(q, k, v)
    b, h, q_len, _ = q.shape
    per_row = b * h * k.shape[2]
    rows = max(1, (block_scores or CHUNK_SCORES) // per_row)
    enc = None if call.prep is None else call.prep.encoding
    full = None
    if enc is not None and not isinstance(enc, (ContextualEncoding, GatedEncoding)):
        full = call.prep.bias(qf, call.scale)  # [b|1, h, q, k] or [h, q, k]: no q in it
    inputs = [t for t in (qf, kf, vf, call.gates, full) if t is not None]
    if enc is not None:
        inputs += list(enc.parameters())
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    outs = []
    for start in range(0, q_len, rows):
        qb = qf[:, :, start : start + rows]
        bias = None if full is None else full[..., start : start + rows, :]
        if grad:
            out = torch.utils.checkpoint.checkpoint(
                lambda qb, kf, vf, bias, start=start: _block(qb, kf, vf, call, start, q_len, bias),
                qb,
                kf,
                vf,
                bias,
                use_reentrant=False,
            )
        else:
            out = _block(qb, kf, vf, call, start, q_len, bias)
        outs.append(out)
    return torch.cat(outs, dim=2).to(q.dtype)


def sdpa(q, k, v, call: Call) -> torch.Tensor:
    """SDPA: is_causal / a bool mask without a bias, one merged float mask with one (a
    separable gated term goes to :func:`posenc.attend.folded.folded` instead, which
    :func:`posenc.attention` calls where it applies)."""
    prep, keep, causal, scale = call.prep, call.keep, call.causal, call.scale
    dropout_p = call.dropout_p
    q_len, k_len = q.shape[2], k.shape[2]
    gqa = True if q.shape[1] != k.shape[1] else False  # a Python bool under torch.compile
    if prep is None and keep is None and (not causal or q_len == k_len):
        # No bias and at most plain causal self-attention: SDPA's fused kernels.
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale, enable_gqa=gqa
        )
    if prep is None:
        mask, empty = allowed_pairs(keep, causal, q_len, k_len, q.device)
    elif isinstance(prep.encoding, GatedEncoding):  # per-call gates: a fresh mask per call
        allowed, empty = allowed_pairs(keep, causal, q_len, k_len, q.device)
        mask = prep.encoding.gate_bias_at(call.checked_gates(), q_len).to(q.dtype)
        if allowed is not None:
            mask = mask.masked_fill(~allowed, float("-inf"))
    else:  # the merged float mask: once per forward pass when the bias depends on no q
        mask, empty = prep.sdpa_mask(q, scale, keep=keep, causal=causal, mask_id=call.attn_mask)
    if (
        mask is not None
        and mask.requires_grad
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64)
        and not dropout_p
    ):
        # A learned bias (T5, FIRE, Kerple) on CPU: SDPA's fused kernel cannot give the
        # mask's gradient, and its math path (a safe softmax over every row) is about 1.5x
        # slower than the same three operations written out.
        rep = q.shape[1] // k.shape[1]
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = torch.softmax((q * scale) @ k.transpose(-1, -2) + mask, dim=-1) @ v
    else:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale, enable_gqa=gqa
        )
    return out if empty is None else out.masked_fill(empty, 0.0)
