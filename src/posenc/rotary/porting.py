"""Porting q/k projections between the two RoPE pairing layouts.

Meta's Llama checkpoints (and RoFormer, GPT-J) rotate channel pairs ``(2i, 2i + 1)`` of
each head ("interleaved"); transformers' Llama and GPT-NeoX rotate ``(i, i + r/2)``
("half"). A checkpoint moves from one to the other by reordering, inside every head, the
output rows of the query and key projections (weights and biases) -- transformers'
``convert_llama_weights_to_hf`` does ``(h, d/2, 2) -> (h, 2, d/2)``. With ``P`` that
reordering, ``R_half(theta) = P R_interleaved(theta) P^T``, so rotated queries and keys are
``P`` times the old ones and every attention score ``q . k`` is unchanged. Value and output
projections are not touched. Channels past ``rotary_dim`` (partial rotary) stay in place.

Shapes: a weight ``[num_heads * head_dim, in_features]`` (``nn.Linear`` layout; another
axis with ``dim=``) or a bias ``[num_heads * head_dim]``.
"""

from __future__ import annotations

import torch

from posenc._errors import PosEncError, check_alloc, check_choice, check_int, check_tensor
from posenc.rotary.layout import LAYOUTS, Layout, check_rotary_dims

__all__ = ["layout_permutation", "permute_qk_weight"]


def layout_permutation(
    head_dim: int, *, source: Layout, target: Layout, rotary_dim: int | None = None
) -> torch.Tensor:
    """Channel order of one head taking the ``source`` layout to the ``target`` layout.

    ``new[..., j] = old[..., perm[j]]``. From interleaved to half, the first halves of the
    pairs ``(0, 2, 4, ...)`` come first, then the second halves ``(1, 3, 5, ...)``; from half to
    interleaved the inverse. Channels ``>= rotary_dim`` keep their place.

    Args:
        head_dim: channels per head.
        source, target: ``"interleaved"`` or ``"half"``.
        rotary_dim: rotated channels (even, ``<= head_dim``; default all).

    Shape:
        ``[head_dim]`` int64.

    Examples:
        >>> from posenc.rotary.porting import layout_permutation
        >>> layout_permutation(6, source="interleaved", target="half")
        tensor([0, 2, 4, 1, 3, 5])
        >>> layout_permutation(6, source="half", target="interleaved", rotary_dim=4)
        tensor([0, 2, 1, 3, 4, 5])
    """
    check_choice("source", source, LAYOUTS)
    check_choice("target", target, LAYOUTS)
    head_dim, rotary_dim = check_rotary_dims(head_dim, rotary_dim)
    check_alloc("head_dim", head_dim, (3, head_dim), torch.long)
    perm = torch.arange(head_dim)
    if source == target:
        return perm
    half = rotary_dim // 2
    # interleaved -> half: position i of the first half takes channel 2i, of the second 2i + 1
    to_half = torch.arange(rotary_dim).view(half, 2).t().reshape(rotary_dim)  # [r]
    perm[:rotary_dim] = to_half if target == "half" else torch.argsort(to_half)
    return perm


def permute_qk_weight(
    weight: torch.Tensor,
    num_heads: int,
    *,
    source: Layout,
    target: Layout,
    rotary_dim: int | None = None,
    dim: int = 0,
) -> torch.Tensor:
    """Reorder a query or key projection (weight or bias) from one RoPE layout to the other.

    Apply it to the query and the key projection (each with its own head count: grouped
    query attention has fewer key heads) and attention scores are unchanged once the model
    rotates with ``layout=target``.

    Args:
        weight: the projection's weight ``[num_heads * head_dim, in]`` or bias
            ``[num_heads * head_dim]``.
        num_heads: heads in this projection (``num_key_value_heads`` for the key).
        source, target: ``"interleaved"`` (Meta, RoFormer, GPT-J) or ``"half"``
            (transformers' Llama, GPT-NeoX).
        rotary_dim: rotated channels per head (partial rotary); default the whole head.
        dim: the axis holding the heads' output channels (0 for ``nn.Linear`` weights).

    Shape:
        same as ``weight``; a new tensor (``weight`` is not modified).

    Examples:
        >>> import torch
        >>> from posenc.rotary.porting import permute_qk_weight
        >>> w = torch.arange(8.0)[:, None]  # 2 heads of 4 channels, one input feature
        >>> permute_qk_weight(w, 2, source="interleaved", target="half").flatten()
        tensor([0., 2., 1., 3., 4., 6., 5., 7.])
    """
    check_tensor("weight", weight)
    if weight.dtype == torch.bool or weight.is_complex():
        raise PosEncError(f"weight must be a real (floating or integer) tensor, got {weight.dtype}")
    num_heads = check_int("num_heads", num_heads, min=1)
    if weight.ndim not in (1, 2):
        raise PosEncError(
            f"weight must be a weight [out, in] or a bias [out], got shape {tuple(weight.shape)}"
        )
    dim = check_int("dim", dim, min=-weight.ndim, max=weight.ndim - 1) % weight.ndim
    out = weight.shape[dim]
    if out % num_heads:
        raise PosEncError(
            f"weight dimension {dim} ({out}) must be num_heads * head_dim, and is not "
            f"divisible by num_heads={num_heads}"
        )
    head_dim = out // num_heads
    if head_dim < 2:
        raise PosEncError(
            f"weight dimension {dim} ({out}) must hold num_heads={num_heads} heads of >= 2 "
            f"channels, got shape {tuple(weight.shape)}"
        )
    if head_dim % 2:
        raise PosEncError(f"head_dim = {out} // num_heads={num_heads} must be even, got {head_dim}")
    perm = layout_permutation(head_dim, source=source, target=target, rotary_dim=rotary_dim)
    offsets = torch.arange(num_heads)[:, None] * head_dim  # [h, 1]
    index = (offsets + perm).reshape(out).to(weight.device)  # [h * head_dim]
    return weight.index_select(dim, index)
