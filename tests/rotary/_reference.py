"""The float64 expected output of a RotaryEmbedding from ``posenc.reference`` alone, shared
by the rotary tests and the transformers-family tests."""

from __future__ import annotations

import dataclasses

import torch

from posenc import RotaryEmbedding, reference


def reference_qk(
    rope: RotaryEmbedding, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope(q, k, positions)`` in float64 from the reference: its frequencies at this call's
    length (over the whole head for ``proportional``, the first ``rotary_dim / 2`` kept), its
    pairing (``partial``) and its M-RoPE ``section_layout`` (``positions [s, n]`` then)."""
    pos = positions.numpy()
    spec = None if rope.scaling is None else dataclasses.asdict(rope.scaling)
    over_head = rope.scaling is not None and rope.scaling.frequency_span == "head_dim"
    inv_freq, scale = reference.rope_frequencies(
        rope.head_dim if over_head else rope.rotary_dim,
        base=rope.base,
        scaling=spec,
        seq_len=float(pos.max()) + 1,
    )
    qr, kr = reference.rotary_qk(
        q.double().numpy(),
        k.double().numpy(),
        pos,
        pos,
        inv_freq[: rope.rotary_dim // 2],
        layout=rope.layout,
        attention_scale=scale,
        sections=rope.sections,
        partial=rope.partial,
        section_layout=rope.section_layout,
    )
    return torch.from_numpy(qr), torch.from_numpy(kr)
