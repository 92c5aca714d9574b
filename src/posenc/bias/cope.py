"""Deprecated: CoPE moved to :mod:`posenc.contextual.cope` (a contextual encoding, not a
bias of positions). The old names work, with a ``DeprecationWarning``, for one release."""

from typing import Any

from posenc._deprecated import moved

_NAMES = ("POSITION_LOGITS", "CoPEBias", "cope_bias", "cope_position_logits", "cope_positions")


def __getattr__(name: str) -> Any:
    return moved(__name__, name, "posenc.contextual.cope", _NAMES)
