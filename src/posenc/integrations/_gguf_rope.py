"""A GGUF file's RoPE per layer type: what llama.cpp rotates each layer with.

:func:`read_rope` reads the architecture's facts (:mod:`._gguf_families`), the dimensions
(``rope.dimension_count``; default the key head size ``attention.key_length``, else
``embedding_length / attention.head_count``), the base (``rope.freq_base``, default 10000),
the scaling (:mod:`._gguf_scaling`), M-RoPE's ``rope.dimension_sections`` and, for the
architectures of :data:`._gguf_families.SLIDING`, which layers slide and their own base
(``rope.freq_base_swa``), rotary dim (``rope.dimension_count_swa``) and head size
(``attention.key_length_swa``). The result is one :class:`LayerType` per distinct RoPE,
each with its layer indices and the arguments of its :class:`posenc.RotaryEmbedding` in
llama.cpp's layout for the tensors as stored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from posenc._errors import PosEncError, check_float, check_int
from posenc.integrations import _gguf_families as _families
from posenc.integrations._gguf_file import GGUFSource
from posenc.integrations._gguf_scaling import RopeKeys, scaling_from_gguf
from posenc.rotary.frequencies import Scaling

__all__ = ["FULL", "SLIDING", "GGUFRope", "LayerType", "read_rope"]

SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' names of the layer types
_DEFAULT_BASE = 10000.0  # llama.cpp's rope_freq_base_train when the file has none


@dataclasses.dataclass(frozen=True)
class LayerType:
    """The RoPE of some layers (``rotates`` False: those layers have none).

    Attributes:
        layers: the layer indices (0-based) of this type.
        rotates: whether llama.cpp rotates q/k in these layers.
        args: the keyword arguments of the :class:`posenc.RotaryEmbedding` (``head_dim``,
            ``base``, ``rotary_dim``, ``layout`` for the GGUF tensors as stored, ``scaling``,
            ``sections``, ``section_layout``); empty when it does not rotate.
    """

    layers: tuple[int, ...]
    rotates: bool
    args: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class GGUFRope:
    """What a GGUF file says of its RoPE.

    Attributes:
        arch: ``general.architecture``.
        rope_type: llama.cpp's (``NORM``, ``NEOX``, ``MROPE``, ``IMROPE``).
        context_length: ``{arch}.context_length`` (llama.cpp's ``n_ctx_train``).
        block_count: the number of layers.
        types: layer type name (``None`` when every layer is alike; else
            ``"sliding_attention"`` / ``"full_attention"``) -> :class:`LayerType`.
    """

    arch: str
    rope_type: str
    context_length: int
    block_count: int
    types: dict[str | None, LayerType]


def read_rope(src: GGUFSource) -> GGUFRope:
    """The RoPE of every layer of ``src``.

    Raises:
        PosEncError: no ``general.architecture``, an architecture without RoPE (naming what
            it uses), one posenc does not know or does not read per layer, a missing key
            (naming it), a bad value, or a scaling posenc cannot express.
    """
    arch = src.get("general.architecture")
    if not isinstance(arch, str):
        raise PosEncError(f"the file has no general.architecture key (a string), got {arch!r}")
    if arch in _families.NO_ROPE:
        raise PosEncError(f"architecture {arch!r} has no RoPE ({_families.NO_ROPE[arch]})")
    if arch in _families.PER_LAYER_REFUSED:
        raise PosEncError(
            f"architecture {arch!r}: posenc does not read its per-layer RoPE from GGUF "
            f"({_families.PER_LAYER_REFUSED[arch]})"
        )
    sections = _sections(src, arch)
    rope_type = _rope_type(arch, sections)
    context = _required_int(src, f"{arch}.context_length", min=1)
    blocks = _required_int(src, f"{arch}.block_count", min=1)
    full = _layer_args(src, arch, rope_type, sections, context, swa=False)
    uniform = GGUFRope(arch, rope_type, context, blocks, {None: _type(range(blocks), full)})
    sliding = _families.SLIDING.get(arch)
    if sliding is None:
        return uniform
    flags = _swa_flags(src, arch, sliding, blocks)
    if flags is None or not any(flags):
        return uniform
    swa = _layer_args(src, arch, rope_type, sections, context, swa=True, sliding=sliding)
    if sliding.full_rotates and swa == full:
        return uniform
    types = {
        SLIDING: _type([i for i in range(blocks) if flags[i]], swa),
        FULL: _type(
            [i for i in range(blocks) if not flags[i]], full if sliding.full_rotates else None
        ),
    }
    return GGUFRope(arch, rope_type, context, blocks, {k: v for k, v in types.items() if v.layers})


def _type(layers: Any, args: dict[str, Any] | None) -> LayerType:
    return LayerType(tuple(layers), args is not None, dict(args or {}))


def _required_int(src: GGUFSource, key: str, *, min: int) -> int:
    value = src.get(key)
    if value is None:
        raise PosEncError(f"the file is missing the key {key!r} (llama.cpp requires it)")
    return check_int(key, value, min=min)


def _first_layer(src: GGUFSource, key: str) -> Any:
    """A per-layer key (a number, or one per layer: llama.cpp's ``get_key_or_arr``) at layer 0."""
    value = src.get(key)
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _rope_type(arch: str, sections: tuple[int, ...] | None) -> str:
    if arch in _families.MROPE_WHEN_SECTIONS and sections is not None:
        return "MROPE"
    if arch not in _families.ROPE_TYPES:
        raise PosEncError(
            f"architecture {arch!r}: posenc does not know llama.cpp's RoPE of it (the "
            f"{len(_families.ROPE_TYPES)} architectures of llama_model_rope_type are known)"
        )
    return _families.ROPE_TYPES[arch]


def _sections(src: GGUFSource, arch: str) -> tuple[int, ...] | None:
    """``rope.dimension_sections`` (t, h, w and a fourth axis; trailing zeros dropped)."""
    key = f"{arch}.rope.dimension_sections"
    value = src.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise PosEncError(f"{key} must be a list of section sizes, got {value!r}")
    sizes = [check_int(f"{key}[{i}]", v, min=0) for i, v in enumerate(value)]
    while sizes and sizes[-1] == 0:
        sizes.pop()
    if not sizes or not any(sizes):
        return None
    if 0 in sizes:
        raise PosEncError(f"{key} must have no empty section before the last, got {value}")
    return tuple(sizes)


def _head_dim(src: GGUFSource, arch: str, swa: bool) -> int:
    """The key head size: ``attention.key_length`` (``_swa`` for sliding layers), else
    ``embedding_length / attention.head_count`` (llama.cpp's ``n_embd_head_k``)."""
    key = f"{arch}.attention.key_length"
    value = _first_layer(src, key + "_swa") if swa else None
    value = _first_layer(src, key) if value is None else value
    if value is not None:
        return check_int(key, value, min=2)
    embd = src.get(f"{arch}.embedding_length")
    heads = _first_layer(src, f"{arch}.attention.head_count")
    if embd is None or heads is None:
        raise PosEncError(
            f"the file is missing the key {key!r} and {arch}.embedding_length / "
            f"{arch}.attention.head_count to derive it"
        )
    return check_int(f"{arch}.embedding_length", embd, min=1) // check_int(
        f"{arch}.attention.head_count", heads, min=1
    )


def _layer_args(
    src: GGUFSource,
    arch: str,
    rope_type: str,
    sections: tuple[int, ...] | None,
    context: int,
    *,
    swa: bool,
    sliding: _families.Sliding | None = None,
) -> dict[str, Any]:
    """The :class:`posenc.RotaryEmbedding` arguments of the full (``swa`` False) or the
    sliding-window layers."""
    head_dim = _head_dim(src, arch, swa)
    rot_key = f"{arch}.rope.dimension_count"
    n_rot = src.get(rot_key + "_swa") if swa else None
    n_rot = src.get(rot_key) if n_rot is None else n_rot
    n_rot = head_dim if n_rot is None else check_int(rot_key, n_rot, min=2)
    if arch in _families.MLA:  # the rotated part of each head is its own
        head_dim = n_rot
    if n_rot > head_dim or n_rot % 2:
        raise PosEncError(
            f"{rot_key} must be even and at most the head size {head_dim}, got {n_rot}"
        )
    base = _base(src, arch, swa, sliding)
    keys = RopeKeys(arch, n_rot, base, context, scaled=not swa or sliding is None or sliding.scaled)
    scaling: Scaling | None = scaling_from_gguf(src, keys)
    if rope_type in ("MROPE", "IMROPE") and sections is None:
        raise PosEncError(
            f"the file is missing the key {arch + '.rope.dimension_sections'!r} (M-RoPE's sections)"
        )
    if rope_type in ("MROPE", "IMROPE") and sum(sections or ()) != n_rot // 2:
        raise PosEncError(
            f"{arch}.rope.dimension_sections must sum to n_rot / 2 = {n_rot // 2}, got "
            f"{list(sections or ())}"
        )
    mrope = rope_type in ("MROPE", "IMROPE")
    return {
        "head_dim": head_dim,
        "base": base,
        "rotary_dim": n_rot,
        "layout": "interleaved" if rope_type == "NORM" else "half",
        "scaling": scaling,
        "sections": sections if mrope else None,
        "section_layout": "interleaved" if rope_type == "IMROPE" else "contiguous",
    }


def _base(src: GGUFSource, arch: str, swa: bool, sliding: _families.Sliding | None) -> float:
    key = f"{arch}.rope.freq_base"
    value = src.get(key + "_swa") if swa else None
    if swa and value is None and sliding is not None and sliding.base is not None:
        value = sliding.base
    value = src.get(key) if value is None else value
    value = _DEFAULT_BASE if value is None else value
    return check_float(key, value, min=1.0, min_exclusive=True)


def _swa_flags(
    src: GGUFSource, arch: str, sliding: _families.Sliding, blocks: int
) -> list[bool] | None:
    """Which layers are sliding-window layers (None: none)."""
    window = src.get(f"{arch}.attention.sliding_window")
    if sliding.needs_window and (window is None or window == 0):
        return None  # llama.cpp: no window, every layer is a full-attention layer
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = src.get(key)
    if isinstance(pattern, list):
        if len(pattern) != blocks:
            raise PosEncError(f"{key} must hold one flag per layer ({blocks}), got {len(pattern)}")
        return [bool(v) for v in pattern]
    period = sliding.period if pattern is None else check_int(key, pattern, min=0)
    if period == 0:
        return [True] * blocks  # llama.cpp's set_swa_pattern(0): every layer slides
    return [i % period < period - 1 for i in range(blocks)]
