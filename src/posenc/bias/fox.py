"""Deprecated: forgetting attention moved to :mod:`posenc.gated.fox` (a gated encoding, not
a bias of positions). The old names work, with a ``DeprecationWarning``, for one release."""

from typing import Any

from posenc._deprecated import moved

_NAMES = ("FoXBias", "fox_bias", "fox_cumulative")


def __getattr__(name: str) -> Any:
    return moved(__name__, name, "posenc.gated.fox", _NAMES)
