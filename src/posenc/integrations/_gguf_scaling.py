"""A GGUF file's RoPE scaling, as llama.cpp applies it, in posenc's scaling dataclasses.

llama.cpp reads ``{arch}.rope.scaling.type`` (``none``, ``linear``, ``yarn``, ``longrope``;
``linear`` when absent), ``.factor`` (``freq_scale = 1 / factor``; absent or 0: 1),
``.original_context_length`` (``n_ctx_orig_yarn``; absent: ``{arch}.context_length``),
``.attn_factor`` (a factor on cos/sin, 1 when absent) and, where present, the YaRN keys
``.yarn_ext_factor`` (the ramp's weight: 1 for ``yarn``, 0 otherwise), ``.yarn_attn_factor``,
``.yarn_beta_fast`` / ``.yarn_beta_slow`` (32 and 1) and ``.yarn_log_multiplier`` (DeepSeek's
``0.1 * mscale_all_dim``). Per-frequency factors come as tensors: ``rope_freqs.weight`` (Llama
3's scaling, computed by ``convert_hf_to_gguf.py``; Command-R 128k) divides each frequency,
and ``rope_factors_long.weight`` / ``rope_factors_short.weight`` are LongRoPE's (Phi-3),
the long set once the context (llama.cpp: the context size it runs with) passes the original.

In ``ggml_rope_ext`` the angle of pair ``i`` at position ``p`` is ``p * base^(-2i / n_rot) /
freq_factor[i]``, times ``freq_scale`` where the YaRN ramp does not extrapolate; cos/sin are
multiplied by the attention factor llama.cpp's context computes (YaRN: ``0.1 ln(factor) + 1``,
or DeepSeek's ratio of two such terms; then ``attn_factor``). :func:`scaling_from_gguf` gives
the posenc dataclass with the same frequencies and scale:

- ``linear``: :class:`LinearScaling`; ``yarn``: :class:`YarnScaling` (ramp bounds floored and
  ceiled, as ggml does);
- ``rope_freqs``: :class:`Llama3Scaling` when Llama 3's formula with round parameters
  reproduces the stored factors to float32 precision (the converter's output), else the
  factors themselves as a :class:`LongRopeScaling` with equal short and long sets;
- LongRoPE's tensors: :class:`LongRopeScaling` with the file's ``attn_factor``.

What posenc cannot express (a YaRN ramp over frequency factors, a ``yarn_ext_factor`` other
than 0 or 1, an attention factor on linear scaling, Hunyuan's NTK ``rope.scaling.alpha``) is
refused with :class:`posenc.PosEncError`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from posenc._errors import PosEncError, check_choice, check_float, check_int
from posenc.integrations._gguf_file import GGUFSource
from posenc.rotary.frequencies import Scaling, parse_scaling, rope_frequencies

__all__ = ["SCALING_TYPES", "RopeKeys", "scaling_from_gguf"]

#: llama.cpp's names of ``rope.scaling.type`` (``LLAMA_ROPE_SCALING_TYPES``).
SCALING_TYPES = ("none", "linear", "yarn", "longrope")
_LLAMA3_ORIGINAL = 8192  # convert_hf_to_gguf.py's original context when the config has none
_LLAMA3_RTOL = 1e-5  # the stored factors are float32, computed from float32 frequencies


@dataclasses.dataclass(frozen=True)
class RopeKeys:
    """One layer type's RoPE as the file gives it (before posenc's dataclasses).

    Attributes:
        arch: ``general.architecture``.
        n_rot: rotated channels (``rope.dimension_count``).
        base: ``rope.freq_base`` (or the sliding layers' own).
        context_length: ``{arch}.context_length``.
        scaled: whether the file's scaling applies to this layer type.
    """

    arch: str
    n_rot: int
    base: float
    context_length: int
    scaled: bool = True


def scaling_from_gguf(src: GGUFSource, keys: RopeKeys) -> Scaling | None:
    """The posenc scaling of one layer type of ``src`` (None: plain RoPE).

    Raises:
        PosEncError: an unknown ``rope.scaling.type``, a bad value (naming its key), a
            combination posenc cannot express (see the module docstring).
    """
    if not keys.scaled:
        return None
    arch = keys.arch
    rope = f"{arch}.rope.scaling."
    kind = src.get(rope + "type")
    kind = "linear" if kind is None else kind
    check_choice(f"{rope}type (llama.cpp's names)", kind, SCALING_TYPES)
    alpha = src.get(rope + "alpha")
    if alpha not in (None, 0, 0.0):
        raise PosEncError(
            f"{rope}alpha = {alpha!r} (Hunyuan's NTK-aware alpha) is not read by posenc"
        )
    factor = _factor(src, arch, kind)
    original = _original(src, keys)
    attn = check_float(
        rope + "attn_factor", _given(src, rope + "attn_factor", 1.0), min=0.0, min_exclusive=True
    )
    ext = _ext_factor(src, rope, kind)
    freqs = src.tensor("rope_freqs.weight")
    long, short = src.tensor("rope_factors_long.weight"), src.tensor("rope_factors_short.weight")
    if (freqs is not None or long is not None) and ext != 0.0:
        raise PosEncError(
            f"a YaRN ramp over per-frequency factors (rope_freqs / rope_factors "
            f"tensors with {rope}type 'yarn') is not expressible in posenc"
        )
    if freqs is not None:
        return _from_freq_factors(
            _checked(freqs * factor, "rope_freqs.weight", keys),
            keys,
            original,
            attn,
            allow_llama3=factor == 1.0,
        )
    if long is not None or short is not None or kind == "longrope":
        return _longrope(long, short, factor, keys, original, attn)
    if ext == 1.0:
        return _yarn(src, keys, factor, original, attn)
    yarn_attn = _given(src, rope + "yarn_attn_factor", 1.0)
    if attn * yarn_attn != 1.0:
        raise PosEncError(
            f"an attention factor ({rope}attn_factor * yarn_attn_factor = "
            f"{attn * yarn_attn:g}) on {kind!r} scaling is not expressible in posenc"
        )
    return None if factor == 1.0 else _make("linear", factor=factor)


def _make(kind: str, **params: Any) -> Scaling:
    """posenc's dataclass of scaling ``kind`` (parsed, so validated like any config)."""
    scaling = parse_scaling({"type": kind, **params})
    if scaling is None:  # only "default" parses to None
        raise PosEncError(f"scaling {kind!r} parsed to no scaling")
    return scaling


def _given(src: GGUFSource, key: str, default: Any) -> Any:
    value = src.get(key)
    return default if value is None else value


def _factor(src: GGUFSource, arch: str, kind: str) -> float:
    """``1 / freq_scale``: ``rope.scaling.factor`` (or the old ``rope.scale_linear``); absent or
    0: 1; ``none`` always 1 (llama.cpp never scales then)."""
    key = f"{arch}.rope.scaling.factor"
    value = src.get(key)
    if value is None:
        key = f"{arch}.rope.scale_linear"
        value = src.get(key)
    if value is None or kind == "none" or value == 0:
        return 1.0
    return check_float(key, value, min=1.0)


def _original(src: GGUFSource, keys: RopeKeys) -> int:
    key = f"{keys.arch}.rope.scaling.original_context_length"
    value = src.get(key)
    if value is None or value == 0:
        return keys.context_length
    return check_int(key, value, min=1)


def _ext_factor(src: GGUFSource, rope: str, kind: str) -> float:
    """The weight of YaRN's ramp: the file's ``yarn_ext_factor`` (negative: unset), else 1
    for ``yarn`` and 0 otherwise (llama.cpp's context)."""
    value = src.get(rope + "yarn_ext_factor")
    if value is None or value < 0:
        return 1.0 if kind == "yarn" else 0.0
    value = check_float(rope + "yarn_ext_factor", value, min=0.0)
    if value not in (0.0, 1.0):
        raise PosEncError(
            f"{rope}yarn_ext_factor must be 0 or 1 for posenc (YaRN's ramp at full weight or "
            f"none), got {value:g}"
        )
    return value


def _checked(factors: np.ndarray, name: str, keys: RopeKeys) -> np.ndarray:
    if factors.shape != (keys.n_rot // 2,):
        raise PosEncError(
            f"tensor {name} must hold n_rot / 2 = {keys.n_rot // 2} factors (one per rotated "
            f"pair), got {factors.size}"
        )
    bad = ~(np.isfinite(factors) & (factors > 0))
    if bad.any():
        raise PosEncError(
            f"tensor {name} must hold positive finite factors, got {int(bad.sum())} that are "
            f"not (the first: {float(factors[bad][0])!r} at pair {int(np.argmax(bad))})"
        )
    return factors


def _from_freq_factors(
    factors: np.ndarray, keys: RopeKeys, original: int, attn: float, *, allow_llama3: bool
) -> Scaling | None:
    """``rope_freqs``: each frequency divided by its factor."""
    if np.all(factors == 1.0) and attn == 1.0:
        return None
    if allow_llama3 and attn == 1.0:
        llama3 = _llama3_fit(factors, keys)
        if llama3 is not None:
            return llama3
    return _make(
        "longrope",
        short_factor=tuple(factors.tolist()),
        long_factor=tuple(factors.tolist()),
        original_max_position=original,
        factor=1.0,
        attention_factor=None if attn == 1.0 else attn,
    )


def _llama3_fit(factors: np.ndarray, keys: RopeKeys) -> Scaling | None:
    """The :class:`Llama3Scaling` whose frequencies are those of ``factors`` (to float32
    precision), or None. ``convert_hf_to_gguf.py`` writes ``factor`` for the long wavelengths,
    1 for the short ones and ``1 / ((1 - s) / factor + s)`` between, ``s`` linear in
    ``original / wavelength``: the two bands' edges are read back from that line."""
    factor = float(factors.max())
    if factor <= 1.0 or float(factors.min()) < 1.0 - _LLAMA3_RTOL:
        return None
    inv = 1.0 / keys.base ** (np.arange(0, keys.n_rot, 2) / keys.n_rot)
    original = _LLAMA3_ORIGINAL
    x = original * inv / (2 * math.pi)  # original / wavelength
    between = (factors > 1.0 + _LLAMA3_RTOL) & (factors < factor * (1 - _LLAMA3_RTOL))
    low, high = 1.0, 4.0  # Meta's, when the band holds fewer than two frequencies
    if between.sum() >= 2:
        s = (1.0 / factors[between] - 1.0 / factor) / (1.0 - 1.0 / factor)
        slope, intercept = np.polyfit(x[between], s, 1)
        if slope <= 0:
            return None
        low, high = -intercept / slope, (1.0 - intercept) / slope
        low, high = float(f"{low:.5g}"), float(f"{high:.5g}")
    if not 0 < low < high:
        return None
    candidate = _make(
        "llama3",
        factor=factor,
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position=original,
    )
    ours, _ = rope_frequencies(keys.n_rot, base=keys.base, scaling=candidate)
    if np.allclose(ours.numpy(), inv / factors, rtol=_LLAMA3_RTOL, atol=0.0):
        return candidate
    return None


def _longrope(
    long: np.ndarray | None,
    short: np.ndarray | None,
    factor: float,
    keys: RopeKeys,
    original: int,
    attn: float,
) -> Scaling:
    if long is None or short is None:
        raise PosEncError(
            "LongRoPE needs both tensors rope_factors_long.weight and "
            f"rope_factors_short.weight, got {'only the long' if short is None else 'only the short'}"
            if long is not None or short is not None
            else f"{keys.arch}.rope.scaling.type 'longrope' needs the tensors "
            "rope_factors_long.weight and rope_factors_short.weight; the file has neither"
        )
    long = _checked(long * factor, "rope_factors_long.weight", keys)
    short = _checked(short * factor, "rope_factors_short.weight", keys)
    return _make(
        "longrope",
        short_factor=tuple(short.tolist()),
        long_factor=tuple(long.tolist()),
        original_max_position=original,
        factor=max(1.0, keys.context_length / original),
        attention_factor=attn,  # llama.cpp: the file's attn_factor (1 when absent)
    )


def _yarn(src: GGUFSource, keys: RopeKeys, factor: float, original: int, attn: float) -> Scaling:
    """YaRN as llama.cpp's context sets it up: the ramp between ``beta_fast`` and
    ``beta_slow`` rotations in the original context, cos/sin times ``0.1 ln(factor) + 1``
    (with ``yarn_log_multiplier``: DeepSeek's ratio) times ``attn_factor``."""
    rope = f"{keys.arch}.rope.scaling."
    beta_fast = check_float(rope + "yarn_beta_fast", _given(src, rope + "yarn_beta_fast", 32.0))
    beta_slow = check_float(rope + "yarn_beta_slow", _given(src, rope + "yarn_beta_slow", 1.0))
    log_mul = check_float(
        rope + "yarn_log_multiplier", _given(src, rope + "yarn_log_multiplier", 0.0), min=0.0
    )
    mscale = mscale_all_dim = None
    if log_mul != 0.0:
        mscale_all_dim = log_mul / 0.1  # the converter stored 0.1 * mscale_all_dim
        deepseek = keys.arch == "deepseek2" and mscale_all_dim != 1.0
        mscale = mscale_all_dim if deepseek else 1.0
    params: dict[str, Any] = {
        "factor": factor,
        "original_max_position": original,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
        "mscale": mscale,
        "mscale_all_dim": mscale_all_dim,
    }
    if attn != 1.0:
        _, scale = rope_frequencies(keys.n_rot, base=keys.base, scaling=_make("yarn", **params))
        params["attention_factor"] = scale * attn
    return _make("yarn", **params)
