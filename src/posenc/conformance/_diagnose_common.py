"""What the diagnosis's hypotheses share: the match of an output against an alternative
expectation (the case's tolerance model, with the alternative's own bounds and, far, float32
angles allowed), the words for positions that collide, and the fitted base. NumPy and the
standard library only."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from posenc.conformance.cases import UNIT_ROUNDOFF, Case

__all__ = [
    "SHORT",
    "Alternative",
    "Change",
    "Outputs",
    "equal_rows",
    "fitted_bases",
    "shifts",
    "within",
]

Outputs = Mapping[str, np.ndarray]
#: An alternative expectation: output arrays by key, and optionally, per output ``key``, its
#: own ``"key:magnitude"`` and ``"key:angle"`` bounds (the tolerance model's terms for the
#: alternative's pairing, angles and scale; the case's are used where absent) and a
#: ``"key:extra"`` tolerance (a rounding the alternative cannot tell the direction of).
Alternative = dict[str, np.ndarray]
#: A named change to the convention: the words, and the keyword arguments that give the
#: operation's builder the alternative.
Change = tuple[str, dict[str, Any]]
SHORT = {"bfloat16": "bf16", "float16": "fp16"}


def within(
    case: Case, outputs: Outputs, alt: Mapping[str, np.ndarray], dtype: str, *, far32: bool
) -> bool:
    """Whether ``outputs`` match ``alt`` within the case's tolerance model for ``dtype``: the
    output rounding taken on ``alt``'s values, the magnitude and angle bounds ``alt``'s own
    (its pairing, angles and scale) where it gives them. ``far32``: angles allowed float32's
    precision (the near model) at far positions too."""
    c = dict(case.coefficients(dtype))
    if far32:
        c["angle"] = max(c["angle"], 16.0 * UNIT_ROUNDOFF["float32"])
    for key, got in outputs.items():
        if key not in alt:
            continue
        want = np.asarray(alt[key], dtype=np.float64)
        if want.shape != got.shape:
            return False
        magnitude = alt.get(f"{key}:magnitude", case.magnitude[key])
        angle = alt.get(f"{key}:angle", case.angle_bound[key])
        both_inf = np.isinf(want) & (got == want)
        finite = np.where(np.isfinite(want), np.abs(want), 0.0)
        tol = (
            c["output"]
            * np.maximum(np.maximum(finite, np.abs(case.expected[key])), c["smallest_normal"])
            + c["arithmetic"] * np.maximum(magnitude, case.magnitude[key])
            + c["angle"] * np.maximum(angle, case.angle_bound[key])
            + alt.get(f"{key}:extra32" if far32 else f"{key}:extra", 0.0)
        )
        err = np.abs(np.where(both_inf, 0.0, got) - np.where(both_inf, 0.0, want))
        if not np.all(err <= tol):
            return False
    return True


def equal_rows(values: np.ndarray, pos: np.ndarray) -> str:
    """``": positions 256 and 257 give equal rows"`` for the first two neighbouring
    positions of ``pos`` whose ``values`` (rounded positions or angles) are equal."""
    for a in range(len(pos) - 1):
        if pos[a] != pos[a + 1] and np.array_equal(values[a], values[a + 1]):
            return f": positions {int(pos[a])} and {int(pos[a + 1])} give equal rows"
    return ""


def shifts(words: str) -> list[Change]:
    """Positions off by one either way (``{0}`` in ``words``: ``+ 1`` / ``- 1``); the
    builder takes ``shift``."""
    return [
        (f"positions off by one: {words.format(f'{sign} 1')}", {"shift": s})
        for s, sign in ((1, "+"), (-1, "-"))
    ]


def fitted_bases(
    case: Case, outputs: Outputs, build: Callable[..., Alternative]
) -> Iterator[Change]:
    """The base that fits the output best (a log grid, then golden-section), rounded to 3
    and 6 digits and unrounded: each a change ``{"base": ...}``, named when it matches."""
    base = float(case.parameters["base"])

    def error(b: float) -> float:
        want = build(case, base=b)
        return max(float(np.max(np.abs(outputs[k] - want[k]))) for k in outputs if k in want)

    grid = np.exp(np.linspace(math.log(10.0), math.log(1e8), 141))
    errors = [error(float(b)) for b in grid]
    best = int(np.argmin(errors))
    lo = math.log(grid[max(best - 1, 0)])
    hi = math.log(grid[min(best + 1, len(grid) - 1)])
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if error(math.exp(a)) < error(math.exp(b)):
            hi = b
        else:
            lo = a
    fitted = math.exp((lo + hi) / 2)
    for candidate in (float(f"{fitted:.3g}"), float(f"{fitted:.6g}"), fitted):
        if abs(candidate - base) > 1e-9 * base:
            yield f"base {candidate:g} where the convention has {base:g}", {"base": candidate}
