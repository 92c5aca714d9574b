"""The diagnosis of a sinusoidal table: the other layouts, sin and cos swapped, positions
off by one, another base (the changes), and positions rounded to bf16 / fp16 or the whole
formula evaluated in it (the precisions); and the words for a table of the wrong width
(odd depth). NumPy and the standard library only."""

from __future__ import annotations

from typing import Any

import numpy as np

from posenc import reference
from posenc.conformance._diagnose_common import SHORT, Alternative, Change, equal_rows, shifts
from posenc.conformance._tables import SINUSOIDAL_LAYOUTS, sinusoidal_rates
from posenc.conformance.cases import Case, round_to

__all__ = ["build_table", "layout_words", "shape_words", "table_changes", "table_precisions"]

_LAYOUT_WORDS = {  # "convention>output": the words
    "interleaved>half": "[sin | cos] concatenated where the convention interleaves",
    "half>interleaved": "sin and cos interleaved where the convention concatenates [sin | cos]",
    "half>flax": "rates log-spaced over d/2 - 1 (the Flax convention) where the convention "
    "has exponent 2i/d",
    "flax>half": "exponent 2i/d where the convention log-spaces the rates over d/2 - 1",
    "interleaved>flax": "[sin | cos] concatenated with rates log-spaced over d/2 - 1 (the "
    "Flax convention) where the convention interleaves with exponent 2i/d",
    "flax>interleaved": "sin and cos interleaved with exponent 2i/d where the convention "
    "concatenates [sin | cos] with rates log-spaced over d/2 - 1",
}


def layout_words(convention: str, output: str) -> str:
    """The deviation of a sinusoidal table in layout ``output`` checked against
    ``convention`` (``"[sin | cos] concatenated where the convention interleaves"``)."""
    return _LAYOUT_WORDS[f"{convention}>{output}"]


def _low_rates(dim: int, layout: str, base: float, low: str, form: str) -> np.ndarray:
    """Each channel's rate as code in ``low`` precision computes it, every step rounded:
    ``(1/base) ** (k / n)`` (``form="min"``) or ``base ** -(k / n)`` (``"base"``), ``k / n``
    the exponent (``2 (c // 2) / d`` interleaved, ``2i / d`` half, ``i / (d/2 - 1)`` flax).

    Shape: ``[dim]``."""
    exact = sinusoidal_rates(dim, layout, base)
    with np.errstate(divide="ignore"):
        k_over_n = np.where(exact > 0, -np.log(exact) / np.log(base), 0.0)
    if layout == "interleaved":
        k, n = 2.0 * (np.arange(dim) // 2), float(dim)
    elif layout == "half":
        first = (dim + 1) // 2
        c = np.arange(dim)
        k, n = 2.0 * np.where(c < first, c, c - first), float(dim)
    else:
        k, n = np.rint(k_over_n * (dim // 2 - 1)), float(dim // 2 - 1)
    e = round_to(round_to(k, low) / round_to(n, low), low).astype(np.float32)
    if form == "min":
        rate = np.power(np.float32(round_to(1.0 / base, low)[()]), e)
    else:
        rate = np.power(np.float32(round_to(base, low)[()]), -e)
    return np.where(exact > 0, round_to(rate.astype(np.float64), low), 0.0)


def build_table(
    case: Case,
    *,
    layout: str | None = None,
    order: str = "sin_cos",
    base: float | None = None,
    shift: int = 0,
    pos_low: str | None = None,
    low: str | None = None,
    form: str = "min",
) -> Alternative:
    """The case's table with one or more conventions changed: ``pos_low`` rounds the
    positions to that dtype; ``low`` evaluates the formula in it (positions, rates and angles
    each rounded, :func:`_low_rates`' ``form``).

    Shape: ``{"table": [n, dim], "table:angle": [n, dim]}``."""
    pos = case.inputs["positions"] + shift
    dim = case.parameters["dim"]
    base = float(case.parameters["base"] if base is None else base)
    layout = layout or case.convention["layout"]
    if pos_low or low:
        pos = round_to(pos, pos_low or low)  # type: ignore[arg-type]
    rates = sinusoidal_rates(dim, layout, base)
    angle = np.abs(np.asarray(pos, np.float64))[:, None] * rates[None, :]
    if low:
        angles = round_to(np.asarray(pos)[:, None] * _low_rates(dim, layout, base, low, form), low)
        sin_first = np.asarray(reference.sinusoidal_table(np.zeros(1), dim, layout=layout))[0] == 0
        if order != "sin_cos":
            sin_first = ~sin_first
        zero = rates == 0
        table = np.where(sin_first, np.sin(angles), np.cos(angles))
        table = np.where(
            zero, reference.sinusoidal_table(pos, dim, base=base, layout=layout), table
        )
    else:
        table = reference.sinusoidal_table(pos, dim, base=base, layout=layout, order=order)
    return {"table": table, "table:angle": angle}


def table_changes(case: Case) -> list[Change]:
    """The other layouts, sin and cos swapped (alone and with each other layout), positions
    off by one."""
    layout = case.convention["layout"]
    others = [other for other in SINUSOIDAL_LAYOUTS if other != layout]
    changes: list[Change] = [(layout_words(layout, o), {"layout": o}) for o in others]
    changes.append(("sin and cos swapped: cos where the convention has sin", {"order": "cos_sin"}))
    for o in others:
        words = layout_words(layout, o) + ", and cos where the convention has sin"
        changes.append((words, {"layout": o, "order": "cos_sin"}))
    return changes + shifts("row p holds position p {0}")


def table_precisions(case: Case) -> list[Change]:
    """Positions rounded to bf16 / fp16; the whole formula evaluated in it (two ways of
    writing the rates)."""
    pos = case.inputs["positions"]
    changes: list[Change] = []
    for low in ("bfloat16", "float16"):
        collide = equal_rows(round_to(pos, low), pos)
        short = SHORT[low]
        changes.append(
            (f"positions rounded in {short} before the sin and cos{collide}", {"pos_low": low})
        )
        for form in ("min", "base"):
            words = (
                f"positions, rates and angles rounded in {short} before the sin and cos{collide}"
            )
            changes.append((words, {"low": low, "form": form}))
    return changes


def shape_words(case: Case, result: Any, dtype: str) -> str | None:
    """Why a sinusoidal table of odd ``dim`` came back one channel wide: ``ceil(d/2)`` rates
    each giving a sin and a cos column (and, for ``half``, whether dropping the last cosine
    gives the convention's table). None for any other shape error."""
    if case.family != "sinusoidal" or case.operation != "table":
        return None
    dim = int(case.parameters["dim"])
    try:
        table = np.asarray(result, dtype=np.float64)
    except (TypeError, ValueError, RuntimeError):  # a tensor NumPy cannot read
        return None
    if dim % 2 == 0 or table.shape != (len(case.inputs["positions"]), dim + 1):
        return None
    rates = (dim + 1) // 2
    words = f"odd depth: ceil({dim}/2) = {rates} rates, a sin and a cos each, {dim + 1} channels"
    expected = case.expected["table"]
    if np.all(np.abs(table[:, :dim] - expected) <= case.tolerance("table", dtype)):
        words += f" (the first {dim} are the convention's)"
    return words
