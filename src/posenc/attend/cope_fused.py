"""Deprecated: CoPE's fused CPU kernel moved to :mod:`posenc.contextual.cope_fused` (the
contextual room, beside CoPE). The old names work, with a ``DeprecationWarning``, for one
release; ``applies`` and ``fused`` there take plain tensors and options (the table, the
mask, ``causal``, ``scale``) instead of an encoding and an attention call."""

from typing import Any

from posenc._deprecated import moved

_NAMES = ("BLOCK_SCORES", "applies", "available", "fused")


def __getattr__(name: str) -> Any:
    return moved(__name__, name, "posenc.contextual.cope_fused", _NAMES)
