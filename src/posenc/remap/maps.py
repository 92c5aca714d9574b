"""The position maps: Self-Extend and STRING, each a frozen dataclass of its parameters.

A map says, per (query position ``i``, key position ``j <= i``) pair of offset
``d = i - j``, at which positions the query and the key are rotated:

- :class:`SelfExtend` (Jin et al. 2024, "LLM Maybe LongLM"; datamllab/LongLM): neighbours
  ``d < neighbor_window`` keep ``(i, j)``; farther pairs (branch 1) take grouped positions,
  the query at ``i // G + W - W / G`` (a fraction when ``G`` does not divide ``W``, as
  LongLM computes it) and the key at ``j // G``, so the two regions meet at ``d = W``.
- :class:`String` (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall
  Short?"; HKUNLP/STRING): offsets ``d >= shift`` (branch 1) are rotated as ``d - shift +
  local_window``, the query moved to ``i - shift + local_window``; smaller ones keep theirs.
  Each pair is counted once (the reference's prefill counts ``d == shift`` in both parts).

:func:`position_map` turns a config dict into a map; :func:`self_extend_for` and
:func:`string_for` give each paper's parameters for a model trained on ``trained`` positions
run at ``target``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from posenc._base import PositionMap
from posenc._errors import PosEncError, check_int, describe

__all__ = ["MAP_TYPES", "SelfExtend", "String", "position_map", "self_extend_for", "string_for"]

#: The ``"type"`` of each map in a config dict.
MAP_TYPES = ("self_extend", "string")


def _set(obj: Any, name: str, value: int) -> None:
    object.__setattr__(obj, name, value)  # a frozen dataclass normalising its own field


def _check_window(trained: Any, name: str, value: int, why: str) -> None:
    """``value`` (the map's field ``name``) at most the trained context length ``trained``."""
    trained = check_int("trained", trained, min=1)
    if value > trained:
        raise PosEncError(
            f"{name} must be <= the trained context length {trained} ({why}), got {value}"
        )


@dataclasses.dataclass(frozen=True)
class SelfExtend(PositionMap):
    """Self-Extend's map: exact offsets within ``neighbor_window``, grouped ones beyond.

    Args:
        group_size: ``G >= 1``, the positions merged into one beyond the window (1: plain
            RoPE).
        neighbor_window: ``W >= 1``, offsets ``d < W`` keep their positions.
    """

    group_size: int
    neighbor_window: int
    branches: ClassVar[int] = 2

    def __post_init__(self) -> None:
        _set(self, "group_size", check_int("group_size", self.group_size, min=1))
        _set(self, "neighbor_window", check_int("neighbor_window", self.neighbor_window, min=1))

    def branch_at(self, offsets: torch.Tensor) -> torch.Tensor:
        return (offsets >= self.neighbor_window).long()

    def offset_bounds(self, branch: int) -> tuple[int, int | None]:
        w = self.neighbor_window
        return (0, w - 1) if branch == 0 else (w, None)

    def query_positions_at(self, branch: int, positions: torch.Tensor) -> torch.Tensor:
        if branch == 0:
            return positions
        g, w = self.group_size, self.neighbor_window
        if w % g == 0:  # whole numbers: i // G + (W - W / G) exactly
            return torch.div(positions, g, rounding_mode="floor") + (w - w // g)
        grouped = torch.div(positions, g, rounding_mode="floor").to(torch.float64)
        return grouped + w - w / g  # LongLM's order of operations

    def key_positions_at(self, branch: int, positions: torch.Tensor) -> torch.Tensor:
        if branch == 0:
            return positions
        return torch.div(positions, self.group_size, rounding_mode="floor")

    def check_trained(self, trained: int) -> None:
        why = "the neighbours keep positions the model was trained on"
        _check_window(trained, "neighbor_window", self.neighbor_window, why)

    def to_config(self) -> dict[str, Any]:
        return {"type": "self_extend", **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class String(PositionMap):
    """STRING's map: offsets ``d >= shift`` are rotated as ``d - shift + local_window``.

    Args:
        shift: ``S >= 1``, the first offset moved (the paper: about a third of the context).
        local_window: ``0 <= W < S``, the offset ``S`` becomes (the paper: 128 or fewer).
    """

    shift: int
    local_window: int
    branches: ClassVar[int] = 2

    def __post_init__(self) -> None:
        shift = check_int("shift", self.shift, min=1)
        window = check_int("local_window", self.local_window, min=0)
        if window >= shift:
            raise PosEncError(
                f"local_window must be < shift ({shift}: offsets from shift on become "
                f"d - shift + local_window, smaller than d), got {window}"
            )
        _set(self, "shift", shift)
        _set(self, "local_window", window)

    def branch_at(self, offsets: torch.Tensor) -> torch.Tensor:
        return (offsets >= self.shift).long()

    def offset_bounds(self, branch: int) -> tuple[int, int | None]:
        return (0, self.shift - 1) if branch == 0 else (self.shift, None)

    def query_positions_at(self, branch: int, positions: torch.Tensor) -> torch.Tensor:
        return positions if branch == 0 else positions - (self.shift - self.local_window)

    def key_positions_at(self, branch: int, positions: torch.Tensor) -> torch.Tensor:
        return positions

    def check_trained(self, trained: int) -> None:
        why = "STRING moves offsets the model was trained on"
        _check_window(trained, "shift", self.shift, why)

    def to_config(self) -> dict[str, Any]:
        return {"type": "string", **dataclasses.asdict(self)}


_CLASSES: dict[str, type[SelfExtend] | type[String]] = {
    "self_extend": SelfExtend,
    "string": String,
}


def coerce(spec: Any, name: str) -> PositionMap:
    """:func:`position_map` whose messages name the argument ``name``."""
    if isinstance(spec, PositionMap):
        return spec
    if not isinstance(spec, Mapping):
        raise PosEncError(
            f"{name} must be a position map (SelfExtend, String) or a dict with a 'type' of "
            f"{MAP_TYPES}, got {describe(spec)}"
        )
    kind = spec.get("type")
    if not isinstance(kind, str) or kind not in _CLASSES:
        raise PosEncError(f"{name} 'type' must be one of {MAP_TYPES}, got {describe(kind)}")
    cls = _CLASSES[kind]
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(str(key) for key in spec if key != "type" and key not in fields)
    if unknown:
        raise PosEncError(
            f"{name} of type {kind!r} takes the keys {fields}, got unknown keys {unknown}"
        )
    missing = [f for f in fields if f not in spec]
    if missing:
        raise PosEncError(f"{name} of type {kind!r} needs the keys {fields}, missing {missing}")
    return cls(**{f: spec[f] for f in fields})


def position_map(spec: PositionMap | Mapping[str, Any]) -> PositionMap:
    """A position map from a map itself or its config, ``{"type": "self_extend",
    "group_size": G, "neighbor_window": W}`` or ``{"type": "string", "shift": S,
    "local_window": W}`` (what :meth:`~posenc._base.PositionMap.to_config` returns).

    Raises:
        PosEncError: an unknown type, an unknown or missing key, or a bad value.
    """
    return coerce(spec, "spec")


def self_extend_for(trained: int, target: int) -> SelfExtend:
    """LongLM's rule for a model trained on ``trained`` positions run at ``target``:
    ``neighbor_window = trained // 4``, and ``group_size`` the smallest power of two with
    ``W + (target - W) / G <= trained / 2`` (the largest grouped position within half the
    trained context)."""
    trained = check_int("trained", trained, min=4)
    target = check_int("target", target, min=1)
    window, group = trained // 4, 1
    while 2 * (window * group + target - window) > trained * group:  # exact in integers
        group *= 2
    return SelfExtend(group_size=group, neighbor_window=window)


def string_for(trained: int, target: int) -> String:
    """STRING's defaults (An et al. 2024) for a model trained on ``trained`` positions run
    at ``target``: ``shift = max(trained, target) // 3`` and ``local_window = min(128,
    shift // 2)``."""
    trained = check_int("trained", trained, min=1)
    target = check_int("target", target, min=1)
    if max(trained, target) < 3:
        raise PosEncError(
            f"target or trained must be >= 3 (shift = max(trained, target) // 3 must be "
            f">= 1), got trained={trained}, target={target}"
        )
    shift = max(trained, target) // 3
    return String(shift=shift, local_window=min(128, shift // 2))
