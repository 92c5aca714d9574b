"""The one vocabulary of field rules for a record read back from disk or built by a user
(a checkpoint, ``results.json``, ``report.json``, a study's settings).

A field is named by :class:`At`: the record (``where``, e.g. ``"checkpoint 'run.pt'"``) and
the path inside it, spelt ``runs[0]['eval']['8']``. Every rule raises one shape of
:class:`~posenc.PosEncError`, ``{where} field {path} must be {rule}, got {value}``
(:func:`fail`), the shape of the ``check_*`` helpers with the record in front. The rules
are functions (``integer``, ``number``, ``string``, ``boolean``, ``choice``, ``mapping``,
``sequence``) that return the value checked; :func:`keys_known` refuses an unknown key.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sized
from typing import Any, cast

from posenc._errors import PosEncError, check_choice, describe

__all__ = [
    "At",
    "boolean",
    "choice",
    "fail",
    "integer",
    "keys_known",
    "mapping",
    "number",
    "sequence",
    "shown",
    "string",
]

_SHOWN = 80  # the most characters of a value a message shows


class At:
    """Where a field sits: the record ``where`` and the ``path`` inside it; ``at[key]`` is
    a field inside this one (``path['key']``, ``path[0]``)."""

    __slots__ = ("path", "where")

    def __init__(self, where: str = "", path: str = "") -> None:
        self.where, self.path = where, path

    def __getitem__(self, key: Any) -> At:
        if not self.path:
            return At(self.where, str(key))
        return At(self.where, f"{self.path}[{key!r}]")

    def __str__(self) -> str:
        if self.where and self.path:
            return f"{self.where} field {self.path}"
        return self.path or self.where

    @property
    def owner(self) -> str:
        """The path alone (the record when there is none), for a rule naming the field."""
        return self.path or self.where


def shown(value: Any) -> str:
    """``value`` as a message shows it: a tensor or array by shape and dtype
    (:func:`~posenc._errors.describe`), anything else by its ``repr``, cut to 80 characters."""
    text = describe(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def fail(at: At | str, rule: str, value: Any) -> PosEncError:
    """The error of the field ``at`` breaking ``rule``: ``{at} must be {rule}, got {value}``."""
    return PosEncError(f"{at} must be {rule}, got {shown(value)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(at: At | str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """``value`` if it is an ``int`` (never a bool) in ``[low, high]`` (None: unbounded)."""
    if (
        not _is_int(value)
        or (low is not None and value < low)
        or (high is not None and value > high)
    ):
        if low is not None and high is not None:
            rule = f"an integer in [{low}, {high}]"
        elif low is not None or high is not None:
            rule = f"an integer >= {low}" if high is None else f"an integer <= {high}"
        else:
            rule = "an integer"
        raise fail(at, rule, value)
    return value


def number(
    at: At | str,
    value: Any,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    finite: bool = True,
    null: bool = False,
) -> Any:
    """``value`` if it is an ``int`` or ``float`` (never a bool) in ``[low, high]``; finite
    unless ``finite=False``; None too with ``null``."""
    if value is None and null:
        return None
    if not _is_number(value):
        raise fail(at, "a number" + (" or None" if null else ""), value)
    bounded = (low == -math.inf or value >= low) and (high == math.inf or value <= high)
    if (finite and not math.isfinite(value)) or not bounded:
        rule = "a finite number" if finite else "a number"
        rule += "" if low == -math.inf else f" >= {low}"
        rule += "" if high == math.inf else f" and <= {high:g}"
        raise fail(at, rule, value)
    return value


def string(
    at: At | str, value: Any, rule: str = "a string", *, empty: bool = True, null: bool = False
) -> Any:
    """``value`` if it is a ``str`` (a non-empty one unless ``empty``; None with ``null``)."""
    if value is None and null:
        return None
    if not isinstance(value, str) or (not empty and not value):
        raise fail(at, rule, value)
    return value


def boolean(at: At | str, value: Any) -> bool:
    """``value`` if it is a ``bool``."""
    if not isinstance(value, bool):
        raise fail(at, "True or False", value)
    return value


def choice(at: At | str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices`` (:func:`posenc._errors.check_choice`'s rule)."""
    return check_choice(str(at), value, choices)


def mapping(
    at: At,
    value: Any,
    rule: str = "an object",
    *,
    required: Iterable[str] = (),
    allowed: Iterable[Any] | None = None,
    null: bool = False,
) -> Any:
    """``value`` if it is a mapping holding every key of ``required`` and, when ``allowed``
    is given, no other key (:func:`keys_known`)."""
    if value is None and null:
        return None
    if not isinstance(value, Mapping):
        raise fail(at, rule, value)
    for key in required:
        if key not in value:
            raise fail(at[key], f"present (a key of {at.owner})", "absent")
    if allowed is not None:
        keys_known(at, value, allowed)
    return value


def keys_known(at: At, value: Mapping[Any, Any], allowed: Iterable[Any]) -> None:
    """``value`` holds no key but ``allowed`` (strings): an unknown one is refused by name."""
    allowed = tuple(allowed)
    for key in value:
        if type(key) is not str or key not in allowed:
            raise fail(at[key], f"absent (not a key of {at.owner})", value[key])


def sequence(
    at: At | str,
    value: Any,
    rule: str = "a list",
    *,
    low: int = 0,
    high: int | None = None,
    types: tuple[type, ...] = (list,),
    null: bool = False,
) -> Any:
    """``value`` if it is a list (an instance of ``types``) of ``low`` to ``high`` items."""
    if value is None and null:
        return None
    size = len(cast(Sized, value)) if isinstance(value, types) else -1
    if size < low or (high is not None and size > high):
        raise fail(at, rule, value)
    return value
