"""Names that moved, kept importable from their old place for one release.

A module whose names moved defines ``__getattr__`` (PEP 562) as one call to :func:`moved`:
the name is looked up in its new module, by path, with a ``DeprecationWarning`` naming the
new place. The old module imports nothing from the new one, so no arrow of the map points
from an old room into a new one.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterable
from typing import Any

__all__ = ["moved"]


def moved(module: str, name: str, new_module: str, names: Iterable[str]) -> Any:
    """``getattr(new_module, name)`` with a ``DeprecationWarning`` when ``name`` is one of
    ``names`` (moved from ``module`` to ``new_module``); ``AttributeError`` otherwise."""
    if name not in set(names):
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} moved to {new_module}.{name}; the old place will be removed in the "
        "next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(new_module), name)
