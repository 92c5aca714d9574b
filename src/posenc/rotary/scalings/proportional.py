"""Proportional RoPE (p-RoPE; Barbero et al., 2024, "Round and Round We Go! What makes
Rotary Positional Encodings useful?"): the rotated pairs keep the frequencies of a RoPE over
the whole head, the lowest ones are dropped (Gemma 4's full attention, LFM3)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from posenc.rotary.scalings._registry import (
    ScalingParams,
    check_factor,
    divided_frequencies,
    frozen,
    register,
    set_field,
)

__all__ = ["ProportionalScaling"]


@frozen
class ProportionalScaling(ScalingParams):
    """p-RoPE: the ``rotary_dim / 2`` rotated pairs take the *highest* frequencies of a RoPE
    over the whole head, ``1 / base^(2i / head_dim)`` for ``i < rotary_dim / 2``, divided by
    ``factor``; the lowest ``(head_dim - rotary_dim) / 2`` frequencies are dropped (their
    pairs do not rotate). Plain partial RoPE (GPT-NeoX) instead spreads the exponents over
    the rotated channels, ``2i / rotary_dim``.

    transformers' ``rope_type="proportional"`` computes ``rotary_dim = 2 * int(
    partial_rotary_factor * head_dim // 2)`` and pairs channel ``i`` with ``i + head_dim / 2``
    across the whole head (:class:`posenc.RotaryEmbedding`'s ``partial="whole_head"``);
    peers that rotate the first ``rotary_dim`` channels use ``partial="leading"``.

    :func:`posenc.rope_frequencies` given this scaling takes ``dim`` as the head dim (the
    span of the exponents) and returns all ``dim / 2`` frequencies; a rotary module keeps the
    first ``rotary_dim / 2``.

    Args:
        factor: every frequency is divided by it (transformers' ``factor``), ``>= 1``.

    Examples:
        >>> import posenc
        >>> rope = posenc.RotaryEmbedding(8, rotary_dim=4, base=10000.0, partial="whole_head",
        ...                               scaling={"type": "proportional"})
        >>> rope.inv_freq  # transformers' proportional inv_freq: pairs (2, 6), (3, 7) stay
        tensor([1.0000, 0.1000, 0.0000, 0.0000], dtype=torch.float64)
        >>> posenc.RotaryEmbedding(8, rotary_dim=4, base=10000.0,
        ...                        scaling={"type": "proportional"}).inv_freq  # "leading"
        tensor([1.0000, 0.1000], dtype=torch.float64)
    """

    factor: float = 1.0
    type: str = dataclasses.field(default="proportional", init=False)
    frequency_span: ClassVar[str] = "head_dim"

    def __post_init__(self) -> None:
        set_field(self, "factor", check_factor(self.type, self.factor))


register(ProportionalScaling)(divided_frequencies)
