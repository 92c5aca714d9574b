"""A written setting read back beside what was measured: the rotary modules, layer type by
layer type, and how far their cos/sin lie apart.

:func:`measured_ropes` gives the rotary module of each layer type of the model as a run
patched it; :func:`layer_pairs` pairs each layer type read back with the measured module of
its type; :func:`cos_sin_gap` is the largest difference of their cos/sin. The engines'
artifacts (:mod:`posenc.extend.emit`) and the searched factors' export
(:mod:`posenc.extend.search_export`) are checked with them, each by its own rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from posenc._errors import PosEncError
from posenc.extend.model import Loaded, scaled
from posenc.integrations.transformers import PatchedRotaryEmbedding, unpatch

__all__ = ["cos_sin_gap", "layer_pairs", "measured_ropes"]


def measured_ropes(loaded: Loaded, scaling: Any) -> dict[str | None, Any]:
    """The rotary module of each layer type of ``loaded`` patched with ``scaling`` (as
    :func:`~posenc.extend.model.scaled` takes it); the model is unpatched again."""
    model = scaled(loaded, scaling)
    try:
        for module in model.modules():
            if isinstance(module, PatchedRotaryEmbedding):
                return dict(module.ropes)
    finally:
        unpatch(model)
    raise PosEncError("the patched model has no rotary module to compare against")


def layer_pairs(
    what: str, ours: Mapping[str | None, Any], theirs: Mapping[str | None, Any]
) -> Iterator[tuple[str | None, Any, Any]]:
    """``(key, read back, measured)`` for each layer type ``key`` of ``theirs`` (the modules
    read back from ``what``): the measured module of that type in ``ours``, or its one
    module where it has one.

    Raises:
        PosEncError: ``what`` has a layer type the measured model has not.
    """
    for key, rope in theirs.items():
        measured = ours.get(key) if len(ours) > 1 else next(iter(ours.values()))
        if measured is None:
            raise PosEncError(f"{what} has layer type {key!r}, which the measured model has not")
        yield key, rope, measured


def cos_sin_gap(
    rope: Any, measured: Any, target: int, channels: Callable[[int, int], str]
) -> float:
    """The largest difference of ``rope``'s and ``measured``'s cos/sin over positions
    ``0..target-1``, both in float64.

    Raises:
        PosEncError: the two rotate different numbers of channels; the message is
            ``channels(rope's, measured's)``.
    """
    positions = torch.arange(target)[None]
    gap = 0.0
    for a, b in zip(
        rope.cos_sin(positions, dtype=torch.float64),
        measured.cos_sin(positions, dtype=torch.float64),
    ):
        if a.shape != b.shape:
            raise PosEncError(channels(2 * a.shape[-1], 2 * b.shape[-1]))
        gap = max(gap, float((a - b).abs().max()))
    return gap
