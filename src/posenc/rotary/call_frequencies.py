"""The frequencies one call of a rotary module rotates by, on the call's device.

A module's float64 frequencies are computed on the CPU at construction and copied to each
device once. A scaling whose frequencies depend on the call's positions (``dynamic``,
``longrope``: ``position_dependent``) picks them per call from the largest position, through
:meth:`~posenc.rotary.scalings._registry.ScalingParams.call_frequencies`; the lengths it
chooses among (``precomputed_lengths``) are computed at construction too, others when a
call first needs them. :class:`CallFrequencies` holds all of this for
:class:`posenc.RotaryEmbedding`, which gives it the function that computes the frequencies
for a length (its ``_frequencies``, which axial RoPE overrides).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from posenc._errors import tracing
from posenc.rotary.frequencies import Scaling

__all__ = ["CallFrequencies"]

_CACHE_SIZE = 16  # (device, seq_len) frequency copies kept for dynamic scaling

# seq_len (None: the state at construction) -> (inv_freq float64 on the CPU, attention_scale)
Compute = Callable[[float | None], tuple[torch.Tensor, float]]


class CallFrequencies:
    """A rotary module's frequencies: those of construction, and those of each call.

    Args:
        compute: ``seq_len -> (inv_freq, attention_scale)``, float64 frequencies on the CPU
            for a call whose largest position is ``seq_len - 1`` (``None``: construction).
        scaling: the module's scaling (``None``: none).

    Attributes:
        inv_freq: the float64 CPU frequencies at construction (read-only: never cast).
        attention_scale: the cos/sin factor at construction.
    """

    def __init__(self, compute: Compute, scaling: Scaling | None) -> None:
        self._compute = compute
        self._scaling = scaling
        # Computed on the CPU in float64 even under `with torch.device("meta")`.
        with torch.device("cpu"):
            self.inv_freq, self.attention_scale = compute(None)
            # those a position-dependent scaling chooses among per call (longrope's long set)
            lengths = () if scaling is None else scaling.precomputed_lengths()
            self._precomputed: dict[float, torch.Tensor] = {n: compute(n)[0] for n in lengths}
        self._device_cache: dict[Any, torch.Tensor] = {}

    @property
    def fixed(self) -> bool:
        """Whether every call rotates by the frequencies of construction."""
        return self._scaling is None or not self._scaling.position_dependent

    def of_call(
        self, positions: Sequence[torch.Tensor], device: torch.device
    ) -> tuple[torch.Tensor, float]:
        """The frequencies (on ``device``) and cos/sin scale for a call with these positions:
        those of construction, unless the scaling is position-dependent; then its
        ``call_frequencies`` chooses them from the largest position (a device scalar)."""
        scaling = self._scaling
        if scaling is not None and scaling.position_dependent:
            maxima = [p.max().to(torch.float64) for p in positions if p.numel()]
            if maxima:
                largest = torch.stack(maxima).max()  # a device scalar
                return scaling.call_frequencies(
                    largest, lambda seq_len: self.at(seq_len, device), self.attention_scale
                )
        return self.at(None, device), self.attention_scale

    def at(self, seq_len: float | None, device: torch.device) -> torch.Tensor:
        """The float64 frequencies on ``device`` for a call whose largest position is
        ``seq_len - 1`` (``None``: those of construction), computed once per
        ``(seq_len, device)``."""
        if seq_len is None:
            return self._on_device("inv_freq", device, lambda: self.inv_freq)
        if seq_len in self._precomputed:
            return self._on_device(("seq_len", seq_len), device, lambda: self._precomputed[seq_len])

        def make() -> torch.Tensor:
            with torch.device("cpu"):
                return self._compute(seq_len)[0]

        return self._on_device(("seq_len", seq_len), device, make)

    def _on_device(
        self, key: Any, device: torch.device, make: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        """A copy of a float64 CPU tensor on ``device``, kept per ``(key, device)``.

        Traced (``torch.compile``, ``torch.export``) the cache is neither read nor filled:
        a graph that inserted into it would fail its own guards on the next call (a
        recompile), and one that read it would recompile whenever eager calls change it."""
        if tracing():
            return make().to(device)
        slot = (key, device)
        if slot not in self._device_cache:
            if len(self._device_cache) >= _CACHE_SIZE:
                self._device_cache.clear()
            self._device_cache[slot] = make().to(device)
        return self._device_cache[slot]
