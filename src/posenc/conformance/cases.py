"""The catalogue of golden cases: every encoding, layout and scaling of posenc's float64
reference, at near and far positions, with the tolerance each dtype is allowed.

A :class:`Case` holds its inputs, its expected outputs (computed by
:mod:`posenc.reference`, float64) and two bound arrays per output that the tolerance model
scales (:func:`coefficients`):

    tolerance = output * max(|expected|, smallest_normal) + arithmetic * magnitude
                + angle * angle_bound

- ``output``: the unit roundoff of the adapter's dtype (its result rounded once; below the
  dtype's smallest normal number, the step there);
- ``arithmetic``: 8 units of the precision it computes in: float64 for a float64 adapter,
  float32 for every other (a bfloat16 or float16 implementation still computes in float32
  or better), times ``magnitude``, the size of the terms the computation carries (1 for a
  sinusoidal table, ``|x_a| + |x_b|`` for a rotated pair);
- ``angle``: 16 units of the precision of its angles times ``angle_bound`` (``|angle|``
  times the amplitude it multiplies). NEAR cases (positions up to 4095) allow float32
  angles for every dtype but float64; FAR cases (1e5, 1e5 + 1, 1e6, 1e6 + 1) allow only
  float64 angles (or angles reduced before they are rounded), so an implementation that
  computes its angles in float32 fails there, its error growing with the position.

Case names read ``family.operation-detail...@near`` / ``@far`` (positions) so that
``--cases '*@far'`` selects the far ones. NumPy and the standard library only.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence

from posenc._errors import PosEncError
from posenc.conformance import _biases, _rotary, _tables
from posenc.conformance._case import (
    ANGLE_UNITS,
    ARITHMETIC_UNITS,
    FAR,
    INPUTS,
    NEAR,
    OUTPUTS,
    SMALLEST_NORMAL,
    UNIT_ROUNDOFF,
    Case,
    coefficients,
    round_to,
    select,
)

__all__ = [
    "ANGLE_UNITS",
    "ARITHMETIC_UNITS",
    "FAR",
    "INPUTS",
    "NEAR",
    "OUTPUTS",
    "SMALLEST_NORMAL",
    "UNIT_ROUNDOFF",
    "Case",
    "build_cases",
    "catalogue",
    "coefficients",
    "conventions",
    "round_to",
    "select",
]


_CATALOGUE: list[tuple[Case, ...]] = []


def catalogue() -> tuple[Case, ...]:
    """Every case, built once per process (cases are frozen, their arrays read-only, so one
    set serves every caller)."""
    if not _CATALOGUE:
        builders: list[Callable[[], list[Case]]] = [
            _tables.build,
            _rotary.build_frequencies,
            _rotary.build_rotations,
            _biases.build,
        ]
        cases = tuple(c for build in builders for c in build())
        names = [c.name for c in cases]
        if len(set(names)) != len(names):  # pragma: no cover - a builder's slip
            raise PosEncError("case names must be unique")
        _CATALOGUE.append(cases)
    return _CATALOGUE[0]


def build_cases(cases: str | Sequence[str] | None = None) -> list[Case]:
    """The catalogue, computed from :mod:`posenc.reference` in float64 (deterministic: seeded
    inputs), optionally only the cases whose name matches one of the ``fnmatch`` globs
    ``cases``.

    Returns: the cases, in a fixed order (tables, frequencies, rotations, biases).

    Raises:
        PosEncError: ``cases`` is not None, a glob string or a non-empty sequence of them,
            or matches no case.
    """
    return select(catalogue(), cases)


def conventions() -> Mapping[tuple[str, str], Mapping[str, frozenset[type]]]:
    """Per ``(operation, family)``, the convention keys its cases have and the types of
    their values (``{("table", "sinusoidal"): {"layout": {str}, "order": {str}}, ...}``),
    read off the catalogue: what an :class:`~posenc.conformance.Adapter` may claim."""
    if not _CONVENTIONS:
        found: dict[tuple[str, str], dict[str, set[type]]] = {}
        for case in catalogue():
            keys = found.setdefault((case.operation, case.family), {})
            for key, value in case.convention.items():
                keys.setdefault(key, set()).add(type(value))
        _CONVENTIONS.append(
            types.MappingProxyType(
                {
                    where: types.MappingProxyType({k: frozenset(t) for k, t in keys.items()})
                    for where, keys in found.items()
                }
            )
        )
    return _CONVENTIONS[0]


_CONVENTIONS: list[Mapping[tuple[str, str], Mapping[str, frozenset[type]]]] = []
