"""Rotary position embeddings: frequencies and scalings, application to q/k, modules.

Imports point one way, bottom to top: ``layout`` (the layout and seq_dim names; the layout
tuple itself is :mod:`posenc._layouts`') <- ``kernels`` (the plain torch twin in
``kernels.plain`` beside the Triton and CPU fast paths; ``kernels/__init__`` only
re-exports) <- ``apply`` (cos/sin and :func:`apply_rotary`) and ``rotation``
(:class:`~posenc.rotary.rotation.Rotation`, its checks, the rotation of q and k) <-
``module`` (:class:`RotaryEmbedding`, which also takes ``cache`` (the cos/sin table),
``call_frequencies`` (the frequencies of each call) and ``fast`` (the common CPU call,
handed a :class:`~posenc.rotary.kernels.planned.FastRotation`)) <- ``nd`` and ``xpos`` (its
subclasses); ``porting`` needs only ``layout``, and ``frequencies`` (with ``scalings/``)
nothing of the rest. M-RoPE is ``RotaryEmbedding(head_dim, sections=...)``.
"""

from posenc.rotary.apply import apply_rotary, rotary_cos_sin
from posenc.rotary.frequencies import (
    SCALINGS,
    DynamicScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    ProportionalScaling,
    YarnScaling,
    parse_scaling,
    rope_frequencies,
    rotated_frequencies,
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
    "ProportionalScaling",
    "RotaryEmbedding",
    "XPosEmbedding",
    "YarnScaling",
    "apply_rotary",
    "layout_permutation",
    "parse_scaling",
    "permute_qk_weight",
    "rope_frequencies",
    "rotary_cos_sin",
    "rotated_frequencies",
]
