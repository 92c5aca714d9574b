"""The float64 expected output of a RotaryEmbedding from ``posenc.reference`` alone, shared
by the rotary tests and the transformers-family tests."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from posenc import RotaryEmbedding, reference


def reference_rotation(
    q: torch.Tensor,
    k: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    inv_freq,
    **options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`posenc.reference.rotary_qk` of torch tensors (q and k read in float64), as
    float64 tensors; ``options`` are its keywords (``layout``, ``sections``, ...)."""
    qr, kr = reference.rotary_qk(
        q.double().numpy(),
        k.double().numpy(),
        q_positions.numpy(),
        k_positions.numpy(),
        np.asarray(inv_freq),
        **options,
    )
    return torch.from_numpy(qr), torch.from_numpy(kr)


def reference_qk(
    rope: RotaryEmbedding, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope(q, k, positions)`` in float64 from the reference: its frequencies at this call's
    length (over the whole head for ``proportional``, the first ``rotary_dim / 2`` kept), its
    pairing (``partial``) and its M-RoPE ``section_layout`` (``positions [s, n]`` then)."""
    spec = None if rope.scaling is None else dataclasses.asdict(rope.scaling)
    over_head = rope.scaling is not None and rope.scaling.frequency_span == "head_dim"
    inv_freq, scale = reference.rope_frequencies(
        rope.head_dim if over_head else rope.rotary_dim,
        base=rope.base,
        scaling=spec,
        seq_len=float(positions.max()) + 1,
    )
    return reference_rotation(
        q,
        k,
        positions,
        positions,
        inv_freq[: rope.rotary_dim // 2],
        layout=rope.layout,
        attention_scale=scale,
        sections=rope.sections,
        partial=rope.partial,
        section_layout=rope.section_layout,
    )
