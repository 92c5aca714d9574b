"""Moved: :mod:`posenc.rotary.kernels.planned` holds ``FastRotation`` and ``fast_forward``
(one plan per call shape for the module's call and the patched transformers apply); the
old names work here, with a ``DeprecationWarning``, for one release."""

from __future__ import annotations

from typing import Any

from posenc._deprecated import moved


def __getattr__(name: str) -> Any:
    return moved(__name__, name, "posenc.rotary.kernels.planned", ("FastRotation", "fast_forward"))
