"""What a failing output gets wrong, in words: named changes to the convention, each an
alternative expectation computed from :mod:`posenc.reference` with that change; the first
the output matches (within the case's tolerance model, with the alternative's own bounds)
names the deviation.

The changes are tried simplest first: one change of convention (the other layout or
pairing, sin and cos swapped, positions off by one, the scaling ignored, ``dynamic`` or
``ntk`` a uniform factor (measured), the attention scale missing or squared, xPos's scale
centred (measured), the other ALiBi or T5 direction, ALiBi's slopes one geometric sequence);
one loss of precision (positions, angles, or cos and sin rounded to bf16 / fp16, or a
table's whole formula evaluated in it); at far positions, float32 angles alone; then a
change with a loss of precision; then either with float32 angles at far positions; last, a
fitted base. When none explains the output: where it departs (positions, channels).
Tables: :mod:`posenc.conformance._diagnose_tables`; rotations:
:mod:`posenc.conformance._diagnose_rotations`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from posenc import reference
from posenc.conformance._diagnose_common import (
    SHORT,
    Alternative,
    Change,
    Outputs,
    equal_rows,
    fitted_bases,
    within,
)
from posenc.conformance._diagnose_rotations import (
    build_rotation,
    rotate_changes,
    rotate_precisions,
    scaling_changes,
)
from posenc.conformance._diagnose_tables import (
    build_table,
    layout_words,
    shape_words,
    table_changes,
    table_precisions,
)
from posenc.conformance.cases import Case, round_to

__all__ = ["diagnose", "layout_words", "round_to", "shape_words"]

Hypothesis = tuple[str, Callable[[], Alternative | None]]

# --- frequencies and biases -------------------------------------------------------------------


def _build_frequencies(
    case: Case, *, scaling: Any = "same", attention: float | None = None, base: float | None = None
) -> Alternative:
    p = case.parameters
    scaling = p["scaling"] if scaling == "same" else scaling
    base = p["base"] if base is None else base
    inv, s = reference.rope_frequencies(p["dim"], base=base, scaling=scaling, seq_len=p["seq_len"])
    return {"inv_freq": inv, "attention_scale": np.array(s if attention is None else attention)}


def _frequency_changes(case: Case, outputs: Outputs) -> list[Change]:
    """The scaling's changes, ``F`` of a uniform factor measured on inv_freq."""
    default, _ = reference.rope_frequencies(case.parameters["dim"], base=case.parameters["base"])
    got = outputs["inv_freq"]
    measured = float(np.median(default / got)) if np.all(got > 0) else None
    return scaling_changes(case, measured)


def _bias_hypotheses(case: Case, outputs: Outputs, dtype: str) -> Iterator[Hypothesis]:
    qp, kp = case.inputs["query_positions"], case.inputs["key_positions"]
    p = case.parameters
    if case.family == "alibi":
        heads = p["heads"]

        def alibi(q=qp, k=kp, causal=p["causal"], slopes=None):
            s = reference.alibi_slopes(heads) if slopes is None else slopes
            return {"bias": reference.alibi_bias(q, k, s, causal=causal)}

        flip = "symmetric (-m |i - j|) where the convention is causal (-m (i - j))"
        if not p["causal"]:
            flip = "causal (-m (i - j)) where the convention is symmetric (-m |i - j|)"
        yield flip, lambda: alibi(causal=not p["causal"])
        geometric = np.array([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
        yield (
            f"slopes one geometric sequence 2^(-8h/{heads}) where the paper interleaves those of "
            "the powers of two around it",
            lambda: alibi(slopes=geometric),
        )
        shift = lambda q, k: alibi(q=q, k=k)  # noqa: E731
    elif case.family == "t5":

        def t5(q=qp, k=kp, causal=p["causal"]):
            return {
                "bias": reference.t5_relative_bias(
                    q, k, case.inputs["weights"], causal=causal, max_distance=p["max_distance"]
                )
            }

        yield (
            (
                "bidirectional buckets where the convention is causal"
                if p["causal"]
                else "causal buckets where the convention is bidirectional"
            ),
            lambda: t5(causal=not p["causal"]),
        )
        shift = lambda q, k: t5(q=q, k=k)  # noqa: E731
    else:
        return
    for s in (1, -1):
        sign = "+" if s > 0 else "-"
        yield (
            f"positions off by one: query p taken as p {sign} 1",
            functools.partial(shift, qp + s, kp),
        )
    for low in ("bfloat16", "float16"):
        rq, rk = round_to(qp, low), round_to(kp, low)
        yield (
            f"positions rounded in {SHORT[low]}"
            + equal_rows(np.concatenate([rq, rk]), np.concatenate([qp, kp])),
            functools.partial(shift, rq, rk),
        )


# --- where it departs ----------------------------------------------------------------------


def _fallback(case: Case, outputs: Outputs, dtype: str) -> str:
    """Where the output departs: the positions (rows) and channels (last axis) over tolerance."""
    parts = []
    for key, got in outputs.items():
        expected = case.expected[key]
        if expected.ndim == 0:
            if abs(float(got) - float(expected)) > float(case.tolerance(key, dtype)):
                parts.append(
                    f"{key} {float(got):.6g} where the reference has {float(expected):.6g}"
                )
            continue
        finite = np.isfinite(expected)
        err = np.where(finite, np.abs(got - np.where(finite, expected, 0.0)), 0.0)
        over = err > case.tolerance(key, dtype)
        if not over.any():
            continue
        if case.operation in ("table", "rotate"):
            pos = case.inputs["positions"]
            rows = np.nonzero(over.reshape(over.shape[0], -1).any(axis=1))[0]
            labels = [str(pos[r].tolist()) for r in rows]
            tail = pos.ndim == 1 and len(rows) and rows[0] + len(rows) == len(pos)
            where = (
                f"from position {labels[0]} on" if tail else f"at positions {', '.join(labels[:6])}"
            )
            channels = np.nonzero(over.reshape(-1, over.shape[-1]).any(axis=0))[0]
            prefix = f"{key} " if case.operation == "rotate" else ""
            parts.append(
                f"{prefix}differs from the reference {where}, in channels {_ranges(channels)}"
            )
        else:
            flat = np.nonzero(over.reshape(-1))[0]
            parts.append(f"{key} differs from the reference at {len(flat)} of {over.size} elements")
    return "; ".join(parts)


def _ranges(values: np.ndarray) -> str:
    """``0-31, 40`` for the sorted integers ``values``."""
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


def _search(case: Case, outputs: Outputs, dtype: str) -> str | None:
    """The words of the simplest change (and loss of precision) the output matches."""
    op, far32 = case.operation, case.far and dtype != "float64"
    if op == "table" and case.family == "sinusoidal":
        build: Callable[..., Alternative] = build_table
        changes, precisions = table_changes(case), table_precisions(case)
    elif op == "rotate" and case.family in ("rope", "mrope", "xpos"):
        build = build_rotation
        changes, precisions = rotate_changes(case, outputs), rotate_precisions(case)
    elif op == "frequencies" and case.family == "rope":
        build, changes, precisions = _build_frequencies, _frequency_changes(case, outputs), []
    elif op == "bias":
        return _first(case, outputs, dtype, _bias_hypotheses(case, outputs, dtype))
    else:
        return _float32_angles(case, outputs, dtype) if far32 else None
    combined = [(f"{w1}, and {w2}", {**k1, **k2}) for w1, k1 in changes for w2, k2 in precisions]
    tiers: list[tuple[list[Change], bool]] = [(changes + precisions, False)]
    if far32:
        tiers += [([], True)]
    tiers += [(combined, False)]
    if far32:
        tiers += [(changes + precisions + combined, True)]
    for tier, loose in tiers:
        if loose and not tier:
            words = _float32_angles(case, outputs, dtype)
            if words:
                return words
        for words, kwargs in tier:
            if _matches(case, outputs, dtype, build, kwargs, loose):
                return words + (", and angles computed in float32" if loose else "")
    if "base" in case.parameters and (op != "frequencies" or not changes):
        for words, kwargs in fitted_bases(case, outputs, build):
            for loose in (False, True) if far32 else (False,):
                if _matches(case, outputs, dtype, build, kwargs, loose):
                    return words + (", and angles computed in float32" if loose else "")
    return None


def _matches(case, outputs, dtype, build, kwargs, loose) -> bool:
    with np.errstate(all="ignore"):
        try:
            alt = build(case, **kwargs)
        except (ValueError, KeyError, ZeroDivisionError, OverflowError):
            return False
        return within(case, outputs, alt, dtype, far32=loose)


def _first(case, outputs, dtype, hypotheses: Iterator[Hypothesis]) -> str | None:
    for words, alt in hypotheses:
        with np.errstate(all="ignore"):
            try:
                expected = alt()
            except (ValueError, KeyError, ZeroDivisionError, OverflowError):
                continue
            if expected is not None and within(case, outputs, expected, dtype, far32=False):
                return words
    return None


def _float32_angles(case: Case, outputs: Outputs, dtype: str) -> str | None:
    """Float32 angles: the output within the near model (float32 angles) though not the far;
    the words give the error at the farthest position."""
    if case.operation not in ("table", "rotate"):
        return None
    if not within(case, outputs, case.expected, dtype, far32=True):
        return None
    pos = case.inputs["positions"]
    top = int(np.max(pos))
    rows = pos == top if pos.ndim == 1 else np.zeros(len(pos), bool)
    key = "table" if case.operation == "table" else "q"
    got, want = outputs[key][rows], case.expected[key][rows]
    err = float(np.max(np.abs(got - want))) if rows.any() else 0.0
    return f"angles computed in float32: the error grows with position, {err:.2g} at position {top}"


def diagnose(case: Case, outputs: Outputs, dtype: str) -> tuple[str | None, str]:
    """``(deviation, detail)`` for a failing output: the words of the simplest named change
    it matches (None when none does), and where it departs from the reference.

    ``outputs``: the adapter's arrays by output key, float64 (as :func:`check` compared them).
    """
    return _search(case, outputs, dtype), _fallback(case, outputs, dtype)
