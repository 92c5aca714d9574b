"""Self-Extend and STRING: position maps per (query, key) pair, and their attention.

A position map (:class:`~posenc._base.PositionMap`) moves the positions at which a rotary
attention rotates each query and key, per pair, by the pair's offset: :class:`SelfExtend`
groups far keys, :class:`String` shifts large offsets onto well-trained ones. It is not a
rotary encoding and not a scaling: it needs one (the caller's rotation, passed as
``rotate``) and runs inside attention, :func:`remapped_attention`: eager, chunked (memory
``O(s * block)``), fused on the CPU (torch's flash kernel per branch, merged by log-sum-exp,
:mod:`posenc.remap.fused`) and Flex paths.

Used by :func:`posenc.attention` (``position_map=``), by
``posenc.integrations.transformers.patch(model, scaling={"type": "self_extend", ...})``
and by ``posenc extend``; :func:`self_extend_for` and :func:`string_for` give each paper's
parameters for a trained and a target length.
"""

from posenc.remap.attention import BACKENDS, remapped_attention, remapped_attention_at
from posenc.remap.maps import (
    MAP_TYPES,
    SelfExtend,
    String,
    position_map,
    self_extend_for,
    string_for,
)

__all__ = [
    "BACKENDS",
    "MAP_TYPES",
    "SelfExtend",
    "String",
    "position_map",
    "remapped_attention",
    "remapped_attention_at",
    "self_extend_for",
    "string_for",
]
