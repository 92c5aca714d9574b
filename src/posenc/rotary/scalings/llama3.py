"""Llama 3.1's frequency-dependent interpolation (Meta, 2024)."""

from __future__ import annotations

import dataclasses
import math

import torch

from posenc._errors import PosEncError
from posenc.rotary.scalings._registry import (
    ScalingParams,
    check_factor,
    check_length,
    check_positive,
    default_frequencies,
    frozen,
    register,
    set_field,
)

__all__ = ["Llama3Scaling"]


@frozen
class Llama3Scaling(ScalingParams):
    """Llama 3.1's scaling: wavelengths longer than ``original_max_position / low_freq_factor``
    are interpolated by ``factor``, shorter than ``original_max_position / high_freq_factor``
    kept, and those between blended smoothly.

    Args:
        factor: ``>= 1`` (8 for Llama 3.1).
        low_freq_factor: ``> 0`` (1 for Llama 3.1).
        high_freq_factor: ``>= low_freq_factor`` (4 for Llama 3.1; equal, no blend: Llama 4).
        original_max_position: the context length trained on (8192 for Llama 3.1).
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int
    type: str = dataclasses.field(default="llama3", init=False)

    def __post_init__(self) -> None:
        kind = self.type
        set_field(self, "factor", check_factor(kind, self.factor))
        low = check_positive(kind, "low_freq_factor", self.low_freq_factor)
        set_field(self, "low_freq_factor", low)
        high = check_positive(kind, "high_freq_factor", self.high_freq_factor)
        if high < self.low_freq_factor:  # equal: no blend (Llama 4's published config)
            raise PosEncError(
                f"llama3 scaling high_freq_factor must be >= low_freq_factor "
                f"({self.low_freq_factor}), got {high}"
            )
        set_field(self, "high_freq_factor", high)
        original = check_length(kind, "original_max_position", self.original_max_position)
        set_field(self, "original_max_position", original)


@register(Llama3Scaling)
def _llama3(
    p: Llama3Scaling, dim: int, base: float, seq_len: float | None
) -> tuple[torch.Tensor, float]:
    inv_freq = default_frequencies(dim, base)
    low_freq_wavelen = p.original_max_position / p.low_freq_factor
    high_freq_wavelen = p.original_max_position / p.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / p.factor, inv_freq)
    smooth = (p.original_max_position / wavelen - p.low_freq_factor) / (
        p.high_freq_factor - p.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / p.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    if p.high_freq_factor == p.low_freq_factor:  # no band to blend over (0 / 0 there)
        medium = torch.zeros_like(medium)
    return torch.where(medium, smoothed, scaled), 1.0
