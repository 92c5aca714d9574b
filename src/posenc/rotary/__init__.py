"""Rotary position embeddings: frequencies and scalings, application to q/k, modules."""

from posenc.rotary.apply import apply_rotary, rotary_cos_sin
from posenc.rotary.frequencies import (
    SCALINGS,
    DynamicScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    YarnScaling,
    parse_scaling,
    rope_frequencies,
)
from posenc.rotary.module import RotaryEmbedding

__all__ = [
    "SCALINGS",
    "DynamicScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NTKScaling",
    "RotaryEmbedding",
    "YarnScaling",
    "apply_rotary",
    "parse_scaling",
    "rope_frequencies",
    "rotary_cos_sin",
]
