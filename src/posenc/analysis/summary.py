"""All four properties of one encoding at once, and the one-line summary the property tables
of ``posenc inspect`` and ``posenc report`` show."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from posenc import registry
from posenc._errors import PosEncError
from posenc.analysis._encodings import check_count, check_dtypes, resolve_encoding
from posenc.analysis._results import Result
from posenc.analysis.properties import (
    Boundedness,
    EncodingSpec,
    Uniqueness,
    boundedness,
    uniqueness,
)
from posenc.analysis.relative import Decay, ShiftStructure, decay, shift_structure

__all__ = ["SUMMARY_COLUMNS", "Properties", "properties"]

# key, header, what it means (shown under the property tables)
SUMMARY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("encoding", "encoding", "registry name"),
    ("kind", "kind", "additive, rotary, bias or none"),
    ("bounded", "bounded", "the norm stops growing over the range (bias: per distance)"),
    ("max_ratio", "max norm ratio", "largest norm / reference (token norm; rotary: 1; bias: 1)"),
    ("first_swamping", "swamps at", "first position (bias: distance) above the swamp ratio"),
    ("unique", "unique", "no two positions (bias: distances) collide"),
    ("min_distance", "min distance", "smallest distance between two encodings / their rms norm"),
    ("collisions", "collisions", "pairs within rtol of each other"),
    (
        "shift_residual",
        "shift residual",
        "largest relative residual of PE(p+k) = M_k PE(p) (n/a: a bias, or too few positions)",
    ),
    ("offset_only", "offset only", "similarity of p and p+k depends on k alone"),
    ("decay_mid", "sim @ mid", "normalized similarity (bias: mean bias) at half the distance"),
    ("decay_far", "sim @ far", "normalized similarity (bias: mean bias) at the largest distance"),
)


@dataclasses.dataclass(frozen=True)
class Properties(Result):
    """Boundedness, uniqueness, shift structure and decay of one encoding."""

    encoding: str
    kind: str
    config: dict[str, Any]
    boundedness: Boundedness
    uniqueness: Uniqueness
    shift: ShiftStructure
    decay: Decay

    def _check(self) -> None:
        """``config`` builds the encoding ``encoding`` of kind ``kind`` (names, keys and
        values checked by the registry and the class, a fixed seed for learned tables)."""
        if "name" not in self.config:
            raise PosEncError(
                f"config must hold the encoding's 'name', got keys {sorted(self.config)}"
            )
        cls = registry.class_of(self.config)
        accepted, _ = registry.parameters(cls)
        unknown = sorted(set(self.config) - accepted - {"name"})
        if unknown:
            raise PosEncError(
                f"config of encoding {cls.name!r} has unknown keys {unknown}; allowed: "
                f"{sorted(accepted)}"
            )
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # a moved name: said once
            enc = registry.build(self.config)
        if self.encoding not in (cls.name, enc.name) or self.kind != enc.kind:
            raise PosEncError(
                f"encoding and kind must be those config builds ({cls.name!r}, {enc.kind!r}), "
                f"got {self.encoding!r}, {self.kind!r}"
            )

    def summary(self) -> dict[str, Any]:
        """One flat row of the headline numbers, keyed as :data:`SUMMARY_COLUMNS`."""
        curve = (
            self.decay.normalized if self.decay.normalized is not None else self.decay.similarity
        )
        residuals = self.shift.linear_map_residuals
        u = self.uniqueness
        return {
            "encoding": self.encoding,
            "kind": self.kind,
            "bounded": self.boundedness.bounded,
            "max_ratio": self.boundedness.max_ratio,
            "first_swamping": self.boundedness.first_swamping,
            "unique": u.unique,
            "min_distance": u.min_distance / u.scale if u.scale > 0 else 0.0,
            "collisions": u.num_collisions,
            "shift_residual": (
                max(residuals)
                if residuals is not None and self.shift.linear_map_determined
                else None
            ),
            "offset_only": self.shift.dot_depends_only_on_offset,
            "decay_mid": curve[len(curve) // 2],
            "decay_far": curve[-1],
        }


def properties(
    encoding: EncodingSpec,
    positions: int = 512,
    *,
    shift_positions: int = 256,
    max_distance: int = 128,
    dtype: torch.dtype = torch.float32,
) -> Properties:
    """Measure every property of ``encoding`` with the defaults of each function.

    Args:
        encoding: an encoding module, registry name or config dict.
        positions: positions ``0..positions-1`` for boundedness and uniqueness (bias
            encodings: distances).
        shift_positions: positions of the shift-structure fit.
        max_distance: largest distance of the decay curve.
        dtype: dtype the encoding is evaluated in.

    Examples:
        >>> from posenc.analysis import properties
        >>> row = properties("sinusoidal", 64, shift_positions=32, max_distance=16).summary()
        >>> row["bounded"], row["unique"], row["offset_only"]
        (True, True, True)
    """
    check_dtypes(dtype)
    enc = resolve_encoding(encoding)
    positions = check_count("positions", positions, min=2)
    shift_positions = check_count("shift_positions", shift_positions, min=2)
    max_distance = check_count("max_distance", max_distance)
    return Properties(
        encoding=enc.name,
        kind=enc.kind,
        config=enc.to_config(),
        boundedness=boundedness(enc, positions, dtype=dtype),
        uniqueness=uniqueness(enc, positions, dtype=dtype),
        shift=shift_structure(enc, shift_positions, dtype=dtype),
        decay=decay(enc, max_distance, dtype=dtype),
    )
