"""Float64 NumPy oracle of the RoPE frequencies and their scalings, one frequency at a time.

Straight from the papers and the formulas transformers uses for the same names:
RoFormer (Su et al., 2021), position interpolation (Chen et al., 2023), NTK-aware and
dynamic NTK (/u/bloc97, /u/emozilla), YaRN (Peng et al., 2023), LongRoPE (Ding et al.,
2024), Llama 3.1 and p-RoPE (Barbero et al., 2024). ``scaling`` is a plain dict in posenc's spelling:
``{"type": ..., **parameters}``, ``None`` values meaning "not given".
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["rope_frequencies"]


def _plain(dim: int, base: float, i: int) -> float:
    """The ``i``-th RoFormer frequency ``1 / base^(2i / dim)``."""
    return 1.0 / base ** (2.0 * i / dim)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(dim: int, *, base: float = 10000.0, scaling=None, seq_len=None):
    """``(inv_freq [dim // 2] float64, attention_scale)``; see posenc.rope_frequencies.

    Shape: ``inv_freq`` ``[dim // 2]``; ``attention_scale`` a float.
    """
    s = {k: v for k, v in (scaling or {}).items() if v is not None}
    kind = s.get("type", "default")
    if kind not in _SCALINGS:
        raise ValueError(f"unknown scaling type {kind!r}")
    values, scale = _SCALINGS[kind](dim, base, s, seq_len)
    inv_freq = np.empty(dim // 2, dtype=np.float64)
    inv_freq[:] = values
    return inv_freq, float(scale)


# Each scaling: (dim, base, parameters, seq_len) -> (the dim // 2 frequencies, attention scale)


def _default(dim, base, s, seq_len):
    return [_plain(dim, base, i) for i in range(dim // 2)], 1.0


def _linear(dim, base, s, seq_len):  # positions divided by factor == frequencies divided
    return [_plain(dim, base, i) / s["factor"] for i in range(dim // 2)], 1.0


def _proportional(dim, base, s, seq_len):  # p-RoPE: ``dim`` is the head dim the exponents span
    return [_plain(dim, base, i) / s.get("factor", 1.0) for i in range(dim // 2)], 1.0


def _ntk(dim, base, s, seq_len):  # base raised so the lowest frequency is interpolated by ~factor
    new_base = base * s["factor"] ** (dim / (dim - 2))
    return [_plain(dim, new_base, i) for i in range(dim // 2)], 1.0


def _dynamic(dim, base, s, seq_len):  # NTK with a factor that grows with the current length
    length = s["max_position"] if seq_len is None else max(seq_len, s["max_position"])
    ratio = s["factor"] * length / s["max_position"] - (s["factor"] - 1)
    new_base = base * ratio ** (dim / (dim - 2))
    return [_plain(dim, new_base, i) for i in range(dim // 2)], 1.0


def _factor(s):
    """YaRN's and LongRoPE's factor: given, or ``max_position / original_max_position``."""
    factor = s.get("factor", None)
    if factor is None:
        factor = s["max_position"] / s["original_max_position"]
    return factor


def _yarn(dim, base, s, seq_len):
    factor, original = _factor(s), s["original_max_position"]
    if "attention_factor" in s:
        scale = s["attention_factor"]
    elif s.get("mscale") and s.get("mscale_all_dim"):
        scale = _yarn_mscale(factor, s["mscale"]) / _yarn_mscale(factor, s["mscale_all_dim"])
    else:
        scale = _yarn_mscale(factor)

    # channel index d at which a wavelength fits r times into the original context:
    # original / (2 pi base^(d / dim)) == r  <=>  d = dim ln(original / (2 pi r)) / (2 ln base)
    def channel(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = channel(s.get("beta_fast", 32.0)), channel(s.get("beta_slow", 1.0))
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    values = []
    for i in range(dim // 2):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: keep, 1: interpolate
        plain = _plain(dim, base, i)
        values.append(ramp * plain / factor + (1 - ramp) * plain)
    return values, scale


def _longrope(dim, base, s, seq_len):
    factor, original = _factor(s), s["original_max_position"]
    if "attention_factor" in s:
        scale = s["attention_factor"]
    elif factor <= 1.0:
        scale = 1.0
    else:
        scale = math.sqrt(1 + math.log(factor) / math.log(original))
    use_long = seq_len is not None and seq_len > original
    rescale = s["long_factor"] if use_long else s["short_factor"]
    return [_plain(dim, base, i) / rescale[i] for i in range(dim // 2)], scale


def _llama3(dim, base, s, seq_len):
    factor, original = s["factor"], s["original_max_position"]
    low_ff, high_ff = s["low_freq_factor"], s["high_freq_factor"]
    values = []
    for i in range(dim // 2):
        plain = _plain(dim, base, i)
        wavelength = 2 * math.pi / plain
        if wavelength < original / high_ff:  # high frequency: untouched
            values.append(plain)
        elif wavelength > original / low_ff:  # low frequency: interpolated
            values.append(plain / factor)
        elif high_ff == low_ff:  # no band to blend over (Llama 4): the boundary is untouched
            values.append(plain)
        else:  # in between: blend by how many wavelengths fit in the original context
            smooth = (original / wavelength - low_ff) / (high_ff - low_ff)
            values.append((1 - smooth) * plain / factor + smooth * plain)
    return values, 1.0


_SCALINGS = {
    "default": _default,
    "linear": _linear,
    "proportional": _proportional,
    "ntk": _ntk,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "longrope": _longrope,
    "llama3": _llama3,
}
