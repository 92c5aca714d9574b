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
from posenc.rotary.nd import AxialRotaryEmbedding, MultimodalRotaryEmbedding
from posenc.rotary.porting import layout_permutation, permute_qk_weight
from posenc.rotary.xpos import XPosEmbedding

__all__ = [
    "SCALINGS",
    "AxialRotaryEmbedding",
    "DynamicScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "MultimodalRotaryEmbedding",
    "NTKScaling",
    "RotaryEmbedding",
    "XPosEmbedding",
    "YarnScaling",
    "apply_rotary",
    "layout_permutation",
    "parse_scaling",
    "permute_qk_weight",
    "rope_frequencies",
    "rotary_cos_sin",
]
