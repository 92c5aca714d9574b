"""The list options of a study, parsed strictly: one rule for ``"0,1,2"`` and for lists.

A comma-separated string is split on commas and every entry stripped; an empty entry
(``"0,,1"``, a trailing comma) is refused, never skipped, and an integer entry is ASCII
digits with an optional ``-`` (``int()`` alone would take ``1_000``, ``+1`` and other
scripts' digits). A list is one-dimensional (a 2-D array or nested lists are refused,
not flattened or read entry by entry), and its entries are plain integers (a 0-d integer
array or tensor too; a float, a bool or a 1-element array is refused).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from posenc._errors import PosEncError, check_int

__all__ = ["int_sequence", "parse_int", "split_entries", "string_sequence"]

_INT_TEXT = re.compile(r"-?[0-9]+")


def split_entries(name: str, text: str) -> list[str]:
    """``text`` split on commas, each entry stripped; an empty entry is refused."""
    items = [t.strip() for t in text.split(",")]
    if any(not t for t in items):
        raise PosEncError(f"{name} must not hold an empty entry, got {text!r}")
    return items


def parse_int(name: str, text: str) -> int:
    """``text`` as an integer: ASCII digits with an optional leading ``-``."""
    if not _INT_TEXT.fullmatch(text):
        raise PosEncError(f"{name} entries must be integers (digits, an optional -), got {text!r}")
    return int(text)


def _entry(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, (list, tuple, Mapping, str, bytes)) or getattr(value, "ndim", 0) != 0:
        raise PosEncError(f"{name} entries must be integers, got {value!r}")
    if isinstance(value, torch.Tensor) and (
        value.is_floating_point() or value.is_complex() or value.dtype == torch.bool
    ):
        raise PosEncError(f"{name} entries must be integers, got {value!r}")
    return check_int(f"{name} entry", value, min=low, max=high)


def _sequence(name: str, values: Any, kind: str) -> list[Any]:
    if (
        isinstance(values, (bytes, Mapping, set, frozenset))
        or not hasattr(values, "__iter__")
        or isinstance(values, str)
    ):
        raise PosEncError(f"{name} must be a list of {kind}, got {values!r:.80}")
    ndim = getattr(values, "ndim", 1)
    if ndim != 1:
        raise PosEncError(f"{name} must be a 1-D list of {kind}, got a {ndim}-D array")
    return list(values)


def int_sequence(name: str, values: Any, *, low: int, high: int) -> tuple[int, ...]:
    """``values`` (a ``"0,1,2"`` string or a 1-D list) as integers in ``[low, high]``."""
    if isinstance(values, str):
        items: list[Any] = [parse_int(name, t) for t in split_entries(name, values)]
    else:
        items = _sequence(name, values, "integers")
    return tuple(_entry(name, v, low, high) for v in items)


def string_sequence(name: str, values: Any) -> list[Any]:
    """``values`` as a list: a ``"a,b"`` string split (no empty entry), a 1-D list as it is
    (its entries checked by the caller)."""
    if isinstance(values, str):
        return list(split_entries(name, values))
    return _sequence(name, values, "names")
