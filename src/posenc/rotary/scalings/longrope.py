"""LongRoPE (Ding et al., 2024; Phi-3): per-frequency rescale factors, short and long."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch

from posenc._errors import PosEncError
from posenc.rotary.scalings._registry import (
    FrequenciesAt,
    ScalingParams,
    check_factor,
    check_length,
    check_positive,
    exponents,
    frozen,
    ratio_factor,
    register,
    set_field,
)

__all__ = ["LongRopeScaling"]


@frozen
class LongRopeScaling(ScalingParams):
    """LongRoPE (Ding et al., 2024; Phi-3): one rescale factor per frequency, the short set
    within the original context and the long set once a call reaches past it.

    Args:
        short_factor, long_factor: ``dim / 2`` positive numbers each.
        original_max_position: the context length trained on; the long factors apply
            when ``seq_len > original_max_position`` (the largest position reaches it).
        factor: the context extension ratio (``>= 1``) for the attention scale
            ``sqrt(1 + ln(factor) / ln(original_max_position))`` (1 when ``factor == 1``);
            ``None`` takes ``max_position / original_max_position`` as transformers does.
        attention_factor: set the cos/sin scale directly (``> 0``).
        max_position: only used when ``factor`` is ``None``.
    """

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position: int
    factor: float | None = None
    attention_factor: float | None = None
    max_position: int | None = None
    type: str = dataclasses.field(default="longrope", init=False)
    position_dependent: ClassVar[bool] = True

    def __post_init__(self) -> None:
        kind = self.type
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                value = value.tolist()
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or not len(value):
                raise PosEncError(
                    f"{kind} scaling {name} must be a non-empty list of numbers, got {value!r}"
                )
            checked = tuple(check_positive(kind, f"{name}[{i}]", v) for i, v in enumerate(value))
            set_field(self, name, checked)
        if len(self.short_factor) != len(self.long_factor):
            raise PosEncError(
                f"{kind} scaling short_factor and long_factor must have the same length, "
                f"got {len(self.short_factor)} and {len(self.long_factor)}"
            )
        original = check_length(kind, "original_max_position", self.original_max_position)
        set_field(self, "original_max_position", original)
        if self.max_position is not None:
            set_field(self, "max_position", check_length(kind, "max_position", self.max_position))
        if self.factor is not None:
            set_field(self, "factor", check_factor(kind, self.factor))
        elif ratio_factor(kind, self.max_position, original) < 1.0:
            raise PosEncError(
                f"longrope scaling max_position must be >= original_max_position "
                f"({self.original_max_position}) when factor is not given, got {self.max_position}"
            )
        if self.attention_factor is not None:
            value = check_positive(kind, "attention_factor", self.attention_factor)
            set_field(self, "attention_factor", value)

    def call_frequencies(
        self, largest: torch.Tensor, frequencies: FrequenciesAt, scale: float
    ) -> tuple[torch.Tensor, float]:
        """The long set once ``largest + 1 > original_max_position``, else the short set
        (those of construction), chosen on the device: no synchronisation. The attention
        scale does not change."""
        short = frequencies(None)
        long = frequencies(self.original_max_position + 1)
        return torch.where(largest + 1 > self.original_max_position, long, short), scale

    def precomputed_lengths(self) -> tuple[int, ...]:
        """The long set's ``seq_len``, computed when a module is built."""
        return (self.original_max_position + 1,)


@register(LongRopeScaling)
def _longrope(
    p: LongRopeScaling, dim: int, base: float, seq_len: float | None
) -> tuple[torch.Tensor, float]:
    if len(p.short_factor) != dim // 2:
        raise PosEncError(
            f"longrope scaling short_factor and long_factor must have length dim // 2 = "
            f"{dim // 2}, got {len(p.short_factor)}"
        )
    factor = p.factor
    if factor is None:
        factor = ratio_factor(p.type, p.max_position, p.original_max_position)
    if p.attention_factor is not None:
        scale = p.attention_factor
    elif factor <= 1.0:
        scale = 1.0
    else:
        scale = math.sqrt(1 + math.log(factor) / math.log(p.original_max_position))
    long = seq_len is not None and seq_len > p.original_max_position
    ext = torch.tensor(p.long_factor if long else p.short_factor, dtype=torch.float64)
    return 1.0 / (ext * base ** exponents(dim)), float(scale)
