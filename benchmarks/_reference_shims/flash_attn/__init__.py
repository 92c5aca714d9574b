"""A CPU stand-in for ``flash_attn`` (import shim for the reference implementations).

Written from flash-attn 2's documented semantics, not its code: q ``[b, sq, hq, d]``, k and v
``[b, sk, hk, d]`` with ``hk`` dividing ``hq`` (query head ``h`` reads key head
``h // (hq // hk)``); with ``causal`` the mask is aligned to the bottom-right corner; with
``window_size=(left, right)`` query ``i`` sees keys ``[i + sk - sq - left, i + sk - sq + right]``
inclusive (``-1`` is unbounded; ``causal`` sets ``right`` to 0). Scores and the softmax are in
float32 (float64 for float64 inputs); ``out`` is in q's dtype, ``lse`` ``[b, hq, sq]`` in
float32 (float64 for float64 inputs). A row that sees no key gives 0 and ``lse = +inf``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__version__ = "2.5.6+posenc.shim"


def visible(sq: int, sk: int, causal: bool, window: tuple[int, int]) -> torch.Tensor:
    """``[sq, sk]`` bool: True where query ``i`` sees key ``j`` (flash-attn's mask rule)."""
    left, right = int(window[0]), int(window[1])
    if causal:
        right = 0
    i = torch.arange(sq).unsqueeze(1) + (sk - sq)  # the query's diagonal in key coordinates
    j = torch.arange(sk).unsqueeze(0)
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    softmax_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [b, sq, hq, dv], lse [b, hq, sq])`` for ``keep`` ``[sq, sk]`` or ``[b, sq, sk]``."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("flash_attn shim: q, k, v must be [batch, seq, heads, dim]")
    hq, hk = q.shape[2], k.shape[2]
    if hq % hk:
        raise ValueError(f"flash_attn shim: {hk} key heads do not divide {hq} query heads")
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    qh = q.to(work).transpose(1, 2)
    kh = k.to(work).transpose(1, 2).repeat_interleave(hq // hk, dim=1)
    vh = v.to(work).transpose(1, 2).repeat_interleave(hq // hk, dim=1)
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    mask = keep if keep.dim() == 2 else keep.unsqueeze(1)
    scores = scores.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)  # -inf on an empty row
    empty = torch.isneginf(lse)
    probs = torch.exp(scores - lse.masked_fill(empty, 0.0).unsqueeze(-1))
    out = torch.matmul(probs, vh).masked_fill(empty.unsqueeze(-1), 0.0)
    lse = lse.masked_fill(empty, math.inf)
    return out.transpose(1, 2).to(q.dtype), lse


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] | list[int] = (-1, -1),
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> Any:
    """flash-attn's ``flash_attn_func``: ``out``, or ``(out, lse, None)`` with
    ``return_attn_probs`` (the probabilities themselves are not returned)."""
    if dropout_p:
        raise NotImplementedError("flash_attn shim: dropout_p must be 0")
    if alibi_slopes is not None:
        raise NotImplementedError("flash_attn shim: alibi_slopes is not supported")
    window = (int(window_size[0]), int(window_size[1]))
    keep = visible(q.shape[1], k.shape[1], causal, window)
    out, lse = attend(q, k, v, keep, softmax_scale)
    return (out, lse, None) if return_attn_probs else out


def kvcache_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: int | torch.Tensor | None,
    softmax_scale: float | None,
    causal: bool,
    window: tuple[int, int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)``: batch row ``b`` attends to keys ``[0, cache_seqlens[b])`` of
    ``k_cache[b]`` (all of them when ``cache_seqlens`` is None), with the mask rule of
    :func:`flash_attn_func` over those keys. A length past the cache is refused (the CUDA
    kernel would read past it)."""
    batch, capacity = k_cache.shape[0], k_cache.shape[1]
    if cache_seqlens is None:
        lengths = [capacity] * batch
    elif isinstance(cache_seqlens, int):
        lengths = [cache_seqlens] * batch
    else:
        lengths = [int(n) for n in torch.as_tensor(cache_seqlens).reshape(-1).tolist()]
    outs, lses = [], []
    for row, length in enumerate(lengths):
        if not 0 <= length <= capacity:
            raise ValueError(
                f"flash_attn shim: cache_seqlens {length} is outside the cache's {capacity} "
                f"slots (the CUDA kernel would read past them)"
            )
        keep = visible(q.shape[1], length, causal, (int(window[0]), int(window[1])))
        o, lse = attend(
            q[row : row + 1],
            k_cache[row : row + 1, :length],
            v_cache[row : row + 1, :length],
            keep,
            softmax_scale,
        )
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    *,
    cache_seqlens: int | torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    return_softmax_lse: bool = False,
    **unsupported: Any,
) -> Any:
    """flash-attn's ``flash_attn_with_kvcache``, reading the cache only (no append)."""
    extras = {"k": k, "v": v, **unsupported}
    given = sorted(name for name, value in extras.items() if value is not None)
    if given:
        raise NotImplementedError(f"flash_attn shim: {given} are not supported")
    out, lse = kvcache_attention(
        q, k_cache, v_cache, cache_seqlens, softmax_scale, causal, window_size
    )
    return (out, lse) if return_softmax_lse else out


def flash_attn_varlen_func(*args: Any, **kwargs: Any) -> Any:
    """Importable only: the references' eager paths never call it."""
    raise NotImplementedError("flash_attn shim: flash_attn_varlen_func is not implemented")
