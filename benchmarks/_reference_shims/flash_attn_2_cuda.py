"""A CPU stand-in for flash-attn 2.5's compiled ``flash_attn_2_cuda`` (import shim): only
``fwd_kvcache``, reading the cache (STRING's decode path calls it directly)."""

from __future__ import annotations

from typing import Any

import torch
from flash_attn import kvcache_attention


def fwd_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Any,
    v: Any,
    cache_seqlens: Any,
    rotary_cos: Any,
    rotary_sin: Any,
    cache_batch_idx: Any,
    block_table: Any,
    alibi_slopes: Any,
    out: Any,
    softmax_scale: float | None,
    is_causal: bool,
    window_size_left: int,
    window_size_right: int,
    rotary_interleaved: bool,
    num_splits: int,
) -> list[torch.Tensor]:
    """``[out [b, sq, hq, d], lse [b, hq, sq]]``: batch row ``b`` attends to keys
    ``[0, cache_seqlens[b])`` of ``k_cache[b]`` (all of them when ``cache_seqlens`` is None),
    with the mask rule of ``flash_attn_func`` over those keys
    (``flash_attn.kvcache_attention``)."""
    extras = {
        "k": k,
        "v": v,
        "rotary_cos": rotary_cos,
        "rotary_sin": rotary_sin,
        "cache_batch_idx": cache_batch_idx,
        "block_table": block_table,
        "alibi_slopes": alibi_slopes,
        "out": out,
    }
    given = [name for name, value in extras.items() if value is not None]
    if given:
        raise NotImplementedError(f"flash_attn_2_cuda shim: {given} are not supported")
    out_, lse = kvcache_attention(
        q, k_cache, v_cache, cache_seqlens, softmax_scale, is_causal,
        (window_size_left, window_size_right),
    )  # fmt: skip
    return [out_, lse]
