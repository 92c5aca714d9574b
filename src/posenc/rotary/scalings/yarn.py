"""YaRN (Peng et al., 2023, arXiv:2309.00071)."""

from __future__ import annotations

import dataclasses
import math

import torch

from posenc._errors import PosEncError, check_float
from posenc.rotary.scalings._registry import (
    ScalingParams,
    check_factor,
    check_length,
    check_positive,
    default_frequencies,
    frozen,
    ratio_factor,
    register,
    set_field,
)

__all__ = ["YarnScaling"]


@frozen
class YarnScaling(ScalingParams):
    """YaRN (Peng et al., 2023, arXiv:2309.00071): interpolate the low frequencies only,
    with a linear ramp between, and scale cos/sin by an attention factor.

    Args:
        factor: ``>= 1``; ``None`` takes ``max_position / original_max_position`` (as
            transformers does for DeepSeek-style configs).
        original_max_position: the context length trained on.
        beta_fast, beta_slow: rotation counts bounding the ramp (32 and 1 in the paper),
            ``0 < beta_slow <= beta_fast``.
        mscale, mscale_all_dim: DeepSeek's attention-factor terms. As in transformers the
            ratio ``get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)`` is used
            only when both are non-zero; otherwise ``0.1 * ln(factor) + 1``.
        attention_factor: set the cos/sin scale directly (``> 0``).
        truncate: round the ramp bounds outwards to whole channels (floor / ceil).
        max_position: only used when ``factor`` is ``None``.
    """

    factor: float | None = None
    # required: the None default only makes leaving it out a PosEncError, not a TypeError
    original_max_position: int = dataclasses.field(
        default=None,  # type: ignore[assignment]
        metadata={"required": True},
    )
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    max_position: int | None = None
    type: str = dataclasses.field(default="yarn", init=False)

    def __post_init__(self) -> None:
        kind = self.type
        original = check_length(kind, "original_max_position", self.original_max_position)
        set_field(self, "original_max_position", original)
        if self.max_position is not None:
            set_field(self, "max_position", check_length(kind, "max_position", self.max_position))
        if self.factor is None:
            set_field(self, "factor", ratio_factor(kind, self.max_position, original))
        set_field(self, "factor", check_factor(kind, self.factor))
        set_field(self, "beta_fast", check_positive(kind, "beta_fast", self.beta_fast))
        set_field(self, "beta_slow", check_positive(kind, "beta_slow", self.beta_slow))
        if self.beta_fast < self.beta_slow:
            raise PosEncError(
                f"yarn scaling beta_fast must be >= beta_slow ({self.beta_slow}), "
                f"got {self.beta_fast}"
            )
        for name in ("mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                value = check_float(f"yarn scaling {name}", getattr(self, name), min=0.0)
                set_field(self, name, value)
        if self.attention_factor is not None:
            value = check_positive(kind, "attention_factor", self.attention_factor)
            set_field(self, "attention_factor", value)
        if not isinstance(self.truncate, bool):
            raise PosEncError(f"yarn scaling truncate must be True or False, got {self.truncate!r}")


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@register(YarnScaling)
def _yarn(
    p: YarnScaling, dim: int, base: float, seq_len: float | None
) -> tuple[torch.Tensor, float]:
    factor = p.factor  # set in __post_init__, from max_position if not given
    if factor is None:
        factor = ratio_factor(p.type, p.max_position, p.original_max_position)
    if p.attention_factor is not None:
        scale = p.attention_factor
    elif p.mscale and p.mscale_all_dim:  # transformers: both set and non-zero
        scale = _mscale(factor, p.mscale) / _mscale(factor, p.mscale_all_dim)
    else:
        scale = _mscale(factor)

    def correction_dim(rotations: float) -> float:
        # the channel index whose wavelength fits `rotations` times in the original context
        return (
            dim
            * math.log(p.original_max_position / (rotations * 2 * math.pi))
            / (2 * math.log(base))
        )

    low, high = correction_dim(p.beta_fast), correction_dim(p.beta_slow)
    if p.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)  # transformers clamps at dim - 1, not dim/2 - 1
    if low == high:
        high += 0.001  # avoid dividing by zero, as transformers does
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = default_frequencies(dim, base)  # high frequencies (ramp 0): unchanged
    interpolation = extrapolation / factor  # low frequencies (ramp 1): position interpolation
    return interpolation * ramp + extrapolation * (1 - ramp), float(scale)
