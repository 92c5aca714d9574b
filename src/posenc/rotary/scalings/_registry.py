"""The scaling registry: name -> (parameter dataclass, function), and what every entry shares.

A scaling module defines a frozen parameter dataclass deriving from :class:`ScalingParams`
with :func:`frozen` (its fields by name only; a missing or unknown one is a ``PosEncError``;
the values validated in ``__post_init__``) and registers its function beside it::

    @register(LinearScaling)
    def _linear(p, dim, base, seq_len) -> tuple[torch.Tensor, float]: ...

The function returns ``(inv_freq, attention_scale)``: float64 frequencies ``[dim // 2]``
on the CPU and the factor cos/sin are multiplied by. ``seq_len`` is the largest position
of a call plus one (``None``: the state at construction).

A scaling whose frequencies depend on the positions of a call sets
``position_dependent = True`` and overrides :meth:`ScalingParams.call_frequencies`, which
a rotary module asks for the frequencies of each call (and, where the choice is among a
few fixed lengths, :meth:`ScalingParams.precomputed_lengths`).

This module imports nothing from its siblings: they import it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

from posenc._errors import PosEncError, check_float, check_int

__all__ = [
    "SCALINGS",
    "FrequenciesAt",
    "ScalingFn",
    "ScalingParams",
    "check_factor",
    "check_length",
    "check_positive",
    "default_frequencies",
    "divided_frequencies",
    "exponents",
    "frozen",
    "ratio_factor",
    "register",
    "set_field",
]

if TYPE_CHECKING:  # typing has it from Python 3.11; only type checkers read it
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda decorator: decorator


_T = TypeVar("_T")


@dataclass_transform(frozen_default=True, kw_only_default=True)
def frozen(cls: type[_T]) -> type[_T]:
    """A scaling's parameter dataclass: frozen, keyword-only, and built only from its own
    fields by name. A missing required field, an unknown keyword or a positional argument
    is a :class:`~posenc.PosEncError` naming it (the dataclass' ``__init__`` would raise a
    ``TypeError``); ``__post_init__`` then validates the values. Fields, ``replace``,
    equality and pickling are the dataclass' own."""
    cls = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    names = [f.name for f in fields]
    required = [
        f.name
        for f in fields
        if (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        or f.metadata.get("required")
    ]
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kind = getattr(cls, "type", cls.__name__)
        if args:
            raise PosEncError(
                f"{kind} scaling takes its fields by name only ({', '.join(names)}), got "
                f"{len(args)} positional argument(s) {args!r}"
            )
        unknown = [key for key in kwargs if key not in names]
        if unknown:
            raise PosEncError(
                f"{kind} scaling got unknown field(s) {', '.join(map(repr, unknown))}; "
                f"allowed: {', '.join(names)}"
            )
        missing = [name for name in required if name not in kwargs]
        if missing:
            optional = [name for name in names if name not in required]
            raise PosEncError(
                f"{kind} scaling is missing required field(s) {', '.join(missing)}; "
                f"required: {', '.join(required)}; optional: {', '.join(optional) or 'none'}"
            )
        init(self, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


# (params, dim, base, seq_len) -> (inv_freq float64 [dim // 2] on the CPU, attention_scale)
ScalingFn = Callable[[Any, int, float, "float | None"], "tuple[torch.Tensor, float]"]
# seq_len -> a rotary module's float64 frequencies on the call's device for a call of that
# length (None: those of construction), computed once per (device, seq_len) and cached.
FrequenciesAt = Callable[["float | None"], torch.Tensor]

# name -> (parameter dataclass, function(params, dim, base, seq_len) -> (inv_freq, scale))
SCALINGS: dict[str, tuple[type, ScalingFn]] = {}


class ScalingParams:
    """The base of every scaling's parameter dataclass.

    Attributes:
        position_dependent: whether the frequencies depend on the positions of a call
            (then :meth:`call_frequencies` reads the largest one).
        frequency_span: the channels the exponents ``2i / dim`` span: ``"rotary_dim"``
            (the rotated channels; every scaling but one) or ``"head_dim"`` (the whole head,
            of which a rotary module keeps the first ``rotary_dim / 2``: ``proportional``).
    """

    type: str  # the registry name, each dataclass' field (its class attribute too)
    position_dependent: ClassVar[bool] = False
    frequency_span: ClassVar[str] = "rotary_dim"

    def call_frequencies(
        self, largest: torch.Tensor, frequencies: FrequenciesAt, scale: float
    ) -> tuple[torch.Tensor, float]:
        """The frequencies and cos/sin scale for one call of a rotary module.

        Called only when :attr:`position_dependent` is true and the call has positions;
        the frequencies of the other calls are those of construction.

        Args:
            largest: the largest position of the call, a float64 device scalar (reading
                its value on the host is a synchronisation: avoid it where possible).
            frequencies: the module's frequencies on the call's device for a given
                ``seq_len`` (``None``: those of construction), cached.
            scale: the module's attention scale at construction.

        Returns:
            ``(inv_freq, attention_scale)``: float64 ``[rotary_dim / 2]`` on the call's device.
        """
        return frequencies(None), scale

    def precomputed_lengths(self) -> tuple[int, ...]:
        """The ``seq_len`` values whose frequencies :meth:`call_frequencies` takes, computed
        once when a module is built (so a call computes nothing on the host and compiles
        into one graph); others are computed, then cached, when a call first needs them."""
        return ()


def register(params: type[ScalingParams]) -> Callable[[ScalingFn], ScalingFn]:
    """Register the decorated function under ``params.type``, together with ``params``."""

    def deco(fn: ScalingFn) -> ScalingFn:
        SCALINGS[params.type] = (params, fn)
        return fn

    return deco


# --- the validators the dataclasses share ------------------------------------------------------


def set_field(obj: Any, name: str, value: Any) -> None:
    """Normalise a field of a frozen dataclass (in ``__post_init__``)."""
    object.__setattr__(obj, name, value)


# The largest factor (and other multiplier) a scaling takes: a million times the trained
# context; beyond it frequencies and attention factors leave float32.
MAX_FACTOR = 1e6


def check_factor(kind: str, value: Any) -> float:
    """A scaling factor: a number in ``[1, MAX_FACTOR]``."""
    return check_float(f"{kind} scaling factor", value, min=1.0, max=MAX_FACTOR)


def check_length(kind: str, name: str, value: Any) -> int:
    """A context length: an integer ``>= 1``."""
    return check_int(f"{kind} scaling {name}", value, min=1)


def check_positive(kind: str, name: str, value: Any) -> float:
    """A number in ``(0, MAX_FACTOR]``."""
    return check_float(f"{kind} scaling {name}", value, min=0.0, min_exclusive=True, max=MAX_FACTOR)


def ratio_factor(kind: str, max_position: int | None, original: int) -> float:
    """The factor of a scaling given ``max_position`` instead (YaRN, LongRoPE):
    ``max_position / original_max_position``; one of the two must be given."""
    if max_position is None:
        raise PosEncError(
            f"{kind} scaling needs factor, or max_position to derive it from "
            "(factor = max_position / original_max_position), got neither"
        )
    return max_position / original


# --- the frequencies the functions share -------------------------------------------------------


def exponents(dim: int) -> torch.Tensor:
    """``2i / dim`` for ``i < dim / 2``, float64."""
    return torch.arange(0, dim, 2, dtype=torch.float64) / dim


def default_frequencies(dim: int, base: float) -> torch.Tensor:
    """RoFormer's ``1 / base^(2i / dim)``, float64 ``[dim // 2]``."""
    return 1.0 / base ** exponents(dim)


def divided_frequencies(
    p: Any, dim: int, base: float, seq_len: float | None
) -> tuple[torch.Tensor, float]:
    """The function of a scaling whose every frequency is the default one divided by
    ``p.factor``, with no attention scale: position interpolation (``linear``) and p-RoPE
    (``proportional``, which differs in the span of its exponents, not here)."""
    return default_frequencies(dim, base) / p.factor, 1.0
