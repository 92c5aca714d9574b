"""Deprecated: transformers' spellings of a RoPE scaling moved to
:mod:`posenc.integrations.spelling` (the one place that knows another library's spelling).
The old names work, with a ``DeprecationWarning``, for one release."""

from typing import Any

from posenc._deprecated import moved

_NAMES = (
    "GENERAL_KEYS",
    "KEY_ALIASES",
    "TYPE_ALIASES",
    "Given",
    "from_rope_parameters",
    "is_transformers_spelling",
    "posenc_spelling",
    "scaling_type",
    "transformers_keys",
)


def __getattr__(name: str) -> Any:
    return moved(__name__, name, "posenc.integrations.spelling", _NAMES)
