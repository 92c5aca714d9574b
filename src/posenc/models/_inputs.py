"""The inputs of :class:`~posenc.models.TinyTransformer`, checked once per call: token ids
and the key padding mask (bool or 0/1 integers), also under ``torch.compile`` / export,
where what needs the data becomes a graph assertion."""

from __future__ import annotations

from typing import Any

import torch

from posenc._errors import PosEncError, check_same_device, check_tensor, check_traced, tracing

__all__ = ["check_tokens", "padding_mask"]


def check_tokens(tokens: Any, vocab_size: int, weight: torch.Tensor) -> torch.Tensor:
    """Token ids ``[b, s]`` (int64 or int32) in ``[0, vocab_size)`` on ``weight``'s device."""
    check_tensor("tokens", tokens)
    check_same_device(("tokens", "the model's weights (embed)"), tokens, weight)
    if tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise PosEncError(
            f"tokens must be an int64 tensor [b, s], got shape {tuple(tokens.shape)} "
            f"and dtype {tokens.dtype}"
        )
    if tokens.shape[0] < 1 or tokens.shape[1] < 1:
        raise PosEncError(f"tokens must hold at least one row and token, got {tuple(tokens.shape)}")
    if tracing():  # torch.compile / export: the vocabulary range as a graph assertion
        in_range = (tokens >= 0) & (tokens < vocab_size)
        check_traced(in_range, f"tokens must lie in [0, vocab_size={vocab_size})")
        return tokens
    lo, hi = (int(t) for t in torch.aminmax(tokens))  # one reduction
    if lo < 0 or hi >= vocab_size:
        raise PosEncError(
            f"tokens must lie in [0, vocab_size={vocab_size}), got values in [{lo}, {hi}]"
        )
    return tokens


def padding_mask(attn_mask: Any, b: int, s: int, device: Any) -> torch.Tensor | None:
    """``attn_mask [b, s]`` (bool or 0/1 integers, True/1 = real token) as bool."""
    if attn_mask is None:
        return None
    check_tensor("attn_mask", attn_mask)
    if attn_mask.device.type == "meta":
        raise PosEncError("attn_mask must hold values, got a tensor on the meta device")
    if attn_mask.is_complex():
        raise PosEncError(f"attn_mask must be bool or integer 0 / 1, got {attn_mask.dtype}")
    if tuple(attn_mask.shape) != (b, s):
        raise PosEncError(
            f"attn_mask must be [b, s] = [{b}, {s}] (True or 1 = real token), got shape "
            f"{tuple(attn_mask.shape)}"
        )
    if attn_mask.dtype != torch.bool and tracing():
        if attn_mask.is_floating_point():
            raise PosEncError("attn_mask must be bool or hold only integers 0 and 1")
        binary = (attn_mask == 0) | (attn_mask == 1)
        check_traced(binary, "attn_mask must be bool or hold only integers 0 and 1")
        attn_mask = attn_mask == 1
    elif attn_mask.dtype != torch.bool:
        if attn_mask.is_floating_point() or not bool(((attn_mask == 0) | (attn_mask == 1)).all()):
            raise PosEncError("attn_mask must be bool or hold only integers 0 and 1")
        attn_mask = attn_mask == 1
    return attn_mask.to(device)
