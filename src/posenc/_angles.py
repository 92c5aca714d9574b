"""Angles ``position * frequency``, computed so they survive long positions.

Both sinusoidal tables and RoPE need ``sin``/``cos`` of ``p * w``. In float32 the
product of a position near 2^24 and a frequency already loses the whole fractional
part of the angle, so peers return garbage at long contexts. We form the product in
float64 from exact positions, reduce it to ``[-pi, pi)`` while still in float64, and
only then round: the rounding error is then at most ~2e-7 whatever the position.
"""

from __future__ import annotations

import math

import torch

__all__ = ["reduced_angles"]

_TWO_PI = 2.0 * math.pi


def reduced_angles(positions: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
    """Return ``positions[..., None] * frequencies`` reduced to ``[-pi, pi)``, in float64.

    Shape: positions ``[*P]`` (int or float), frequencies ``[F]`` -> ``[*P, F]``.
    """
    p = positions.to(torch.float64)
    w = frequencies.to(device=p.device, dtype=torch.float64)
    theta = p.unsqueeze(-1) * w
    return torch.remainder(theta + math.pi, _TWO_PI) - math.pi
