"""Linear scaling: position interpolation (kaiokendev; Chen et al., 2023)."""

from __future__ import annotations

import dataclasses

from posenc.rotary.scalings._registry import (
    ScalingParams,
    check_factor,
    divided_frequencies,
    frozen,
    register,
    set_field,
)

__all__ = ["LinearScaling"]


@frozen
class LinearScaling(ScalingParams):
    """Position interpolation (kaiokendev; Chen et al., 2023): every frequency divided by ``factor``.

    Args:
        factor: how many times longer the context becomes, ``>= 1``.
    """

    factor: float
    type: str = dataclasses.field(default="linear", init=False)

    def __post_init__(self) -> None:
        set_field(self, "factor", check_factor(self.type, self.factor))


register(LinearScaling)(divided_frequencies)
