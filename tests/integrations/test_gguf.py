"""``rotary_from_gguf`` on synthetic GGUF files (written with ``gguf.GGUFWriter``): every
RoPE scaling llama.cpp reads, both layouts, M-RoPE, per-layer-type RoPE.

Each case says, by hand from llama.cpp's rules, the ``RotaryEmbedding`` posenc must build
and the state llama.cpp's context would rotate with (:class:`Ggml`); the module's rotation
of random q/k is compared whole against :func:`ggml_rope`, a float64 NumPy model of
``ggml_rope_ext``, and against ``posenc.reference``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import posenc
from posenc import reference
from posenc.integrations.gguf import gguf_layer_types, gguf_rope_metadata, rotary_from_gguf
from posenc.rotary.frequencies import (
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    YarnScaling,
)

gguf = pytest.importorskip("gguf")


def f32(x: float) -> float:
    """``x`` as the file stores a float key (float32)."""
    return float(np.float32(x))


def write_gguf(
    path: Path, arch: str, keys: dict[str, Any], tensors: dict[str, Any] | None = None
) -> Path:
    """A GGUF file of architecture ``arch``: ``keys`` (``{arch}.`` prefixed unless they
    start with ``general.``; int -> uint32, float -> float32, str, bool, list -> array)
    and small float32 ``tensors``."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        full = key if key.startswith("general.") else f"{arch}.{key}"
        if isinstance(value, bool):
            writer.add_bool(full, value)
        elif isinstance(value, int):
            writer.add_uint32(full, value)
        elif isinstance(value, float):
            writer.add_float32(full, value)
        elif isinstance(value, str):
            writer.add_string(full, value)
        else:
            writer.add_array(full, list(value))
    for name, data in (tensors or {}).items():
        writer.add_tensor(name, np.asarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --- llama.cpp's rotation, in float64 -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ggml:
    """The arguments of ``ggml_rope_ext`` for one layer, as llama.cpp's context sets them.

    ``attn_factor`` is the context's (``cparams.yarn_attn_factor``: for YaRN the mscale
    divided by ``1 + 0.1 ln(factor)``, which ggml multiplies back); ``long_factors`` (LongRoPE)
    replace ``freq_factors`` once the context passes ``n_ctx_orig``.
    """

    mode: str  # "norm", "neox", "mrope", "imrope"
    n_rot: int
    base: float
    n_ctx_orig: int
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    freq_factors: tuple[float, ...] | None = None
    long_factors: tuple[float, ...] | None = None
    sections: tuple[int, ...] | None = None


def get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def context_attn_factor(
    factor: float, ext_factor: float, attn: float = 1.0, log_mul: float = 0.0, deepseek=False
) -> float:
    """llama.cpp's ``cparams.yarn_attn_factor`` from the file's factor, ``attn_factor`` and
    ``yarn_log_multiplier`` (stored as 0.1 * DeepSeek's ``mscale_all_dim``)."""
    if ext_factor == 0.0:
        return attn
    mscale_all = log_mul / 0.1
    if mscale_all:
        mscale = mscale_all if deepseek and mscale_all != 1.0 else 1.0
        value = get_mscale(factor, mscale) / get_mscale(factor, mscale_all)
    else:
        value = get_mscale(factor)
    return value / (1.0 + 0.1 * math.log(factor)) * attn


def _axis(i: int, sections: tuple[int, ...], interleaved: bool) -> int:
    """The position stream (t, h, w) of rotated pair ``i`` in ggml's M-RoPE."""
    sector = i % sum(sections)
    if interleaved:  # Qwen3-VL: t, h, w in turn within each section's reach
        if sector % 3 == 1 and sector < 3 * sections[1]:
            return 1
        if sector % 3 == 2 and sector < 3 * sections[2]:
            return 2
        return 0
    edges = np.cumsum(sections)
    return int(np.searchsorted(edges, sector, side="right"))


def ggml_rope(x: np.ndarray, positions: np.ndarray, g: Ggml) -> np.ndarray:
    """``ggml_rope_ext`` of ``x [s, h, d]`` (one row of positions per token; M-RoPE ``[s, 3]``).

    Angle of pair ``i``: ``p * base^(-2i / n_rot) / factor_i``; with YaRN's ramp the
    extrapolated angle is mixed in by ``ramp * ext_factor`` and cos/sin carry
    ``attn_factor * (1 + 0.1 ln(1 / freq_scale))``. NORM pairs ``(2i, 2i + 1)``, the other
    modes ``(i, i + n_rot / 2)``; channels past ``n_rot`` pass through.
    """
    out = x.astype(np.float64).copy()
    half = g.n_rot // 2
    largest = positions.max() + 1
    factors = g.long_factors if g.long_factors and largest > g.n_ctx_orig else g.freq_factors

    def corr_dim(rotations: float) -> float:
        return g.n_rot * math.log(g.n_ctx_orig / (rotations * 2 * math.pi)) / (2 * math.log(g.base))

    low = max(0.0, math.floor(corr_dim(g.beta_fast)))
    high = min(g.n_rot - 1.0, math.ceil(corr_dim(g.beta_slow)))
    for i in range(half):
        if g.sections is None:
            p = positions.astype(np.float64)
        else:
            p = positions[:, _axis(i, g.sections, g.mode == "imrope")].astype(np.float64)
        extrap = p * g.base ** (-2.0 * i / g.n_rot) / (1.0 if factors is None else factors[i])
        theta, mscale = g.freq_scale * extrap, g.attn_factor
        if g.ext_factor != 0.0:
            y = (i - low) / max(0.001, high - low)
            mix = (1.0 - min(1.0, max(0.0, y))) * g.ext_factor
            theta = theta * (1 - mix) + extrap * mix
            mscale *= 1.0 + 0.1 * math.log(1.0 / g.freq_scale)
        cos, sin = (np.cos(theta) * mscale)[:, None], (np.sin(theta) * mscale)[:, None]
        a, b = (2 * i, 2 * i + 1) if g.mode == "norm" else (i, i + half)
        xa, xb = x[:, :, a], x[:, :, b]
        out[:, :, a], out[:, :, b] = xa * cos - xb * sin, xa * sin + xb * cos
    return out


def llama3_factors(dim: int, base: float, factor, low, high, original) -> np.ndarray:
    """``rope_freqs`` as ``convert_hf_to_gguf.py`` computes Llama 3's scaling (float32
    frequencies): ``factor`` past ``original / low`` wavelengths, 1 below ``original /
    high``, ``1 / ((1 - s) / factor + s)`` between, ``s`` linear in ``original / wavelength``."""
    freqs = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    out = []
    for freq in freqs.astype(np.float64):
        wavelength = 2 * math.pi / freq
        if wavelength < original / high:
            out.append(1.0)
        elif wavelength > original / low:
            out.append(factor)
        else:
            s = (original / wavelength - low) / (high - low)
            out.append(1.0 / ((1 - s) / factor + s))
    return np.array(out, dtype=np.float32)


# --- the cases --------------------------------------------------------------------------------

_RNG = np.random.default_rng(7)
_FREQ_FACTORS = (1.0 + 3.0 * _RNG.random(32)).astype(np.float32)  # arbitrary, n_rot 64
_LONG = (1.0 + 7.0 * _RNG.random(48)).astype(np.float32)  # LongRoPE, n_rot 96
_SHORT = (1.0 + 0.5 * _RNG.random(48)).astype(np.float32)
_LLAMA3 = llama3_factors(64, 5e5, 8.0, 1.0, 4.0, 8192)
_BASIC = {
    "context_length": 4096,
    "block_count": 2,
    "embedding_length": 256,
    "attention.head_count": 4,
}


@dataclasses.dataclass(frozen=True)
class Case:
    """A synthetic file and what llama.cpp and posenc make of it, per layer type."""

    name: str
    arch: str
    keys: dict[str, Any]
    expected: dict[str | None, dict[str, Any]]  # layer type -> RotaryEmbedding arguments
    ggml: dict[str | None, Ggml]
    tensors: dict[str, Any] = dataclasses.field(default_factory=dict)
    positions: tuple[int, ...] = (0, 1, 2, 7, 100, 2047, 4095, 5000, 70000)
    atol: float = 1e-9


def _llama(**over: Any) -> dict[str, Any]:
    return {**_BASIC, "rope.freq_base": 5e5, **over}


CASES = [
    Case(
        "llama_plain",
        "llama",
        _llama(),
        {None: dict(head_dim=64, base=5e5, layout="interleaved")},
        {None: Ggml("norm", 64, 5e5, 4096)},
    ),
    Case(
        "llama_linear",
        "llama",
        _llama(**{"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}),
        {
            None: dict(
                head_dim=64, base=5e5, layout="interleaved", scaling=LinearScaling(factor=4.0)
            )
        },
        {None: Ggml("norm", 64, 5e5, 4096, freq_scale=0.25)},
    ),
    Case(
        "llama_linear_default_type",
        "llama",
        _llama(**{"rope.scaling.factor": 2.0}),
        {
            None: dict(
                head_dim=64, base=5e5, layout="interleaved", scaling=LinearScaling(factor=2.0)
            )
        },
        {None: Ggml("norm", 64, 5e5, 4096, freq_scale=0.5)},
    ),
    Case(
        "llama_old_scale_linear_key",
        "llama",
        _llama(**{"rope.scale_linear": 2.0}),
        {
            None: dict(
                head_dim=64, base=5e5, layout="interleaved", scaling=LinearScaling(factor=2.0)
            )
        },
        {None: Ggml("norm", 64, 5e5, 4096, freq_scale=0.5)},
    ),
    Case(
        "llama_type_none_ignores_factor",
        "llama",
        _llama(**{"rope.scaling.type": "none", "rope.scaling.factor": 4.0}),
        {None: dict(head_dim=64, base=5e5, layout="interleaved")},
        {None: Ggml("norm", 64, 5e5, 4096)},
    ),
    Case(
        "llama3_rope_freqs",
        "llama",
        _llama(**{"context_length": 131072}),
        {
            None: dict(
                head_dim=64,
                base=5e5,
                layout="interleaved",
                scaling=Llama3Scaling(
                    factor=8.0,
                    low_freq_factor=1.0,
                    high_freq_factor=4.0,
                    original_max_position=8192,
                ),
            )
        },
        {None: Ggml("norm", 64, 5e5, 131072, freq_factors=tuple(_LLAMA3.tolist()))},
        tensors={"rope_freqs.weight": _LLAMA3},
        atol=2e-5,
    ),
    Case(
        "rope_freqs_factors",
        "llama",
        _llama(),
        {
            None: dict(
                head_dim=64,
                base=5e5,
                layout="interleaved",
                scaling=LongRopeScaling(
                    short_factor=tuple(_FREQ_FACTORS.tolist()),
                    long_factor=tuple(_FREQ_FACTORS.tolist()),
                    original_max_position=4096,
                    factor=1.0,
                ),
            )
        },
        {None: Ggml("norm", 64, 5e5, 4096, freq_factors=tuple(_FREQ_FACTORS.tolist()))},
        tensors={"rope_freqs.weight": _FREQ_FACTORS},
    ),
    Case(
        "rope_freqs_times_linear",
        "command-r",
        _llama(**{"rope.scaling.factor": 2.0}),
        {
            None: dict(
                head_dim=64,
                base=5e5,
                layout="interleaved",
                scaling=LongRopeScaling(
                    short_factor=tuple((_FREQ_FACTORS * 2.0).tolist()),
                    long_factor=tuple((_FREQ_FACTORS * 2.0).tolist()),
                    original_max_position=4096,
                    factor=1.0,
                ),
            )
        },
        {
            None: Ggml(
                "norm", 64, 5e5, 4096, freq_scale=0.5, freq_factors=tuple(_FREQ_FACTORS.tolist())
            )
        },
        tensors={"rope_freqs.weight": _FREQ_FACTORS},
    ),
    Case(
        "qwen2_plain_neox",
        "qwen2",
        {**_BASIC, "rope.freq_base": 1e6},
        {None: dict(head_dim=64, base=1e6, layout="half")},
        {None: Ggml("neox", 64, 1e6, 4096)},
    ),
    Case(
        "qwen2_yarn",
        "qwen2",
        {
            **_BASIC,
            "context_length": 131072,
            "rope.freq_base": 1e6,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 4.0,
            "rope.scaling.original_context_length": 32768,
        },
        {
            None: dict(
                head_dim=64,
                base=1e6,
                layout="half",
                scaling=YarnScaling(factor=4.0, original_max_position=32768),
            )
        },
        {
            None: Ggml(
                "neox",
                64,
                1e6,
                32768,
                freq_scale=0.25,
                ext_factor=1.0,
                attn_factor=context_attn_factor(4.0, 1.0),
            )
        },
    ),
    Case(
        "yarn_keys",
        "qwen2",
        {
            **_BASIC,
            "rope.freq_base": 1e6,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 8.0,
            "rope.scaling.attn_factor": 1.2,
            "rope.scaling.yarn_beta_fast": 16.0,
            "rope.scaling.yarn_beta_slow": 2.0,
        },
        {
            None: dict(
                head_dim=64,
                base=1e6,
                layout="half",
                scaling=YarnScaling(
                    factor=8.0,
                    original_max_position=4096,
                    beta_fast=16.0,
                    beta_slow=2.0,
                    attention_factor=(0.1 * math.log(8.0) + 1) * f32(1.2),
                ),
            )
        },
        {
            None: Ggml(
                "neox",
                64,
                1e6,
                4096,
                freq_scale=0.125,
                ext_factor=1.0,
                beta_fast=16.0,
                beta_slow=2.0,
                attn_factor=context_attn_factor(8.0, 1.0, f32(1.2)),
            )
        },
    ),
    Case(
        "deepseek2_mla_yarn",
        "deepseek2",
        {
            **_BASIC,
            "context_length": 163840,
            "rope.freq_base": 1e4,
            "attention.key_length": 192,
            "rope.dimension_count": 64,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 40.0,
            "rope.scaling.original_context_length": 4096,
            "rope.scaling.yarn_log_multiplier": 0.0707,
        },
        {
            None: dict(
                head_dim=64,
                base=1e4,
                layout="interleaved",
                scaling=YarnScaling(
                    factor=40.0,
                    original_max_position=4096,
                    mscale=f32(0.0707) / 0.1,
                    mscale_all_dim=f32(0.0707) / 0.1,
                ),
            )
        },
        {
            None: Ggml(
                "norm",
                64,
                1e4,
                4096,
                freq_scale=1 / 40,
                ext_factor=1.0,
                attn_factor=context_attn_factor(40.0, 1.0, log_mul=f32(0.0707), deepseek=True),
            )
        },
    ),
    Case(
        "yarn_log_multiplier_ratio",
        "glm-dsa",
        {
            **_BASIC,
            "context_length": 163840,
            "rope.freq_base": 1e4,
            "attention.key_length": 576,
            "rope.dimension_count": 64,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 40.0,
            "rope.scaling.original_context_length": 4096,
            "rope.scaling.yarn_log_multiplier": 0.0707,
        },
        {
            None: dict(
                head_dim=64,
                base=1e4,
                layout="interleaved",
                scaling=YarnScaling(
                    factor=40.0,
                    original_max_position=4096,
                    mscale=1.0,
                    mscale_all_dim=f32(0.0707) / 0.1,
                ),
            )
        },
        {
            None: Ggml(
                "norm",
                64,
                1e4,
                4096,
                freq_scale=1 / 40,
                ext_factor=1.0,
                attn_factor=context_attn_factor(40.0, 1.0, log_mul=f32(0.0707)),
            )
        },
    ),
    Case(
        "phi3_longrope",
        "phi3",
        {
            **_BASIC,
            "context_length": 131072,
            "embedding_length": 384,
            "rope.freq_base": 1e4,
            "rope.dimension_count": 96,
            "rope.scaling.original_context_length": 4096,
            "rope.scaling.attn_factor": 1.1902,
        },
        {
            None: dict(
                head_dim=96,
                base=1e4,
                layout="half",
                scaling=LongRopeScaling(
                    short_factor=tuple(_SHORT.tolist()),
                    long_factor=tuple(_LONG.tolist()),
                    original_max_position=4096,
                    factor=32.0,
                    attention_factor=f32(1.1902),
                ),
            )
        },
        {
            None: Ggml(
                "neox",
                96,
                1e4,
                4096,
                attn_factor=f32(1.1902),
                freq_factors=tuple(_SHORT.tolist()),
                long_factors=tuple(_LONG.tolist()),
            )
        },
        tensors={"rope_factors_long.weight": _LONG, "rope_factors_short.weight": _SHORT},
    ),
    Case(
        "phi3_longrope_short_only",
        "phi3",
        {
            **_BASIC,
            "context_length": 131072,
            "embedding_length": 384,
            "rope.freq_base": 1e4,
            "rope.dimension_count": 96,
            "rope.scaling.original_context_length": 4096,
        },
        {
            None: dict(
                head_dim=96,
                base=1e4,
                layout="half",
                scaling=LongRopeScaling(
                    short_factor=tuple(_SHORT.tolist()),
                    long_factor=tuple(_LONG.tolist()),
                    original_max_position=4096,
                    factor=32.0,
                    attention_factor=1.0,
                ),
            )
        },
        {
            None: Ggml(
                "neox",
                96,
                1e4,
                4096,
                freq_factors=tuple(_SHORT.tolist()),
                long_factors=tuple(_LONG.tolist()),
            )
        },
        tensors={"rope_factors_long.weight": _LONG, "rope_factors_short.weight": _SHORT},
        positions=(0, 1, 5, 100, 4095),
    ),
    Case(
        "phi2_partial_rotary",
        "phi2",
        {**_BASIC, "embedding_length": 320, "rope.freq_base": 1e4, "rope.dimension_count": 32},
        {None: dict(head_dim=80, base=1e4, rotary_dim=32, layout="half")},
        {None: Ggml("neox", 32, 1e4, 4096)},
    ),
    Case(
        "chatglm_partial_norm",
        "chatglm",
        {**_BASIC, "embedding_length": 512, "rope.freq_base": 1e4, "rope.dimension_count": 64},
        {None: dict(head_dim=128, base=1e4, rotary_dim=64, layout="interleaved")},
        {None: Ggml("norm", 64, 1e4, 4096)},
    ),
    Case(
        "qwen2vl_mrope",
        "qwen2vl",
        {
            **_BASIC,
            "embedding_length": 512,
            "rope.freq_base": 1e6,
            "rope.dimension_sections": [16, 24, 24, 0],
        },
        {None: dict(head_dim=128, base=1e6, layout="half", sections=(16, 24, 24))},
        {None: Ggml("mrope", 128, 1e6, 4096, sections=(16, 24, 24))},
    ),
    Case(
        "qwen3vl_imrope",
        "qwen3vl",
        {
            **_BASIC,
            "embedding_length": 512,
            "rope.freq_base": 5e6,
            "rope.dimension_sections": [24, 20, 20, 0],
        },
        {
            None: dict(
                head_dim=128,
                base=5e6,
                layout="half",
                sections=(24, 20, 20),
                section_layout="interleaved",
            )
        },
        {None: Ggml("imrope", 128, 5e6, 4096, sections=(24, 20, 20))},
    ),
    Case(
        "glm4_with_sections_is_mrope",
        "glm4",
        {
            **_BASIC,
            "embedding_length": 512,
            "rope.freq_base": 1e4,
            "rope.dimension_sections": [8, 12, 12, 0],
            "rope.dimension_count": 64,
        },
        {None: dict(head_dim=128, base=1e4, rotary_dim=64, layout="half", sections=(8, 12, 12))},
        {None: Ggml("mrope", 64, 1e4, 4096, sections=(8, 12, 12))},
    ),
    Case(
        "gemma3_sliding_and_full",
        "gemma3",
        {
            **_BASIC,
            "block_count": 7,
            "attention.key_length": 64,
            "rope.freq_base": 1e6,
            "attention.sliding_window": 512,
            "rope.scaling.type": "linear",
            "rope.scaling.factor": 8.0,
        },
        {
            "sliding_attention": dict(head_dim=64, base=1e4, layout="half"),
            "full_attention": dict(
                head_dim=64, base=1e6, layout="half", scaling=LinearScaling(factor=8.0)
            ),
        },
        {
            "sliding_attention": Ggml("neox", 64, 1e4, 4096),
            "full_attention": Ggml("neox", 64, 1e6, 4096, freq_scale=0.125),
        },
    ),
    Case(
        "gemma3_swa_base_key",
        "gemma3",
        {
            **_BASIC,
            "block_count": 6,
            "attention.key_length": 64,
            "rope.freq_base": 1e6,
            "rope.freq_base_swa": 5e4,
            "attention.sliding_window": 512,
        },
        {
            "sliding_attention": dict(head_dim=64, base=5e4, layout="half"),
            "full_attention": dict(head_dim=64, base=1e6, layout="half"),
        },
        {
            "sliding_attention": Ggml("neox", 64, 5e4, 4096),
            "full_attention": Ggml("neox", 64, 1e6, 4096),
        },
    ),
    Case(
        "gemma3_without_window_all_full",
        "gemma3",
        {**_BASIC, "block_count": 6, "attention.key_length": 64, "rope.freq_base": 1e6},
        {None: dict(head_dim=64, base=1e6, layout="half")},
        {None: Ggml("neox", 64, 1e6, 4096)},
    ),
    Case(
        "gpt_oss_yarn_one_type",
        "gpt-oss",
        {
            **_BASIC,
            "block_count": 4,
            "attention.key_length": 64,
            "rope.freq_base": 150000.0,
            "attention.sliding_window": 128,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 32.0,
            "rope.scaling.original_context_length": 4096,
        },
        {
            None: dict(
                head_dim=64,
                base=150000.0,
                layout="half",
                scaling=YarnScaling(factor=32.0, original_max_position=4096),
            )
        },
        {
            None: Ggml(
                "neox",
                64,
                150000.0,
                4096,
                freq_scale=1 / 32,
                ext_factor=1.0,
                attn_factor=context_attn_factor(32.0, 1.0),
            )
        },
    ),
    Case(
        "gpt_oss_swa_base",
        "gpt-oss",
        {
            **_BASIC,
            "block_count": 4,
            "attention.key_length": 64,
            "rope.freq_base": 150000.0,
            "rope.freq_base_swa": 10000.0,
            "attention.sliding_window": 128,
        },
        {
            "sliding_attention": dict(head_dim=64, base=1e4, layout="half"),
            "full_attention": dict(head_dim=64, base=150000.0, layout="half"),
        },
        {
            "sliding_attention": Ggml("neox", 64, 1e4, 4096),
            "full_attention": Ggml("neox", 64, 150000.0, 4096),
        },
    ),
    Case(
        "cohere2_full_layers_nope",
        "cohere2",
        {**_BASIC, "block_count": 8, "rope.freq_base": 5e4, "attention.sliding_window": 4096},
        {"sliding_attention": dict(head_dim=64, base=5e4, layout="interleaved")},
        {"sliding_attention": Ggml("norm", 64, 5e4, 4096)},
    ),
]
LAYER_TYPES = [(c, lt) for c in CASES for lt in c.expected]


def _id(item: Any) -> str:
    case, lt = item
    return f"{case.name}-{lt or 'all'}"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    return {c.name: write_gguf(root / f"{c.name}.gguf", c.arch, c.keys, c.tensors) for c in CASES}


def _positions(case: Case, layer_type: str | None) -> torch.Tensor:
    pos = torch.tensor(case.positions)
    if case.expected[layer_type].get("sections") is None:
        return pos
    # text tokens (t = h = w), then a 2 x 3 image grid at t = 9
    grid = torch.stack(torch.meshgrid(torch.arange(2), torch.arange(3), indexing="ij"), -1)
    image = torch.cat([torch.full((6, 1), 9), grid.reshape(6, 2) + 9], dim=1)
    return torch.cat([pos[:5, None].expand(5, 3), image, torch.tensor([[15, 15, 15]])])


@pytest.mark.parametrize("item", LAYER_TYPES, ids=_id)
def test_reads_the_expected_module(files, item):
    case, layer_type = item
    rope = rotary_from_gguf(files[case.name], layer=layer_type)
    args = case.expected[layer_type]
    want = posenc.RotaryEmbedding(**{"rotary_dim": args["head_dim"], **args})
    assert rope.to_config() == want.to_config()


@pytest.mark.parametrize("item", LAYER_TYPES, ids=_id)
def test_rotation_equals_llama_cpp(files, item):
    case, layer_type = item
    rope = rotary_from_gguf(files[case.name], layer=layer_type)
    pos = _positions(case, layer_type)
    x = torch.randn(
        len(pos), 3, rope.head_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    ours, _ = rope(x.transpose(0, 1)[None], x.transpose(0, 1)[None], pos)
    theirs = ggml_rope(x.numpy(), pos.numpy(), case.ggml[layer_type])
    np.testing.assert_allclose(ours[0].transpose(0, 1).numpy(), theirs, rtol=0, atol=case.atol)


@pytest.mark.parametrize("item", LAYER_TYPES, ids=_id)
def test_rotation_equals_reference(files, item):
    case, layer_type = item
    rope = rotary_from_gguf(files[case.name], layer=layer_type)
    pos = _positions(case, layer_type)
    q = torch.randn(
        1,
        2,
        len(pos),
        rope.head_dim,
        dtype=torch.float64,
        generator=torch.Generator().manual_seed(1),
    )
    ours, _ = rope(q, q, pos)
    scaling = None if rope.scaling is None else dataclasses.asdict(rope.scaling)
    seq_len = int(pos.max()) + 1 if rope.scaling is not None else None
    inv_freq, scale = reference.rope_frequencies(
        rope.rotary_dim, base=rope.base, scaling=scaling, seq_len=seq_len
    )
    want, _ = reference.rotary_qk(
        q.numpy(),
        q.numpy(),
        pos.numpy(),
        pos.numpy(),
        inv_freq,
        layout=rope.layout,
        attention_scale=scale,
        sections=rope.sections,
        section_layout=rope.section_layout,
    )
    np.testing.assert_allclose(ours.numpy(), want, rtol=0, atol=1e-9)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_layer_types_and_indices(files, case):
    types = gguf_layer_types(files[case.name])
    assert list(types) == list(case.expected)
    blocks = case.keys["block_count"]
    if list(types) == [None]:
        assert types[None] == tuple(range(blocks))
        return
    period = {"gemma3": 6, "gpt-oss": 2, "cohere2": 4}[case.arch]
    assert types["sliding_attention"] == tuple(i for i in range(blocks) if i % period < period - 1)
    if "full_attention" in types:
        assert types["full_attention"] == tuple(range(period - 1, blocks, period))
    for layer_type, layers in types.items():  # a layer index reads its type's module
        for index in layers:
            assert rotary_from_gguf(files[case.name], layer=index).to_config() == (
                rotary_from_gguf(files[case.name], layer=layer_type).to_config()
            )


def test_llama3_factors_read_back_match_the_file(files):
    """The recognised Llama 3 scaling's frequencies are the file's factors' to float32."""
    rope = rotary_from_gguf(files["llama3_rope_freqs"])
    plain = 1.0 / 5e5 ** (np.arange(0, 64, 2) / 64)
    np.testing.assert_allclose(rope.inv_freq.numpy(), plain / _LLAMA3, rtol=1e-6)


@pytest.mark.parametrize(
    ("arch", "gguf_layout", "transformers_layout"),
    [
        ("llama", "interleaved", "half"),
        ("deci", "interleaved", "interleaved"),
        ("command-r", "interleaved", "interleaved"),
        ("qwen2", "half", "half"),
        ("gemma2", "half", "half"),
    ],
)
def test_layout_for(tmp_path, arch, gguf_layout, transformers_layout):
    """transformers' loader un-permutes Llama's q/k only; other tensors stay as stored."""
    path = write_gguf(tmp_path / "m.gguf", arch, {**_BASIC, "rope.freq_base": 1e4})
    assert rotary_from_gguf(path).layout == gguf_layout
    assert rotary_from_gguf(path, layout_for="gguf").layout == gguf_layout
    assert rotary_from_gguf(path, layout_for="transformers").layout == transformers_layout


def test_reader_reads_as_the_path(files):
    for name in ("llama3_rope_freqs", "phi3_longrope", "gemma3_sliding_and_full"):
        reader = gguf.GGUFReader(str(files[name]))
        for layer_type in gguf_layer_types(files[name]):
            by_reader = rotary_from_gguf(reader, layer=layer_type).to_config()
            assert by_reader == rotary_from_gguf(files[name], layer=layer_type).to_config()


def test_metadata_lists_the_rope_keys_and_tensors(files):
    meta = gguf_rope_metadata(files["phi3_longrope"])
    assert meta["general.architecture"] == "phi3"
    assert meta["phi3.rope.scaling.attn_factor"] == f32(1.1902)
    assert meta["phi3.rope.dimension_count"] == 96 and meta["phi3.context_length"] == 131072
    np.testing.assert_array_equal(meta["rope_factors_long.weight"], _LONG)
    np.testing.assert_array_equal(meta["rope_factors_short.weight"], _SHORT)
    assert "rope_freqs.weight" not in meta
    gemma = gguf_rope_metadata(files["gemma3_sliding_and_full"])
    assert gemma["gemma3.attention.sliding_window"] == 512
    assert gemma["gemma3.rope.scaling.type"] == "linear"
