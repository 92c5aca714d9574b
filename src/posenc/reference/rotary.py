"""Float64 NumPy oracle of the rotary encodings: the rotation, M-RoPE, axial RoPE and xPos.

Written plainly, one channel pair at a time, straight from the papers: RoFormer (Su et
al., 2021), xPos (Sun et al., 2022), Qwen2-VL's M-RoPE (Wang et al., 2024) and axial
2-D / N-D RoPE (Heo et al., 2024). Frequencies come from
:func:`posenc.reference.rope_frequencies` (or are passed in).

Shapes: queries/keys ``x: [b, h, s, d]``; angles ``[s, r/2]`` or ``[b, s, r/2]``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "apply_rotary",
    "axial_frequencies",
    "rotary_angles",
    "rotary_qk",
    "sectioned_angles",
    "xpos_scale",
]


def rotary_angles(positions, inv_freq) -> np.ndarray:
    """``angle[..., s, i] = positions[..., s] * inv_freq[i]``.

    Shape: ``[*P]``, ``[r/2]`` -> ``[*P, r/2]``.
    """
    p = np.asarray(positions, dtype=np.float64)
    w = np.asarray(inv_freq, dtype=np.float64)
    out = np.empty((*p.shape, len(w)), dtype=np.float64)
    for i in range(len(w)):
        out[..., i] = p * w[i]
    return out


def sectioned_angles(positions, inv_freq, sections, layout: str = "contiguous") -> np.ndarray:
    """M-RoPE: frequency ``j`` rotates by the coordinate of the axis whose section holds ``j``
    (``layout="contiguous"``, Qwen2-VL); ``"interleaved"`` (Qwen3-VL): of axis ``j % n`` when
    that is not 0 and ``j < n * sections[j % n]``, else of axis 0.

    Shape: positions ``[*P, n_axes]``, inv_freq ``[r/2]`` -> ``[*P, r/2]``.
    """
    p = np.asarray(positions, dtype=np.float64)
    w = np.asarray(inv_freq, dtype=np.float64)
    n = len(sections)
    out = np.empty((*p.shape[:-1], len(w)), dtype=np.float64)
    for j in range(len(w)):
        if layout == "interleaved":
            axis = j % n if j % n and j < n * sections[j % n] else 0
        else:
            axis, end = 0, sections[0]
            while j >= end:  # find the section holding frequency j
                axis += 1
                end += sections[axis]
        out[..., j] = p[..., axis] * w[j]
    return out


def axial_frequencies(axis_dims, base: float = 10000.0) -> np.ndarray:
    """Axial N-D RoPE: each axis gets the 1-D RoPE frequencies of its own ``axis_dims[a]``
    channels, ``1 / base^(2i / axis_dims[a])``, concatenated axis 0 first.

    Shape: ``[sum(axis_dims) / 2]``.
    """
    freqs = []
    for dim in axis_dims:
        for i in range(dim // 2):
            freqs.append(1.0 / base ** (2.0 * i / dim))
    return np.array(freqs, dtype=np.float64)


def xpos_scale(positions, rotary_dim: int, scale_base: float) -> np.ndarray:
    """xPos: ``zeta_i^(n / scale_base)`` with ``zeta_i = (2i + 0.4 r) / (1.4 r)``.

    Shape: ``[*P]`` -> ``[*P, r/2]``.
    """
    p = np.asarray(positions, dtype=np.float64)
    out = np.empty((*p.shape, rotary_dim // 2), dtype=np.float64)
    for i in range(rotary_dim // 2):
        zeta = (2 * i + 0.4 * rotary_dim) / (1.4 * rotary_dim)
        out[..., i] = zeta ** (p / scale_base)
    return out


def apply_rotary(
    x, angles, *, layout: str = "half", scale=None, partial: str = "leading"
) -> np.ndarray:
    """Rotate each channel pair ``(a, b)`` of ``x`` by its angle; the other channels pass.

    ``layout="half"`` pairs ``(i, i + r/2)``, ``"interleaved"`` pairs ``(2i, 2i + 1)``, where
    ``r = 2 * angles.shape[-1]``; ``partial="whole_head"`` with ``"half"`` pairs ``(i, i +
    d/2)`` over the whole head ``d`` instead (transformers' p-RoPE); ``partial="trailing"``
    rotates the last ``r`` channels of ``d`` instead (DeepSeek-V4). ``scale`` (same shape as
    ``angles``), when given, multiplies both channels of each pair (the attention scale and
    xPos).

    Shape: ``x: [b, h, s, d]``, angles ``[s, r/2]`` or ``[b, s, r/2]`` -> ``[b, h, s, d]``.
    """
    x = np.asarray(x, dtype=np.float64)
    theta = np.asarray(angles, dtype=np.float64)
    m = np.ones_like(theta) if scale is None else np.asarray(scale, dtype=np.float64)
    if theta.ndim == 2:  # [s, r/2] -> [1, s, r/2]
        theta, m = theta[None], np.broadcast_to(m, theta.shape)[None]
    theta, m = theta[:, None], m[:, None]  # [b, 1, s, r/2]: the same angles for every head
    half = theta.shape[-1]
    offset = x.shape[-1] // 2 if partial == "whole_head" else half
    start = x.shape[-1] - 2 * half if partial == "trailing" else 0
    out = x.copy()
    for i in range(half):
        a, b = (i, i + offset) if layout == "half" else (2 * i, 2 * i + 1)
        a, b = a + start, b + start
        c, s = np.cos(theta[..., i]), np.sin(theta[..., i])
        out[..., a] = (x[..., a] * c - x[..., b] * s) * m[..., i]
        out[..., b] = (x[..., b] * c + x[..., a] * s) * m[..., i]
    return out


def rotary_qk(
    q,
    k,
    q_positions,
    k_positions,
    inv_freq,
    *,
    layout: str = "half",
    attention_scale: float = 1.0,
    sections=None,
    xpos_scale_base: float | None = None,
    partial: str = "leading",
    section_layout: str = "contiguous",
) -> tuple[np.ndarray, np.ndarray]:
    """What ``RotaryEmbedding.forward`` computes: rotated ``(q, k)`` (``partial``: see
    :func:`apply_rotary`; ``section_layout``: :func:`sectioned_angles`' ``layout``).

    Positions are ``[s]`` / ``[b, s]`` (with ``sections``: ``[..., s, n_axes]``). cos and sin
    are multiplied by ``attention_scale``; with xPos, queries by ``zeta^(n / base)`` and keys
    by ``zeta^(-n / base)``.
    """
    out = []
    for x, pos, sign in ((q, q_positions, 1.0), (k, k_positions, -1.0)):
        if sections is None:
            theta = rotary_angles(pos, inv_freq)
        else:
            theta = sectioned_angles(pos, inv_freq, sections, section_layout)
        scale = np.full(theta.shape, float(attention_scale))
        if xpos_scale_base is not None:
            scale = scale * xpos_scale(pos, 2 * len(inv_freq), sign * xpos_scale_base)
        out.append(apply_rotary(x, theta, layout=layout, scale=scale, partial=partial))
    return out[0], out[1]
