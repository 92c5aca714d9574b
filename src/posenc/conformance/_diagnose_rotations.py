"""The diagnosis of a rotation (RoPE, M-RoPE, xPos): the other pairing, the other
placement of a partial rotation's pairs (leading or spread over the whole head), the scaling
ignored or ``dynamic`` / ``ntk`` a uniform factor (fitted), the attention scale missing or
applied twice, positions off by one, xPos's scale centred (fitted) (the changes), and
positions, angles or cos and sin rounded to bf16 / fp16 (the precisions). NumPy and the
standard library only."""

from __future__ import annotations

from typing import Any

import numpy as np

from posenc import reference
from posenc.conformance._diagnose_common import SHORT, Alternative, Change, Outputs, equal_rows
from posenc.conformance._diagnose_common import shifts as _shifts
from posenc.conformance._rotary import BASE, pair_channels, rotated_frequencies
from posenc.conformance._rotary import _bounds as rotation_bounds
from posenc.conformance.cases import UNIT_ROUNDOFF, Case, round_to

__all__ = [
    "build_rotation",
    "placement",
    "placement_changes",
    "rotate_changes",
    "rotate_precisions",
    "scaling_changes",
]

_PAIRS = {"half": "pairs halves", "interleaved": "pairs adjacent channels"}
_PLACES = {
    "leading": "rotates the leading channels",
    "whole_head": "spreads the pairs over the whole head",
}


def placement(case: Case) -> str:
    """Where the case's rotating pairs sit: ``"leading"`` (the first ``rotary_dim``
    channels; also every full-head case) or ``"whole_head"`` (p-RoPE's ``(i, i + d/2)``)."""
    return str(case.convention.get("partial", "leading"))


def placement_changes(case: Case) -> list[Change]:
    """The other placement of a partial rotation's pairs (builder keyword ``partial``):
    only where it moves channels, halves pairing fewer than the head's channels."""
    place = placement(case)
    partial_rotation = case.parameters["rotary_dim"] < case.inputs["q"].shape[-1]
    if not partial_rotation or case.convention["layout"] != "half" or place not in _PLACES:
        return []
    other = "leading" if place == "whole_head" else "whole_head"
    return [(f"{_PLACES[other]} where the convention {_PLACES[place]}", {"partial": other})]


def _frequencies(head_dim, rotary, scaling, seq_len, base):
    if base == BASE:
        return rotated_frequencies(head_dim, rotary, scaling, seq_len)
    span = head_dim if scaling and scaling.get("type") == "proportional" else rotary
    inv_freq, scale = reference.rope_frequencies(span, base=base, scaling=scaling, seq_len=seq_len)
    return inv_freq[: rotary // 2], scale


def _angles(case: Case, pos: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    p = case.parameters
    if p.get("sections") is not None:
        return reference.sectioned_angles(pos, inv_freq, p["sections"], p["section_layout"])
    return reference.rotary_angles(pos, inv_freq)


def _seq_len(case: Case, scaling: Any) -> int | None:
    kind = (scaling or {}).get("type", "default")
    top = int(np.max(case.inputs["positions"])) + 1  # the current length, as transformers
    return top if kind in ("dynamic", "longrope") else None


def build_rotation(
    case: Case,
    *,
    layout: str | None = None,
    shift: int = 0,
    base: float | None = None,
    scaling: Any = "same",
    attention: float | None = None,
    pos_low: str | None = None,
    angle_low: str | None = None,
    cos_low: str | None = None,
    arith_low: str | None = None,
    xpos_offset: int = 0,
    partial: str | None = None,
) -> Alternative:
    """The case's q and k rotated with one or more conventions changed: ``pos_low`` rounds
    the positions to that dtype, ``angle_low`` the angles, ``cos_low`` cos and sin,
    ``arith_low`` every step of the rotation (:func:`_rotate_low`); ``xpos_offset`` centres xPos's scale (``zeta^((p - offset) / scale_base)``);
    ``partial`` places the rotating pairs (``"leading"`` / ``"whole_head"``, default the
    case's). With each output its bounds (its pairing, placement, angles and scale).

    Shape: ``{"q": [seq, heads, dim], "k": ..., "q:magnitude": ..., "q:angle": ...}``."""
    q, k = case.inputs["q"], case.inputs["k"]
    pos = case.inputs["positions"] + shift
    if pos_low:
        pos = round_to(pos, pos_low)
    p = case.parameters
    layout = layout or case.convention["layout"]
    partial = partial or placement(case)
    scaling = p["scaling"] if scaling == "same" else scaling
    head_dim, rotary = q.shape[-1], p["rotary_dim"]
    base = p["base"] if base is None else base
    inv_freq, scale = _frequencies(head_dim, rotary, scaling, _seq_len(case, scaling), base)
    scale = scale if attention is None else attention
    angles = _angles(case, pos, inv_freq)
    if angle_low:
        angles = round_to(angles, angle_low)
    mult = np.full(angles.shape, scale)
    if arith_low:
        return _rotate_low(case, angles, scale, layout, partial, cos_low, arith_low)
    if cos_low:  # cos and sin rounded: the same rotation by another angle and length
        c, s = round_to(np.cos(angles), cos_low), round_to(np.sin(angles), cos_low)
        angles, mult = np.arctan2(s, c), mult * np.hypot(c, s)
    out: Alternative = {}
    for key, x, sign in (("q", q, 1.0), ("k", k, -1.0)):
        m = mult
        if p.get("xpos_scale_base") is not None:
            xpos_pos = case.inputs["positions"] - xpos_offset
            m = m * reference.xpos_scale(xpos_pos, rotary, sign * p["xpos_scale_base"])
        x4 = np.transpose(x, (1, 0, 2))[None]
        rotated = reference.apply_rotary(x4, angles, layout=layout, scale=m, partial=partial)
        out[key] = np.transpose(rotated[0], (1, 0, 2))
        bounds = rotation_bounds(x, angles, m, layout, partial)
        out[f"{key}:magnitude"], out[f"{key}:angle"] = bounds
    return out


def _rotate_low(
    case: Case,
    angles: np.ndarray,
    scale: float,
    layout: str,
    partial: str,
    cos_low: str | None,
    low: str,
) -> Alternative:
    """q and k rotated with every step rounded to ``low``, as code in that dtype does it:
    cos and sin (rounded to ``cos_low`` first), times the attention scale, then
    ``x_a cos - x_b sin`` and ``x_b cos + x_a sin``, each product and sum. A cos or sin
    within the angles' error of a rounding boundary may round either way: its pair's outputs
    get one step of it more (``"key:extra"``: the case's angle precision; ``"key:extra32"``:
    float32 angles).

    Shape: ``{"q": [seq, heads, dim], "k": ...}``, their bounds and extra tolerance."""
    c, s = np.cos(angles), np.sin(angles)
    ambiguous = {"": np.zeros(angles.shape, bool), "32": np.zeros(angles.shape, bool)}
    if cos_low:
        angle_units = case.coefficients("float32")["angle"]
        for tag, units in (("", angle_units), ("32", 16.0 * UNIT_ROUNDOFF["float32"])):
            near = units * np.abs(angles) + UNIT_ROUNDOFF["float32"]
            for v in (c, s):  # the distance to the boundary: half a step less the rounding
                step = np.ldexp(UNIT_ROUNDOFF[cos_low], np.frexp(np.abs(v))[1])
                ambiguous[tag] |= step / 2.0 - np.abs(v - round_to(v, cos_low)) <= near
        c, s = round_to(c, cos_low), round_to(s, cos_low)
    if scale != 1.0:
        c, s = round_to(c * round_to(scale, low), low), round_to(s * round_to(scale, low), low)
    one_step = {
        tag: 4.0 * UNIT_ROUNDOFF[cos_low or low] * np.where(a, abs(scale), 0.0)[:, None, :]
        for tag, a in ambiguous.items()
    }
    c, s = c[:, None, :], s[:, None, :]
    out: Alternative = {}
    for key in ("q", "k"):
        x = round_to(case.inputs[key], low)
        rotary = case.parameters["rotary_dim"]
        a, b = np.array(pair_channels(x.shape[-1], rotary, layout, partial)).T
        y = x.copy()
        y[..., a] = round_to(round_to(x[..., a] * c, low) - round_to(x[..., b] * s, low), low)
        y[..., b] = round_to(round_to(x[..., b] * c, low) + round_to(x[..., a] * s, low), low)
        out[key] = y
        for tag, step in one_step.items():
            extra = np.zeros_like(x)
            extra[..., a] = extra[..., b] = step * (np.abs(x[..., a]) + np.abs(x[..., b]))
            out[f"{key}:extra{tag}"] = extra
        full = np.full(angles.shape, scale)
        bounds = rotation_bounds(x, angles, full, layout, partial)
        out[f"{key}:magnitude"], out[f"{key}:angle"] = bounds
    return out


def _measured_factor(case: Case, outputs: Outputs) -> float | None:
    """The uniform factor ``F`` the output's angles are divided by, measured at the nearest
    position past 0 where every reference angle is under pi: ``median(theta_ref /
    theta_out)`` over the pairs (the angle of a pair read off q and its rotation)."""
    pos = case.inputs["positions"]
    if pos.ndim != 1 or case.parameters.get("sections") is not None:
        return None
    ref = _angles(
        case,
        pos,
        rotated_frequencies(case.inputs["q"].shape[-1], case.parameters["rotary_dim"], None, None)[
            0
        ],
    )
    rows = np.nonzero((pos > 0) & (np.max(ref, axis=1) < np.pi))[0]
    if not len(rows):
        return None
    r = rows[0]
    x, y = case.inputs["q"][r], outputs["q"][r]  # [heads, dim]
    layout, rotary = case.convention["layout"], case.parameters["rotary_dim"]
    pairs = pair_channels(x.shape[-1], rotary, layout, placement(case))
    a, b = np.array(pairs).T
    dot = np.sum(x[:, a] * y[:, a] + x[:, b] * y[:, b], axis=0)
    cross = np.sum(x[:, a] * y[:, b] - x[:, b] * y[:, a], axis=0)
    theta = np.arctan2(cross, dot)
    usable = (theta > 1e-3) & (ref[r] > 1e-3)
    if not usable.any():
        return None
    return float(np.median(ref[r][usable] / theta[usable]))


def _uniform_changes(case: Case, kind: str, scaling: Any, measured: float | None) -> list[Change]:
    """``dynamic`` / ``ntk`` as one factor ``F`` for every frequency: ``F`` measured (near)
    or one of the factors code uses (``factor``, ``factor^(d / (d - 2))``, and for
    ``dynamic`` the ratio at the current length, alone and so raised)."""
    factor = float(scaling["factor"])
    d = int(case.parameters.get("rotary_dim") or case.parameters["dim"])
    forms = [(factor, ""), (factor ** (d / (d - 2)), f" = {factor:g}^({d}/{d - 2})")]
    if kind == "dynamic":
        top = int(np.max(case.inputs.get("positions", np.zeros(1)))) + 1
        length = max(case.parameters.get("seq_len") or top, scaling["max_position"])
        ratio = factor * length / scaling["max_position"] - (factor - 1)
        at = f"the ratio at length {length}"
        forms += [
            (ratio, f" ({at})"),
            (ratio ** (d / (d - 2)), f" = {ratio:g}^({d}/{d - 2}), {at}"),
        ]
    if measured is not None:  # the named factor nearest the measured one, else that
        nearest = min(forms, key=lambda form: abs(form[0] - measured))
        close = abs(nearest[0] - measured) <= 0.02 * measured
        forms = [nearest, (measured, " (measured)")] if close else [(measured, " (measured)")]
    return [
        (
            f"`{kind}` is a uniform factor, not NTK: every frequency divided by {f:.4g}{formula}",
            {"scaling": {"type": "linear", "factor": f}},
        )
        for f, formula in forms
    ]


def scaling_changes(case: Case, measured: float | None = None) -> list[Change]:
    """The scaling ignored, ``dynamic`` / ``ntk`` as a uniform factor, the attention scale
    missing or applied twice (builder keywords ``scaling``, ``attention``)."""
    scaling = case.parameters["scaling"]
    kind = (scaling or {}).get("type", "default")
    if kind == "default":
        return []
    changes: list[Change] = [
        (f"the {kind} scaling is ignored: plain RoPE frequencies", {"scaling": None})
    ]
    if kind in ("dynamic", "ntk"):
        changes += _uniform_changes(case, kind, scaling, measured)
    if kind in ("yarn", "longrope"):
        words = f"the {kind} attention scale is missing (cos and sin not multiplied by it)"
        changes.append((words, {"attention": 1.0}))
        square = _expected_scale(case) ** 2
        changes.append((f"the {kind} attention scale is applied twice", {"attention": square}))
    return changes


def _expected_scale(case: Case) -> float:
    p = case.parameters
    if case.operation == "frequencies":
        return float(case.expected["attention_scale"])
    return rotated_frequencies(
        case.inputs["q"].shape[-1], p["rotary_dim"], p["scaling"], _seq_len(case, p["scaling"])
    )[1]


def _xpos_offset(case: Case, outputs: Outputs, layout: str) -> int | None:
    """Where the output's xPos scale is centred, read off q in the pairing ``layout``: each
    pair's length ratio is ``zeta_i^((p - offset) / scale_base)``; the first row's median
    exponent gives the offset (None when the pairs disagree: the wrong pairing)."""
    p = case.parameters
    x, y = case.inputs["q"][0], outputs["q"][0]  # [heads, dim]
    rotary = p["rotary_dim"]
    a, b = np.array(pair_channels(x.shape[-1], rotary, layout, placement(case))).T
    ratio = np.sqrt(np.sum(y[:, a] ** 2 + y[:, b] ** 2, 0) / np.sum(x[:, a] ** 2 + x[:, b] ** 2, 0))
    zeta = (2.0 * np.arange(rotary // 2) + 0.4 * rotary) / (1.4 * rotary)
    exponent = p["xpos_scale_base"] * np.log(ratio) / np.log(zeta)
    if np.ptp(exponent) > 0.5:
        return None
    return int(case.inputs["positions"][0]) - int(np.rint(np.median(exponent)))


def rotate_changes(case: Case, outputs: Outputs) -> list[Change]:
    """The other pairing, the other placement of a partial rotation's pairs, the scaling's
    changes, xPos centred, positions off by one."""
    layout = case.convention["layout"]
    other = "interleaved" if layout == "half" else "half"
    swap = f"{_PAIRS[other]} where the convention {_PAIRS[layout]}"
    changes: list[Change] = [(swap, {"layout": other}), *placement_changes(case)]
    kind = (case.parameters["scaling"] or {}).get("type", "default")
    measured = _measured_factor(case, outputs) if kind in ("dynamic", "ntk") else None
    changes += scaling_changes(case, measured)
    if case.parameters.get("xpos_scale_base") is not None:
        for lay, prefix in ((layout, ""), (other, swap + ", and ")):
            offset = _xpos_offset(case, outputs, lay)
            if offset:
                scale_base = f"{case.parameters['xpos_scale_base']:g}"
                words = (
                    f"{prefix}the xPos scale centred on the middle of the sequence: "
                    f"zeta^((p - {offset}) / {scale_base}) where the convention has "
                    f"zeta^(p / {scale_base})"
                )
                changes.append((words, {"layout": lay, "xpos_offset": offset}))
    return changes + _shifts("position p rotated as p {0}")


def rotate_precisions(case: Case) -> list[Change]:
    """Positions, angles, or cos and sin rounded to bf16 / fp16 before the rotation."""
    pos = case.inputs["positions"]
    changes: list[Change] = []
    for low in ("bfloat16", "float16"):
        short = SHORT[low]
        collide = equal_rows(round_to(pos, low), pos)
        changes.append(
            (f"positions rounded in {short} before the rotation{collide}", {"pos_low": low})
        )
        angles = round_to(build_angles(case), low)
        collide = equal_rows(angles, pos)
        changes.append(
            (f"angles rounded in {short} before the rotation{collide}", {"angle_low": low})
        )
        words = f"cos and sin rounded to {short} before the rotation"
        changes.append((words, {"cos_low": low}))
        changes.append((words + f", computed in {short}", {"cos_low": low, "arith_low": low}))
    return changes


def build_angles(case: Case) -> np.ndarray:
    """The case's angles ``[seq, r/2]`` (float64)."""
    p = case.parameters
    inv_freq, _ = rotated_frequencies(
        case.inputs["q"].shape[-1], p["rotary_dim"], p["scaling"], _seq_len(case, p["scaling"])
    )
    return _angles(case, case.inputs["positions"], inv_freq)
