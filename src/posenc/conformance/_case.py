"""A golden case and the helpers its builders share (the tolerance model: see
:mod:`posenc.conformance.cases`). NumPy and the standard library only."""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import types
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from posenc._errors import PosEncError

__all__ = [
    "ANGLE_UNITS",
    "ARITHMETIC_UNITS",
    "DTYPES",
    "FAR",
    "INPUTS",
    "NEAR",
    "OUTPUTS",
    "SMALLEST_NORMAL",
    "UNIT_ROUNDOFF",
    "Case",
    "check_patterns",
    "coefficients",
    "make",
    "positions",
    "representable",
    "round_to",
    "seed",
    "select",
    "where_name",
]

#: The dtypes an adapter may compute in; each picks the tolerance of a case.
DTYPES = ("float64", "float32", "bfloat16", "float16")
#: Near positions: a spread of 0..4095 holding 255, 256, 257 (bf16 rounds 257 to 256) and
#: 2047, 2048, 2049 (fp16 rounds 2049 to 2048).
NEAR = (0, 1, 2, 3, 10, 100, 255, 256, 257, 1000, 2047, 2048, 2049, 4095)
#: Far positions: where float32 angles are off by up to 1e-1.
FAR = (100_000, 100_001, 1_000_000, 1_000_001)

#: The unit roundoff of each dtype: what rounding a result once to it may cost, relatively.
UNIT_ROUNDOFF = types.MappingProxyType(
    {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
)
#: The smallest normal number of each dtype: below it a value is rounded to a fixed step, so
#: the output term takes at least this magnitude.
SMALLEST_NORMAL = types.MappingProxyType(
    {"float64": 2.0**-1022, "float32": 2.0**-126, "bfloat16": 2.0**-126, "float16": 2.0**-14}
)
ARITHMETIC_UNITS = 8.0
ANGLE_UNITS = 16.0

#: The input arrays passed positionally, per operation (others are keyword arguments).
INPUTS = types.MappingProxyType(
    {
        "table": ("positions",),
        "frequencies": (),
        "rotate": ("q", "k", "positions"),
        "bias": ("query_positions", "key_positions"),
    }
)
#: The outputs of each operation, in the order an adapter returns them.
OUTPUTS = types.MappingProxyType(
    {
        "table": ("table",),
        "frequencies": ("inv_freq", "attention_scale"),
        "rotate": ("q", "k"),
        "bias": ("bias",),
    }
)


def coefficients(dtype: str, *, far: bool) -> dict[str, float]:
    """The tolerance model's three coefficients for an adapter computing in ``dtype``:
    ``{"output": ..., "arithmetic": ..., "angle": ..., "smallest_normal": ...}`` (see the
    module's docstring)."""
    if dtype not in DTYPES:
        raise PosEncError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, got {dtype!r}")
    compute = UNIT_ROUNDOFF["float64" if dtype == "float64" else "float32"]
    angles = UNIT_ROUNDOFF["float64"] if far else compute
    return {
        "output": UNIT_ROUNDOFF[dtype],
        "arithmetic": ARITHMETIC_UNITS * compute,
        "angle": ANGLE_UNITS * angles,
        "smallest_normal": SMALLEST_NORMAL[dtype],
    }


#: The fields of a :class:`Case` that are mappings.
_MAPPINGS = (
    "convention",
    "parameters",
    "inputs",
    "expected",
    "magnitude",
    "angle_bound",
    "tolerances",
)


@dataclasses.dataclass(frozen=True, eq=False)
class Case:
    """One golden case: what to give an adapter and what it must return.

    Attributes:
        name: ``family.detail@near`` (unique in a set).
        family, operation: which adapters run it (:class:`~posenc.conformance.Adapter`).
        convention: the conventions it is written in (``{"layout": "half"}``); an adapter
            claiming another value of a key does not run it.
        parameters: JSON values given to the adapter: ``dim`` positionally for tables and
            frequencies, the rest as keyword arguments.
        inputs: arrays; those of :data:`INPUTS` positionally, the others as keyword
            arguments.
        expected: the float64 outputs (:data:`OUTPUTS`).
        magnitude, angle_bound: per output, arrays broadcastable to it (the tolerance
            model's terms).
        far: whether its positions are far (float64 angles required).
        doc: one line saying what it checks.
        tolerances: per dtype, the tolerance model's coefficients (:func:`coefficients`).
    """

    name: str
    family: str
    operation: str
    convention: Mapping[str, Any]
    parameters: Mapping[str, Any]
    inputs: Mapping[str, np.ndarray]
    expected: Mapping[str, np.ndarray]
    magnitude: Mapping[str, np.ndarray]
    angle_bound: Mapping[str, np.ndarray]
    far: bool
    doc: str
    tolerances: Mapping[str, Mapping[str, float]]

    def __post_init__(self) -> None:
        for field in _MAPPINGS:  # each a read-only copy, whoever built the case
            object.__setattr__(self, field, types.MappingProxyType(dict(getattr(self, field))))

    def coefficients(self, dtype: str) -> Mapping[str, float]:
        """The tolerance coefficients of this case for ``dtype`` (:func:`coefficients`)."""
        if dtype not in self.tolerances:
            raise PosEncError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, got {dtype!r}")
        return self.tolerances[dtype]

    def tolerance(self, key: str, dtype: str) -> np.ndarray:
        """The tolerance of each element of output ``key`` for an adapter in ``dtype``.

        Shape: ``expected[key].shape``.
        """
        c = self.coefficients(dtype)
        expected = self.expected[key]
        finite = np.where(np.isfinite(expected), np.abs(expected), 0.0)
        tol = (
            c["output"] * np.maximum(finite, c["smallest_normal"])
            + c["arithmetic"] * self.magnitude[key]
            + c["angle"] * self.angle_bound[key]
        )
        return np.broadcast_to(tol, expected.shape)

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments an adapter gets: the parameters but ``dim`` of a table or
        frequencies, and the input arrays not passed positionally."""
        out = {k: v for k, v in self.parameters.items() if not self._positional_dim(k)}
        positional = INPUTS[self.operation]
        out.update({k: v for k, v in self.inputs.items() if k not in positional})
        return out

    def args(self) -> tuple[Any, ...]:
        """The positional arguments an adapter gets."""
        arrays = tuple(self.inputs[k] for k in INPUTS[self.operation])
        if self.operation in ("table", "frequencies"):
            return (*arrays, self.parameters["dim"])
        return arrays

    def _positional_dim(self, key: str) -> bool:
        return key == "dim" and self.operation in ("table", "frequencies")


def check_patterns(patterns: Any, name: str = "cases") -> list[str] | None:
    """``patterns`` as a list of ``fnmatch`` globs (None stays None), refused in one line
    naming ``name`` unless it is None, a non-empty string or a non-empty sequence (list or
    tuple) of them.

    Raises:
        PosEncError: anything else (a number, bytes, an empty string or sequence).
    """
    if patterns is None:
        return None
    if isinstance(patterns, str):
        patterns = [patterns]
    elif not isinstance(patterns, (list, tuple)):
        raise PosEncError(
            f"{name} must be None, a glob string or a non-empty list of glob strings, "
            f"got {_show(patterns)}"
        )
    if not patterns:
        raise PosEncError(
            f"{name} must be None, a glob string or a non-empty list of glob strings, "
            f"got {patterns!r}"
        )
    for p in patterns:
        if not isinstance(p, str) or not p.strip():
            raise PosEncError(f"{name} must be non-empty glob strings, got {_show(p)}")
    return list(patterns)


def _show(value: Any) -> str:
    """``repr(value)``, cut to one short line."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 80 else text[:77] + "..."


def select(cases: Sequence[Case], patterns: Any, name: str = "cases") -> list[Case]:
    """The cases whose name matches one of the ``fnmatch`` ``patterns`` (all when None);
    messages call the patterns ``name`` (the caller's parameter).

    Raises:
        PosEncError: patterns that are not None, a glob string or a non-empty sequence of
            them (:func:`check_patterns`), or patterns matching no case.
    """
    globs = check_patterns(patterns, name)
    if globs is None:
        return list(cases)
    picked = [c for c in cases if any(fnmatch.fnmatchcase(c.name, p) for p in globs)]
    if not picked:
        raise PosEncError(
            f"{name} {', '.join(map(repr, globs))} match no case (names look like "
            f"{cases[0].name!r}; try '*@far' or 'rope.*')"
            if cases
            else f"{name} {', '.join(map(repr, globs))} match no case: the set is empty"
        )
    return picked


# --- helpers the builders share -------------------------------------------------------------


def representable(rng: np.random.Generator, shape: tuple[int, ...], scale: int = 64) -> np.ndarray:
    """Seeded values ``k / scale`` with ``|k| <= 255``: 8 significant bits, so exact in
    bfloat16 and float16 (an adapter that casts its inputs loses nothing).

    Shape: ``shape`` float64.
    """
    return rng.integers(-255, 256, size=shape).astype(np.float64) / scale


def seed(name: str) -> int:
    """A seed from a name (stable across runs and interpreters, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def positions(far: bool) -> np.ndarray:
    """:data:`FAR` or :data:`NEAR` as int64. Shape: ``[n]``."""
    return np.array(FAR if far else NEAR, dtype=np.int64)


def where_name(far: bool) -> str:
    return "@far" if far else "@near"


def make(
    name: str,
    family: str,
    operation: str,
    *,
    convention: Mapping[str, Any],
    parameters: Mapping[str, Any],
    inputs: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    magnitude: Mapping[str, Any] | None = None,
    angle_bound: Mapping[str, Any] | None = None,
    far: bool = False,
    doc: str,
) -> Case:
    """A :class:`Case`, its arrays float64 (positions int64), read-only, missing bounds
    zeros (``magnitude`` defaults to ``|expected|``)."""

    def frozen(a: Any, dtype: Any = np.float64) -> np.ndarray:
        arr = np.array(a, dtype=dtype)
        arr.flags.writeable = False
        return arr

    def kind(key: str, a: Any) -> Any:
        return np.int64 if "positions" in key or np.asarray(a).dtype.kind in "iu" else np.float64

    exp = {k: frozen(v) for k, v in expected.items()}
    mag = dict(magnitude or {})
    ang = dict(angle_bound or {})
    return Case(
        name=name,
        family=family,
        operation=operation,
        convention=convention,
        parameters=parameters,
        inputs={k: frozen(v, kind(k, v)) for k, v in inputs.items()},
        expected=exp,
        magnitude={
            k: frozen(mag.get(k, np.where(np.isfinite(v), np.abs(v), 0.0))) for k, v in exp.items()
        },
        angle_bound={k: frozen(ang.get(k, 0.0)) for k in exp},
        far=far,
        doc=doc,
        tolerances={d: coefficients(d, far=far) for d in DTYPES},
    )


def round_to(x: Any, dtype: str) -> np.ndarray:
    """``x`` rounded to the nearest ``"bfloat16"`` or ``"float16"`` value (ties to even),
    returned as float64 (bfloat16 through float32's bits: NumPy has no bfloat16).

    Shape: unchanged.
    """
    x = np.asarray(x, dtype=np.float64)
    if dtype == "float16":
        with np.errstate(over="ignore"):  # past 65504: inf, as float16 gives
            return x.astype(np.float16).astype(np.float64)
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)
