"""NTK-aware scalings, which change the base: static (/u/bloc97) and dynamic (/u/emozilla)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from posenc._errors import PosEncError, tracing
from posenc.rotary.scalings._registry import (
    FrequenciesAt,
    ScalingParams,
    check_factor,
    check_length,
    default_frequencies,
    frozen,
    register,
    set_field,
)

__all__ = ["DynamicScaling", "NTKScaling"]

# The longest sequence a frequency computation takes (``rope_frequencies``' seq_len bound).
_MAX_SEQ_LEN = 2.0**63


def _ntk_exponent(kind: str, dim: int) -> float:
    if dim < 4:
        raise PosEncError(
            f"dim must be >= 4 for {kind} scaling (base exponent dim / (dim - 2)), got {dim}"
        )
    return dim / (dim - 2)


@frozen
class NTKScaling(ScalingParams):
    """Static NTK-aware scaling (/u/bloc97): ``base * factor^(dim / (dim - 2))``.

    Args:
        factor: ``>= 1``.
    """

    factor: float
    type: str = dataclasses.field(default="ntk", init=False)

    def __post_init__(self) -> None:
        set_field(self, "factor", check_factor(self.type, self.factor))


@register(NTKScaling)
def _ntk(p: NTKScaling, dim: int, base: float, seq_len: float | None) -> tuple[torch.Tensor, float]:
    return default_frequencies(dim, base * p.factor ** _ntk_exponent(p.type, dim)), 1.0


@frozen
class DynamicScaling(ScalingParams):
    """Dynamic NTK (/u/emozilla): the base grows with the longest position of each call.

    For ``seq_len <= max_position`` the frequencies are the unscaled ones; beyond it
    ``base * (factor * seq_len / max_position - (factor - 1))^(dim / (dim - 2))``.

    Args:
        factor: ``>= 1``.
        max_position: the context length trained on.
    """

    factor: float
    max_position: int
    type: str = dataclasses.field(default="dynamic", init=False)
    position_dependent: ClassVar[bool] = True

    def __post_init__(self) -> None:
        set_field(self, "factor", check_factor(self.type, self.factor))
        set_field(self, "max_position", check_length(self.type, "max_position", self.max_position))

    def call_frequencies(
        self, largest: torch.Tensor, frequencies: FrequenciesAt, scale: float
    ) -> tuple[torch.Tensor, float]:
        """Those of ``seq_len = max(largest + 1, max_position)`` (below ``max_position``:
        the unscaled ones). The value must come to the host: one synchronisation per call.

        Traced (``torch.compile``, ``torch.export``, ``torch.jit.trace``), where the value is
        not known, the same frequencies are computed on the device from ``largest``
        (:meth:`traced_frequencies`), so the graph holds at every length."""
        if tracing() or torch.jit.is_tracing():
            return self.traced_frequencies(largest, frequencies(None)), scale
        top = float(largest.item())
        if top + 1.0 > _MAX_SEQ_LEN:  # named here: the user passed positions, not a length
            raise PosEncError(
                f"positions (q_positions, k_positions) must be at most 2**63 - 1 for dynamic "
                f"scaling (its base grows with the largest position + 1), got {top:.6g}"
            )
        seq_len = max(top + 1.0, float(self.max_position))
        return frequencies(seq_len), scale

    def traced_frequencies(self, largest: torch.Tensor, unscaled: torch.Tensor) -> torch.Tensor:
        """The frequencies for the largest position ``largest`` (a float64 device scalar) as
        tensor operations, from the unscaled ones ``base^(-e)`` (``e = 2i / dim``):
        ``(base * r^x)^(-e) = base^(-e) * r^(-x e)`` with
        ``r = factor * seq_len / max_position - (factor - 1)`` and ``x = dim / (dim - 2)``;
        equal to the host formula up to float64 rounding. Shape: ``[dim / 2]``."""
        dim = 2 * unscaled.shape[-1]
        e = torch.arange(0, dim, 2, dtype=torch.float64, device=unscaled.device) / dim
        seq_len = torch.clamp(largest + 1.0, min=float(self.max_position))
        ratio = self.factor * seq_len / self.max_position - (self.factor - 1.0)
        scaled = unscaled * ratio ** (-e * _ntk_exponent(self.type, dim))
        return torch.where(seq_len > self.max_position, scaled, unscaled)


@register(DynamicScaling)
def _dynamic(
    p: DynamicScaling, dim: int, base: float, seq_len: float | None
) -> tuple[torch.Tensor, float]:
    exponent = _ntk_exponent(p.type, dim)
    if seq_len is None or seq_len <= p.max_position:
        # exactly the unscaled frequencies (the formula below gives 1 only up to rounding),
        # as transformers' module keeps its original inv_freq within max_position
        return default_frequencies(dim, base), 1.0
    base = base * (p.factor * seq_len / p.max_position - (p.factor - 1)) ** exponent
    return default_frequencies(dim, base), 1.0
