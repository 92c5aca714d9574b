"""The FlexAttention path of :func:`posenc.attention`: compiled kernels, block masks, mods.

FlexAttention takes a ``score_mod(score, b, h, q_idx, kv_idx)`` (the encoding's bias from
indices, no ``[h, q, k]`` tensor) and a block mask (the causal and padding masks, which
also let it skip whole blocks). Compiled functions are cached per device type for the
process; mask_mods and score_mods capture tensors (positions, padding), which dynamo
treats as inputs, so new values reuse the compiled kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["bias_score_mod", "refusal", "run"]

_FLEX_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _flex_module() -> Any:
    """``torch.nn.attention.flex_attention``, or None where this torch lacks it."""
    try:
        from torch.nn.attention import flex_attention
    except ImportError:
        return None
    return flex_attention


#: Tests set this to False to run the uncompiled FlexAttention (the same score_mods and
#: block masks, no C++ compile) for most cases, and keep a few compiled ones.
_FLEX_COMPILED = True


def _flex_fn(flex_attention: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The one function the Flex path runs: compiled per device type, or called as it is."""

    def flex(q, k, v, score_mod, block_mask, scale, enable_gqa):
        return flex_attention(
            q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa
        )

    return flex


@functools.cache
def _compiled_flex(device_type: str) -> Callable[..., torch.Tensor]:
    """flex_attention compiled once per device type, cached for the process.

    Dynamo keeps one graph per score_mod / mask_mod code and shape; captured tensors
    (positions, slopes, masks) are graph inputs, so new values do not recompile. On CPU
    shapes are static: torch 2.13's CPU Flex template fails to build (C++ error) once
    dynamo turns to dynamic shapes after a shape change.
    """
    flex = _flex_fn(_flex_module().flex_attention)
    return torch.compile(flex, dynamic=False if device_type == "cpu" else None)


def _create_block_mask(mask_mod, b, h, q_len: int, k_len: int, device) -> Any:
    return _flex_module().create_block_mask(mask_mod, b, h, q_len, k_len, device=device)


# mask_mods and score_mods index only real (non-expanded) tensors: compiled Flex
# bounds-checks captured tensors against their storage. Each distinct function
# below is one compiled graph; their captured tensors are inputs, not constants.


def _causal_mod(shift: torch.Tensor) -> Callable[..., torch.Tensor]:
    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + shift

    return mask_mod


def _padding_mod(keep: torch.Tensor, shift: torch.Tensor) -> Callable[..., torch.Tensor]:
    """``keep [b|1, k]`` key padding, and causal when ``shift < k``."""
    per_b = keep.shape[0] > 1  # a broadcast block mask still calls mask_mod with every b

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx + shift) & keep[b if per_b else 0, kv_idx]

    return mask_mod


def _full_mod(keep: torch.Tensor, shift: torch.Tensor) -> Callable[..., torch.Tensor]:
    """``keep [b|1, h|1, q, k]``, and causal when ``shift < k``."""
    per_b, per_h = keep.shape[0] > 1, keep.shape[1] > 1

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx + shift) & keep[b if per_b else 0, h if per_h else 0, q_idx, kv_idx]

    return mask_mod


@functools.lru_cache(maxsize=16)
def _causal_block_mask(q_len: int, k_len: int, device: torch.device):
    """Causal (aligned to the end) block mask, cached by lengths and device."""
    shift = torch.tensor(k_len - q_len, device=device)
    return _create_block_mask(_causal_mod(shift), None, None, q_len, k_len, device=device)


def _block_mask(
    keep: torch.Tensor | None, causal: bool, b: int, h: int, q_len: int, k_len: int, device
):
    """The block mask of ``causal`` and ``keep [b|1, h|1, q|1, k]``, or None for neither."""
    if keep is None:
        return _causal_block_mask(q_len, k_len, device) if causal else None
    shift = torch.tensor(k_len - q_len if causal else k_len, device=device)
    if keep.shape[1] == 1 and keep.shape[2] == 1:  # key padding [b, 1, 1, k]
        mb = keep.shape[0]
        mod = _padding_mod(keep.reshape(mb, k_len).contiguous(), shift)
        return _create_block_mask(mod, None if mb == 1 else mb, None, q_len, k_len, device=device)
    mb, mh = keep.shape[0], keep.shape[1]
    full = keep.expand(mb, mh, q_len, k_len).contiguous()  # [b|1, h|1, q, k]
    return _create_block_mask(
        _full_mod(full, shift),
        None if mb == 1 else mb,
        None if mh == 1 else mh,
        q_len,
        k_len,
        device=device,
    )


def bias_score_mod(bias: torch.Tensor) -> Callable[..., torch.Tensor]:
    """score_mod adding a materialised bias ``[h, q, k]`` or ``[b, h, q, k]``."""
    bias = bias.contiguous()
    if bias.ndim == 3:

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias[h, q_idx, kv_idx]

    else:

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias[b, h, q_idx, kv_idx]

    return score_mod


def run(q, k, v, *, score_mod, keep, causal: bool, scale: float) -> torch.Tensor:
    """flex_attention of ``q [b, h, q, d]``, ``k``/``v [b, h_kv, k, d]`` with ``score_mod``
    and the block mask of ``causal`` and ``keep [b|1, h|1, q|1, k]`` (or None)."""
    b, h, q_len, _ = q.shape
    k_len = k.shape[2]
    block_mask = _block_mask(keep, causal, b, h, q_len, k_len, q.device)
    gqa = q.shape[1] != k.shape[1]
    if _FLEX_COMPILED:
        fn = _compiled_flex(q.device.type)
    else:
        fn = _flex_fn(_flex_module().flex_attention)
    return fn(q, k, v, score_mod, block_mask, scale, gqa)


def refusal(q, needs_grad: bool, dropout_p: float) -> str | None:
    """Why the Flex path cannot run this call (whatever its encoding), or None when it can."""
    if _flex_module() is None:
        return "this torch has no torch.nn.attention.flex_attention"
    if q.device.type not in ("cuda", "cpu"):
        return f"FlexAttention runs on CUDA and CPU, got device {q.device}"
    if q.device.type == "cpu" and needs_grad:
        return (
            "FlexAttention has no backward on CPU; use backend='sdpa' or 'eager', "
            "or call under torch.no_grad()"
        )
    if q.dtype not in _FLEX_DTYPES:
        return f"FlexAttention takes float32, bfloat16 or float16, got {q.dtype}"
    if dropout_p:
        return f"FlexAttention has no dropout, got dropout_p={dropout_p}"
    return None
