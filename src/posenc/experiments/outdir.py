"""Deprecated: the out-dir lock moved to :mod:`posenc._files` (``make_out_dir``,
``lock_out_dir``, ``LOCK_NAME``), where every room that writes a run's files reaches it. The
old names work, with a ``DeprecationWarning``, for one release."""

from typing import Any

from posenc._deprecated import moved

_NAMES = ("LOCK_NAME", "lock_out_dir", "make_out_dir")


def __getattr__(name: str) -> Any:
    return moved(__name__, name, "posenc._files", _NAMES)
