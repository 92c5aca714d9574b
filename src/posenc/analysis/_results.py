"""Base of the analysis results: small frozen dataclasses that turn into JSON.

A result is checked when it is made, from its fields' annotations (:meth:`Result.__post_init__`):
a ``str`` is a non-empty string (one of :attr:`Result.choices` where it has choices), an
``int`` an integer (``>= 0`` unless it is signed: ``seed``), a ``float`` a finite real number
(stored as ``float``), a ``bool`` a bool, a ``tuple[...]`` a tuple or list of its items
(stored as a tuple), a ``dict[str, ...]`` a dict with string keys, a nested result one of its
class, ``X | None`` also None. A bad field is a :class:`~posenc.PosEncError` naming it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from posenc._errors import PosEncError, check_bool, check_float, check_int

__all__ = ["KINDS", "Result", "jsonable"]

#: The kinds an encoding has (``Encoding.kind``).
KINDS = ("additive", "rotary", "bias", "none")


def jsonable(value: Any) -> Any:
    """``value`` with tuples, dataclasses, tensors and dtypes turned into JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return jsonable(value.tolist())
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no inf / NaN
    return value


def _dtype_names(*, integer: bool) -> tuple[str, ...]:
    """The names of torch's floating dtypes (and integer ones with ``integer``)."""
    names = []
    for name in dir(torch):
        dtype = getattr(torch, name)
        if isinstance(dtype, torch.dtype) and str(dtype) == f"torch.{name}":
            real = dtype.is_floating_point or (integer and not dtype.is_complex)
            if real and dtype != torch.bool:
                names.append(name)
    return tuple(sorted(names))


FLOATING_DTYPES = _dtype_names(integer=False)
REAL_DTYPES = _dtype_names(integer=True)

_HINTS: dict[type, dict[str, Any]] = {}


@dataclasses.dataclass(frozen=True)
class Result:
    """A frozen dataclass with :meth:`to_dict` (JSON-serialisable, nested), its fields
    checked when it is made (see the module docs)."""

    #: fields whose string is one of these values
    choices: ClassVar[dict[str, tuple[str, ...]]] = {
        "kind": KINDS,
        "unit": ("position", "distance"),
        "dtype": FLOATING_DTYPES,
        "position_dtype": REAL_DTYPES,
    }
    #: integer fields that may be negative
    signed: ClassVar[frozenset[str]] = frozenset({"seed"})

    def __post_init__(self) -> None:
        cls = type(self)
        if cls not in _HINTS:
            _HINTS[cls] = typing.get_type_hints(cls)
        hints = _HINTS[cls]
        for field in dataclasses.fields(self):
            value = _checked(self, field.name, getattr(self, field.name), hints[field.name])
            object.__setattr__(self, field.name, value)
        self._check()

    def _check(self) -> None:
        """What a class checks beyond its fields' types (nothing here)."""

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self)


def _checked(result: Result, name: str, value: Any, hint: Any) -> Any:
    """``value`` of the field ``name`` (or an item of it) checked against ``hint``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        return _checked(result, name, value, hint)
    if hint is Any:
        return value
    if origin is tuple:
        return _items(result, name, value, args)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise PosEncError(f"{name} must be a dict, got {type(value).__name__}")
        for key in value:
            if not isinstance(key, str) or not key:
                raise PosEncError(f"{name} must have non-empty str keys, got {key!r}")
        return {k: _checked(result, f"{name}[{k!r}]", v, args[1]) for k, v in value.items()}
    return _scalar(result, name, value, hint)


def _items(result: Result, name: str, value: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    if not isinstance(value, (tuple, list)):
        raise PosEncError(f"{name} must be a tuple, got {type(value).__name__}")
    if len(args) == 2 and args[1] is Ellipsis:
        hints = [args[0]] * len(value)
    elif len(value) != len(args):
        raise PosEncError(f"{name} must hold {len(args)} values, got {len(value)}")
    else:
        hints = list(args)
    return tuple(
        _checked(result, f"{name}[{i}]", v, h) for i, (v, h) in enumerate(zip(value, hints))
    )


def _scalar(result: Result, name: str, value: Any, hint: Any) -> Any:
    base = name.split("[")[0]
    if hint is bool:
        return check_bool(name, value)
    if hint is int:
        lowest = None if base in result.signed else 0
        return check_int(name, value, min=lowest)
    if hint is float:
        if not isinstance(value, numbers.Real):
            raise PosEncError(f"{name} must be a number, got {value!r}")
        return check_float(name, value)
    if hint is str:
        if not isinstance(value, str) or not value:
            raise PosEncError(f"{name} must be a non-empty str, got {value!r}")
        allowed = result.choices.get(base)
        if allowed is not None and value not in allowed:
            listed = ", ".join(map(repr, allowed))
            raise PosEncError(f"{name} must be one of {listed}, got {value!r}")
        return value
    if isinstance(hint, type) and not isinstance(value, hint):
        raise PosEncError(f"{name} must be a {hint.__name__}, got {type(value).__name__}")
    return value
