"""The rotary cases: frequencies of every scaling, axial frequencies, and queries and keys
after the rotation (RoPE in both layouts, every scaling, full and partial; M-RoPE; xPos),
all from :mod:`posenc.reference`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from posenc import reference
from posenc._layouts import LAYOUTS
from posenc.conformance._case import Case, make, positions, representable, seed, where_name

__all__ = [
    "SCALINGS",
    "build_frequencies",
    "build_rotations",
    "pair_channels",
    "reference_rotate",
    "rotated_frequencies",
    "scaling_for",
]

BASE = 10000.0
SCALINGS = ("default", "linear", "ntk", "dynamic", "yarn", "longrope", "llama3", "proportional")


def scaling_for(kind: str, dim: int) -> dict[str, Any] | None:
    """Realistic parameters of each scaling in posenc's spelling (``None``: default)."""
    if kind == "default":
        return None
    if kind in ("linear", "ntk"):
        return {"type": kind, "factor": 4.0}
    if kind == "dynamic":
        return {"type": "dynamic", "factor": 4.0, "max_position": 2048}
    if kind == "yarn":
        return {"type": "yarn", "factor": 4.0, "original_max_position": 4096}
    if kind == "longrope":
        half = dim // 2
        return {
            "type": "longrope",
            "original_max_position": 4096,
            "max_position": 131072,
            "short_factor": [round(1.0 + 0.5 * i / half, 4) for i in range(half)],
            "long_factor": [round(1.0 + 31.0 * (i / half) ** 2, 4) for i in range(half)],
        }
    if kind == "llama3":
        return {
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position": 8192,
        }
    if kind == "proportional":
        return {"type": "proportional", "factor": 2.0}
    raise ValueError(f"unknown scaling {kind!r}")  # pragma: no cover - a builder's slip


def rotated_frequencies(
    head_dim: int, rotary_dim: int, scaling: dict[str, Any] | None, seq_len: int | None
) -> tuple[np.ndarray, float]:
    """The ``rotary_dim / 2`` frequencies a rotation uses and its attention scale: the
    reference's frequencies over ``rotary_dim`` channels, or over the head for
    ``proportional`` (p-RoPE), of which the first ``rotary_dim / 2`` are kept."""
    span = head_dim if scaling and scaling.get("type") == "proportional" else rotary_dim
    inv_freq, scale = reference.rope_frequencies(span, base=BASE, scaling=scaling, seq_len=seq_len)
    return inv_freq[: rotary_dim // 2], scale


def _frequency_case(kind: str, dim: int, seq_len: int | None, tag: str = "") -> Case:
    scaling = scaling_for(kind, dim)
    inv_freq, scale = reference.rope_frequencies(dim, base=BASE, scaling=scaling, seq_len=seq_len)
    log_term = 1.0 + np.abs(np.log(inv_freq))  # a power's error grows with its exponent
    return make(
        f"rope.frequencies.{kind}{tag}.d{dim}",
        "rope",
        "frequencies",
        convention={"scaling": kind},
        parameters={"dim": dim, "base": BASE, "scaling": scaling, "seq_len": seq_len},
        inputs={},
        expected={"inv_freq": inv_freq, "attention_scale": np.array(scale)},
        magnitude={
            "inv_freq": np.abs(inv_freq) * log_term,
            "attention_scale": np.array(abs(scale) * (1.0 + abs(math.log(scale)))),
        },
        doc=f"RoPE inverse frequencies [{dim // 2}], scaling {kind}"
        + (f" at seq_len {seq_len}" if seq_len else "")
        + ", and the attention scale",
    )


def build_frequencies() -> list[Case]:
    """Every frequency case, in a fixed order."""
    cases = []
    for dim in (64, 128):
        for kind in SCALINGS:
            if kind == "dynamic":
                cases.append(_frequency_case(kind, dim, 8192, "-8192"))
            elif kind == "longrope":
                cases.append(_frequency_case(kind, dim, 2048, "-short"))
                cases.append(_frequency_case(kind, dim, 8192, "-long"))
            else:
                cases.append(_frequency_case(kind, dim, None))
    for axis_dims in ((32, 32), (16, 24, 24)):
        inv_freq = reference.axial_frequencies(axis_dims, base=BASE)
        dims = "x".join(map(str, axis_dims))
        cases.append(
            make(
                f"axial_rope.frequencies.{dims}",
                "axial_rope",
                "frequencies",
                convention={},
                parameters={"dim": sum(axis_dims), "base": BASE, "axis_dims": list(axis_dims)},
                inputs={},
                expected={"inv_freq": inv_freq, "attention_scale": np.array(1.0)},
                magnitude={
                    "inv_freq": np.abs(inv_freq) * (1.0 + np.abs(np.log(inv_freq))),
                    "attention_scale": np.array(1.0),
                },
                doc=f"axial N-D RoPE frequencies: each axis of {list(axis_dims)} channels its "
                "own 1-D RoPE, axis 0 first",
            )
        )
    return cases


def pair_channels(
    head_dim: int, rotary_dim: int, layout: str, partial: str = "leading"
) -> list[tuple[int, int]]:
    """The channels ``(a, b)`` of each rotated pair ``i < rotary_dim / 2``: ``(i, i + r/2)``
    for ``"half"``, ``(2i, 2i + 1)`` for ``"interleaved"`` (``partial="leading"``: the first
    ``r`` channels); ``partial="whole_head"`` with ``"half"`` spreads them over the head,
    ``(i, i + head_dim/2)`` (transformers' ``proportional``; adjacent pairs stay leading)."""
    half = rotary_dim // 2
    if layout == "half":
        offset = head_dim // 2 if partial == "whole_head" else half
        return [(i, i + offset) for i in range(half)]
    return [(2 * i, 2 * i + 1) for i in range(half)]


def reference_rotate(
    q: np.ndarray,
    k: np.ndarray,
    pos: np.ndarray,
    *,
    layout: str,
    inv_freq: np.ndarray,
    attention_scale: float,
    sections: list[int] | None = None,
    section_layout: str = "contiguous",
    xpos_scale_base: float | None = None,
    partial: str = "leading",
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`posenc.reference.rotary_qk` on ``[seq, heads, dim]`` arrays (it takes
    ``[b, h, s, d]``). Shape: ``-> ([seq, heads, dim], [seq, heads, dim])``."""
    q4 = np.transpose(q, (1, 0, 2))[None]
    k4 = np.transpose(k, (1, 0, 2))[None]
    qr, kr = reference.rotary_qk(
        q4,
        k4,
        pos,
        pos,
        inv_freq,
        layout=layout,
        attention_scale=attention_scale,
        sections=sections,
        section_layout=section_layout,
        xpos_scale_base=xpos_scale_base,
        partial=partial,
    )
    return np.transpose(qr[0], (1, 0, 2)), np.transpose(kr[0], (1, 0, 2))


def _bounds(
    x: np.ndarray, angles: np.ndarray, scale: np.ndarray, layout: str, partial: str = "leading"
):
    """``(magnitude, angle_bound)`` of a rotated ``x [seq, heads, dim]``: each pair's
    ``(|x_a| + |x_b|) * |scale|`` and that times ``|angle|``; a channel that does not rotate
    ``|x|`` and 0. ``angles`` and ``scale`` ``[seq, r/2]``; ``partial``: see
    :func:`pair_channels`."""
    mag = np.abs(x).copy()
    ang = np.zeros_like(x)
    pairs = pair_channels(x.shape[-1], 2 * angles.shape[-1], layout, partial)
    for i, (a, b) in enumerate(pairs):
        size = (np.abs(x[..., a]) + np.abs(x[..., b])) * np.abs(scale[:, None, i])
        mag[..., a] = mag[..., b] = size
        ang[..., a] = ang[..., b] = size * np.abs(angles[:, None, i])
    return mag, ang


def _rotation(
    name: str,
    family: str,
    *,
    layout: str,
    head_dim: int,
    rotary_dim: int,
    kind: str,
    far: bool,
    pos: np.ndarray | None = None,
    extra: dict[str, Any] | None = None,
    partial: str = "leading",
    doc: str,
) -> Case:
    rng = np.random.default_rng(seed(name))
    pos = positions(far) if pos is None else pos
    seq, heads = pos.shape[0], 2
    q = representable(rng, (seq, heads, head_dim))
    k = representable(rng, (seq, heads, head_dim))
    scaling = scaling_for(kind, rotary_dim)
    extra = dict(extra or {})
    top = int(pos.max()) + 1  # dynamic / longrope: the current length, as transformers takes it
    seq_len = top if kind in ("dynamic", "longrope") else None
    inv_freq, attention = rotated_frequencies(head_dim, rotary_dim, scaling, seq_len)
    qr, kr = reference_rotate(
        q,
        k,
        pos,
        layout=layout,
        inv_freq=inv_freq,
        attention_scale=attention,
        partial=partial,
        **extra,
    )
    sections = extra.get("sections")
    if sections is None:
        angles = reference.rotary_angles(pos, inv_freq)
    else:
        angles = reference.sectioned_angles(pos, inv_freq, sections, extra["section_layout"])
    scale_q = np.full(angles.shape, attention)
    scale_k = scale_q
    if extra.get("xpos_scale_base") is not None:
        scale_q = scale_q * reference.xpos_scale(pos, rotary_dim, extra["xpos_scale_base"])
        scale_k = attention * reference.xpos_scale(pos, rotary_dim, -extra["xpos_scale_base"])
    mag_q, ang_q = _bounds(q, angles, scale_q, layout, partial)
    mag_k, ang_k = _bounds(k, angles, scale_k, layout, partial)
    parameters = {"base": BASE, "scaling": scaling, "rotary_dim": rotary_dim, **extra}
    convention = {"layout": layout, "scaling": kind}
    if rotary_dim < head_dim:  # where the rotating channels sit
        convention["partial"] = partial
    if "section_layout" in extra:
        convention["section_layout"] = extra["section_layout"]
    return make(
        name,
        family,
        "rotate",
        convention=convention,
        parameters=parameters,
        inputs={"q": q, "k": k, "positions": pos},
        expected={"q": qr, "k": kr},
        magnitude={"q": mag_q, "k": mag_k},
        angle_bound={"q": ang_q, "k": ang_k},
        far=far,
        doc=doc,
    )


def build_rotations() -> list[Case]:
    """Every rotation case, in a fixed order."""
    cases = []
    for layout in LAYOUTS:
        for kind in SCALINGS:
            for far in (False, True):
                p_rope = kind == "proportional"  # p-RoPE: 16 of 64 channels, whole head
                rotary = 16 if p_rope else 64
                part = f"r{rotary}" if rotary != 64 else "full"
                cases.append(
                    _rotation(
                        f"rope.rotate.{layout}.{kind}.d64.{part}{where_name(far)}",
                        "rope",
                        layout=layout,
                        head_dim=64,
                        rotary_dim=rotary,
                        kind=kind,
                        far=far,
                        partial="whole_head" if p_rope else "leading",
                        doc=f"q, k [seq, 2, 64] after RoPE, pairs {_PAIRS[layout]}, scaling "
                        f"{kind}" + (_WHOLE_HEAD[layout] if p_rope else ""),
                    )
                )
        for far in (False, True):
            cases.append(
                _rotation(
                    f"rope.rotate.{layout}.default.d128.full{where_name(far)}",
                    "rope",
                    layout=layout,
                    head_dim=128,
                    rotary_dim=128,
                    kind="default",
                    far=far,
                    doc=f"q, k [seq, 2, 128] after RoPE, pairs {_PAIRS[layout]}",
                )
            )
            for kind in ("default", "yarn"):
                cases.append(
                    _rotation(
                        f"rope.rotate.{layout}.{kind}.d64.r32{where_name(far)}",
                        "rope",
                        layout=layout,
                        head_dim=64,
                        rotary_dim=32,
                        kind=kind,
                        far=far,
                        doc=f"partial RoPE: the first 32 of 64 channels rotate, pairs "
                        f"{_PAIRS[layout]}, scaling {kind}",
                    )
                )
    cases += _mrope()
    cases.append(
        _rotation(
            "xpos.rotate.half.d64@near",
            "xpos",
            layout="half",
            head_dim=64,
            rotary_dim=64,
            kind="default",
            far=False,
            extra={"xpos_scale_base": 512.0},
            doc="xPos: RoPE (halves) with queries times zeta^(p / 512), keys zeta^(-p / 512)",
        )
    )
    return cases


_PAIRS = {"half": "(i, i + d/2)", "interleaved": "(2i, 2i + 1)"}
_WHOLE_HEAD = {  # transformers' proportional, Gemma, mlx-lm, MaxText's Gemma 4 layer
    "half": ", 16 of 64 channels rotating spread over the whole head: pairs (i, i + 32), "
    "i < 8, the others pass (partial whole_head)",
    "interleaved": ", 16 of 64 channels rotating: adjacent pairs of the first 16 (partial "
    "whole_head, which for adjacent pairs is the leading placement)",
}


def _mrope() -> list[Case]:
    # text tokens (equal coordinates) then a 2 x 3 image grid at t = 5, then far text
    grid = [(t, t, t) for t in (0, 1, 2, 3, 4)]
    grid += [(5, h + 5, w + 5) for h in range(2) for w in range(3)]
    grid += [(257, 257, 257), (4095, 4095, 4095)]
    pos = np.array(grid, dtype=np.int64)
    cases = []
    for section_layout in ("contiguous", "interleaved"):
        cases.append(
            _rotation(
                f"mrope.rotate.half.{section_layout}.d128@near",
                "mrope",
                layout="half",
                head_dim=128,
                rotary_dim=128,
                kind="default",
                far=False,
                pos=pos,
                extra={"sections": [16, 24, 24], "section_layout": section_layout},
                doc=f"M-RoPE: positions [seq, 3] (t, h, w), sections [16, 24, 24], "
                f"{section_layout} (Qwen2-VL / Qwen3-VL)",
            )
        )
    return cases
