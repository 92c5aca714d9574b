"""The eager and SDPA paths of :func:`posenc.attention`, and the mask rule both follow.

Both compute ``softmax(q k^T * scale + bias + mask) v``. The pairs that may attend come
from one function, :func:`allowed_pairs`: the causal rule (queries are the last ``q`` of
the ``k`` keys) and the bool ``attn_mask``. A query row that may attend to no key returns
0, not NaN: its row is opened up before the softmax and its output zeroed after.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["allowed_pairs", "eager", "sdpa"]


def allowed_pairs(
    keep: torch.Tensor | None, causal: bool, q_len: int, k_len: int, device: Any
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(allowed, empty)``: bool ``[.., q, k]`` of the pairs that may attend (None: all),
    with the rows that may attend to no key opened up, and those rows ``[.., q, 1]`` (None
    when there are none by construction: without ``keep`` every causal row sees a key).

    ``keep`` is the validated ``attn_mask`` ``[b|1, h|1, q|1, k]`` or None.
    """
    allowed = keep
    if causal:
        i = torch.arange(q_len, device=device)[:, None]
        j = torch.arange(k_len, device=device)[None, :]
        tri = j <= i + (k_len - q_len)  # [q, k]: query i is key position k_len - q_len + i
        allowed = tri if allowed is None else allowed & tri
    if allowed is None or keep is None:
        return allowed, None
    empty = ~allowed.any(dim=-1, keepdim=True)  # rows with no key: output 0, not NaN
    return allowed | empty, empty


def eager(q, k, v, *, prep, keep, causal, scale, dropout_p):
    """softmax(q k^T * scale + bias + mask) v with plain tensor operations, float32 or wider."""
    compute = torch.promote_types(q.dtype, torch.float32)
    rep = q.shape[1] // k.shape[1]
    qf = q.to(compute)
    kf = k.to(compute).repeat_interleave(rep, dim=1)  # [b, h, k, d]
    vf = v.to(compute).repeat_interleave(rep, dim=1)  # [b, h, k, d_v]
    logits = (qf * scale) @ kf.transpose(-1, -2)  # [b, h, q, k]
    if prep is not None:
        logits = logits + prep.bias(qf, scale).to(compute)
    allowed, empty = allowed_pairs(keep, causal, q.shape[2], k.shape[2], q.device)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if dropout_p:
        probs = F.dropout(probs, p=dropout_p)
    out = probs @ vf  # [b, h, q, d_v]
    if prep is not None and prep.encoding.value_dependent:
        out = out + prep.value_bias(probs).to(compute)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return out.to(q.dtype)


def sdpa(q, k, v, *, prep, keep, causal, scale, dropout_p, attn_mask):
    """SDPA: is_causal / a bool mask without a bias, one merged float mask with one."""
    q_len, k_len = q.shape[2], k.shape[2]
    gqa = True if q.shape[1] != k.shape[1] else False  # a Python bool under torch.compile
    if prep is None and keep is None and (not causal or q_len == k_len):
        # No bias and at most plain causal self-attention: SDPA's fused kernels.
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale, enable_gqa=gqa
        )
    if prep is None:
        mask, empty = allowed_pairs(keep, causal, q_len, k_len, q.device)
    else:  # the merged float mask: once per forward pass when the bias depends on no q
        mask, empty = prep.sdpa_mask(q, scale, keep=keep, causal=causal, mask_id=attn_mask)
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
