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
    half = dim // 2
    inv_freq = np.empty(half, dtype=np.float64)
    scale = 1.0

    if kind == "default":
        for i in range(half):
            inv_freq[i] = _plain(dim, base, i)

    elif kind == "linear":  # positions divided by factor == frequencies divided by factor
        for i in range(half):
            inv_freq[i] = _plain(dim, base, i) / s["factor"]

    elif kind == "proportional":  # p-RoPE: ``dim`` is the head dim the exponents span
        for i in range(half):
            inv_freq[i] = _plain(dim, base, i) / s.get("factor", 1.0)

    elif kind == "ntk":  # base raised so the lowest frequency is interpolated by ~factor
        new_base = base * s["factor"] ** (dim / (dim - 2))
        for i in range(half):
            inv_freq[i] = _plain(dim, new_base, i)

    elif kind == "dynamic":  # NTK with a factor that grows with the current length
        length = s["max_position"] if seq_len is None else max(seq_len, s["max_position"])
        ratio = s["factor"] * length / s["max_position"] - (s["factor"] - 1)
        new_base = base * ratio ** (dim / (dim - 2))
        for i in range(half):
            inv_freq[i] = _plain(dim, new_base, i)

    elif kind == "yarn":
        factor = s.get("factor", None)
        if factor is None:
            factor = s["max_position"] / s["original_max_position"]
        original = s["original_max_position"]
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
        for i in range(half):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: keep, 1: interpolate
            plain = _plain(dim, base, i)
            inv_freq[i] = ramp * plain / factor + (1 - ramp) * plain

    elif kind == "longrope":
        original = s["original_max_position"]
        factor = s.get("factor", None)
        if factor is None:
            factor = s["max_position"] / original
        if "attention_factor" in s:
            scale = s["attention_factor"]
        elif factor <= 1.0:
            scale = 1.0
        else:
            scale = math.sqrt(1 + math.log(factor) / math.log(original))
        use_long = seq_len is not None and seq_len > original
        rescale = s["long_factor"] if use_long else s["short_factor"]
        for i in range(half):
            inv_freq[i] = _plain(dim, base, i) / rescale[i]

    elif kind == "llama3":
        factor, original = s["factor"], s["original_max_position"]
        low_ff, high_ff = s["low_freq_factor"], s["high_freq_factor"]
        for i in range(half):
            plain = _plain(dim, base, i)
            wavelength = 2 * math.pi / plain
            if wavelength < original / high_ff:  # high frequency: untouched
                inv_freq[i] = plain
            elif wavelength > original / low_ff:  # low frequency: interpolated
                inv_freq[i] = plain / factor
            elif high_ff == low_ff:  # no band to blend over (Llama 4): the boundary is untouched
                inv_freq[i] = plain
            else:  # in between: blend by how many wavelengths fit in the original context
                smooth = (original / wavelength - low_ff) / (high_ff - low_ff)
                inv_freq[i] = (1 - smooth) * plain / factor + smooth * plain

    else:
        raise ValueError(f"unknown scaling type {kind!r}")
    return inv_freq, float(scale)
