"""The rotary module :func:`~._hf_patch.patch` puts in a transformers model.

:class:`PatchedRotaryEmbedding` stands where the family's rotary module stood and answers
its call, ``forward(x, position_ids[, layer_type])``, with posenc's cos/sin in the form the
family's attention unpacks (:data:`OUTPUTS`): ``(cos, sin)`` (most families), ``(sin, cos)``
(GPT-J) or the complex ``cos + i sin`` (Llama 4's ``freqs_cis``). M-RoPE families (Qwen2-VL,
Qwen2.5-VL, Qwen3-VL) hand it transformers' 3-D ``position_ids [3, b, s]`` (or ``[b, s]``,
every axis alike), which become posenc's ``[b, s, 3]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
from torch import nn

from posenc._errors import PosEncError
from posenc.rotary.module import RotaryEmbedding

__all__ = ["OUTPUTS", "Output", "PatchedRotaryEmbedding"]

Output = Literal["cos_sin", "sin_cos", "complex"]
OUTPUTS: tuple[Output, ...] = ("cos_sin", "sin_cos", "complex")


class PatchedRotaryEmbedding(nn.Module):
    """The rotary module :func:`patch` puts in a transformers model: ``forward(x,
    position_ids, layer_type=None)`` returns posenc's cos/sin.

    Shape: ``x`` any (only its dtype and device are read: float64 gives float64 cos/sin,
    anything else float32), ``position_ids [b, s]`` (M-RoPE: ``[n_axes, b, s]``, or ``[b,
    s]`` for every axis) -> ``cos, sin [b, s, rotary_dim / 2]`` (one value per frequency,
    what posenc's apply takes; not transformers' ``[b, s, head_dim]``), returned as
    ``output`` says: ``(cos, sin)``, ``(sin, cos)`` or ``cos + i sin`` (complex).

    Attributes:
        ropes: the :class:`posenc.RotaryEmbedding` of each layer type (``None``: the one of
            a model with one set of RoPE parameters).
        original: the module it replaced (put back by :func:`unpatch`); a submodule, so
            ``model.to(...)`` moves it too. Neither enters ``state_dict`` (no parameters,
            transformers' rotary buffers are not persistent).
        output: the form of the result, one of :data:`OUTPUTS`.
    """

    def __init__(
        self,
        ropes: Mapping[str | None, RotaryEmbedding],
        original: nn.Module,
        output: Output = "cos_sin",
    ) -> None:
        super().__init__()
        if output not in OUTPUTS:
            raise PosEncError(f"output must be one of {OUTPUTS}, got {output!r}")
        self.original = original
        self.output = output
        self._names = {key: f"rope_{i}" for i, key in enumerate(ropes)}
        for key, rope in ropes.items():
            self.add_module(self._names[key], rope)

    @property
    def ropes(self) -> dict[str | None, RotaryEmbedding]:
        return {key: getattr(self, name) for key, name in self._names.items()}

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        name = self._names.get(layer_type)
        if name is None:
            raise PosEncError(
                f"layer_type must be one of {list(self._names)} for this model, got {layer_type!r}"
            )
        rope: RotaryEmbedding = getattr(self, name)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        axes = rope.position_coords
        if axes is not None:
            position_ids = _axes_last(position_ids, axes)
        cos, sin = rope.cos_sin(position_ids, dtype=dtype)
        if self.output == "complex":
            return torch.complex(cos, sin)
        return (sin, cos) if self.output == "sin_cos" else (cos, sin)


def _axes_last(position_ids: torch.Tensor, axes: int) -> torch.Tensor:
    """transformers' M-RoPE positions ``[axes, b, s]`` (or ``[b, s]``, every axis alike, as
    its rotary modules ``expand`` them) as posenc's ``[b, s, axes]``."""
    if position_ids.ndim == 2:
        return position_ids[..., None].expand(*position_ids.shape, axes)
    if position_ids.ndim == 3 and position_ids.shape[0] == axes:
        return position_ids.movedim(0, -1)
    raise PosEncError(
        f"position_ids must be [{axes}, b, s] or [b, s] for this M-RoPE model, got shape "
        f"{tuple(position_ids.shape)}"
    )
