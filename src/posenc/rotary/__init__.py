"""Rotary position embeddings: frequencies and scalings, application to q/k, modules."""

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

__all__ = [
    "SCALINGS",
    "DynamicScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NTKScaling",
    "YarnScaling",
    "parse_scaling",
    "rope_frequencies",
]
