"""posenc and GGUF (llama.cpp's format): the RoPE a GGUF file's metadata gives.

- :func:`rotary_from_gguf`: the :class:`posenc.RotaryEmbedding` llama.cpp rotates q/k with,
  for the tensors as stored or for the weights as transformers loads them;
- :func:`gguf_layer_types`: the layer types of a file with a RoPE per layer type (Gemma 3's
  sliding-window layers) and their layer indices;
- :func:`gguf_rope_metadata`: the raw RoPE keys and tensors read, for printing.

Only the header is read (its metadata and where each tensor lies, from a memory map; no
tensor data but the small RoPE factor tensors), by posenc's own reader (:mod:`._gguf_file`):
a path needs nothing beyond posenc, and a ``gguf.GGUFReader`` the caller holds is read from
its memory map by the same reader. These modules (with :mod:`._gguf_families`) are the only
place that knows llama.cpp's spellings.
"""

from __future__ import annotations

from typing import Any

from posenc._errors import PosEncError, check_choice, check_int
from posenc.integrations import _gguf_families as _families
from posenc.integrations._gguf_file import GGUFSource, open_gguf
from posenc.integrations._gguf_rope import GGUFRope, LayerType, read_rope
from posenc.rotary.module import RotaryEmbedding

__all__ = ["LAYOUT_FOR", "gguf_layer_types", "gguf_rope_metadata", "rotary_from_gguf"]

#: The values of ``rotary_from_gguf(layout_for=)``: whose view of the q/k weights.
LAYOUT_FOR = ("gguf", "transformers")

# Metadata keys (after "{arch}.") that bear on RoPE, besides every "rope." key.
_ROPE_CONTEXT_KEYS = (
    "context_length",
    "block_count",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.key_length_swa",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
)
_ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def _read(path_or_reader: Any) -> tuple[GGUFSource, GGUFRope]:
    src = open_gguf(path_or_reader)
    try:
        return src, read_rope(src)
    except PosEncError as e:  # a tensor's own error names the file already
        named = str(e).startswith(src.name)
        raise PosEncError(str(e) if named else f"{src.name}: {e}") from None


def rotary_from_gguf(
    path_or_reader: Any, *, layer: int | str | None = None, layout_for: str = "gguf"
) -> RotaryEmbedding:
    """The :class:`posenc.RotaryEmbedding` llama.cpp rotates a GGUF model's q/k with.

    Read from the metadata as llama.cpp reads it (``{arch}.rope.*``, the head size, the RoPE
    factor tensors); the keys, the layer types, where posenc and llama.cpp differ: ``docs/gguf.md``.

    Args:
        path_or_reader: a GGUF file's path, or a ``gguf.GGUFReader`` of one.
        layer: for a file with a RoPE per layer type (see :func:`gguf_layer_types`), a
            layer index (``0 <= layer < block_count``) or a type name
            (``"sliding_attention"``, ``"full_attention"``); ``None`` where every layer
            that rotates rotates alike.
        layout_for: whose q/k weights the module rotates: ``"gguf"``, the tensors as the
            file stores them (what llama.cpp does; Llama: ``"interleaved"``), or
            ``"transformers"``, as transformers' GGUF loader returns them (Llama:
            ``"half"``). ``q . k`` after rotation is the same either way.

    Returns:
        The rotary module (float64 frequencies, no state; ``to_config()`` records it).

    Raises:
        PosEncError: (one line, naming the file) a file that is not GGUF or cannot be read;
            an architecture without RoPE or whose RoPE posenc does not read; a missing key;
            an unknown ``rope.scaling.type``; a scaling posenc cannot express; ``layer`` not
            one of the file's layers or types, a layer without RoPE, or ``None`` where the
            layer types differ.

    Examples:
        >>> import os, tempfile, gguf
        >>> from posenc.integrations.gguf import rotary_from_gguf
        >>> path = os.path.join(tempfile.mkdtemp(), "tiny.gguf")
        >>> w = gguf.GGUFWriter(path, "llama")
        >>> w.add_context_length(2048); w.add_block_count(2); w.add_embedding_length(256)
        >>> w.add_head_count(4); w.add_rope_freq_base(5e5)
        >>> w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR); w.add_rope_scaling_factor(4.0)
        >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.close()
        >>> rope = rotary_from_gguf(path)
        >>> rope.head_dim, rope.base, rope.layout, rope.scaling
        (64, 500000.0, 'interleaved', LinearScaling(factor=4.0, type='linear'))
    """
    check_choice("layout_for", layout_for, LAYOUT_FOR)
    src, rope = _read(path_or_reader)
    kind = _layer_type(rope, layer, src.name)
    args = dict(kind.args)
    if layout_for == "transformers" and rope.arch in _families.TRANSFORMERS_UNPERMUTES:
        args["layout"] = "half"
    return RotaryEmbedding(**args)


def _layer_type(rope: GGUFRope, layer: int | str | None, name: str) -> LayerType:
    """The layer type ``layer`` names (an index, a type name or None)."""
    types = rope.types
    if layer is None:
        rotating = [t for t in types.values() if t.rotates]
        if len(rotating) != 1:
            raise PosEncError(
                f"layer must be given for {name}: its layer types rotate differently "
                f"({_listing(types)}); pass a layer index or one of "
                f"{', '.join(repr(k) for k in types)}"
            )
        return rotating[0]
    if isinstance(layer, str):
        if layer not in types:
            names = [k for k in types if k is not None]
            choices = f"one of {', '.join(map(repr, names))}" if names else "None (one type)"
            raise PosEncError(
                f"layer must be a layer index or a layer type of {name}, {choices}; got {layer!r}"
            )
        kind = types[layer]
    else:
        index = check_int("layer", layer, min=0, max=rope.block_count - 1)
        kind = next(t for t in types.values() if index in t.layers)
    if not kind.rotates:
        raise PosEncError(
            f"layer {layer!r} of {name} has no RoPE (architecture {rope.arch!r} does not "
            f"rotate its {_name_of(rope, kind)} layers)"
        )
    return kind


def _name_of(rope: GGUFRope, kind: LayerType) -> str:
    return next(str(k) for k, v in rope.types.items() if v is kind)


def _listing(types: dict[str | None, LayerType]) -> str:
    parts = []
    for key, kind in types.items():
        what = f"base {kind.args['base']:g}" if kind.rotates else "no RoPE"
        parts.append(f"{key}: {len(kind.layers)} layers, {what}")
    return "; ".join(parts)


def gguf_layer_types(path_or_reader: Any) -> dict[str | None, tuple[int, ...]]:
    """The layer types of a GGUF file that rotate, and their layer indices: ``{None: every
    layer}`` where all rotate alike; else ``"sliding_attention"`` / ``"full_attention"``
    (Gemma 3; gpt-oss with ``rope.freq_base_swa``). Layers left out have no RoPE (Cohere2's
    full-attention layers: ``{"sliding_attention": (0, 1, 2, 4, ...)}``). Each key is a
    ``layer=`` of :func:`rotary_from_gguf` (``None``: leave it out).

    Raises:
        PosEncError: as :func:`rotary_from_gguf` for the file.

    Examples:
        >>> import os, tempfile, gguf
        >>> from posenc.integrations.gguf import gguf_layer_types, rotary_from_gguf
        >>> path = os.path.join(tempfile.mkdtemp(), "gemma3.gguf")
        >>> w = gguf.GGUFWriter(path, "gemma3")
        >>> w.add_context_length(32768); w.add_block_count(7); w.add_embedding_length(256)
        >>> w.add_head_count(4); w.add_key_length(64); w.add_rope_freq_base(1e6)
        >>> w.add_sliding_window(512)
        >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.close()
        >>> gguf_layer_types(path)
        {'sliding_attention': (0, 1, 2, 3, 4, 6), 'full_attention': (5,)}
        >>> rotary_from_gguf(path, layer=0).base, rotary_from_gguf(path, layer=5).base
        (10000.0, 1000000.0)
    """
    _, rope = _read(path_or_reader)
    return {key: kind.layers for key, kind in rope.types.items() if kind.rotates}


def gguf_rope_metadata(path_or_reader: Any) -> dict[str, Any]:
    """The keys and tensors of a GGUF file that bear on RoPE, as read (for printing):
    ``general.architecture``, every ``{arch}.rope.*`` key, the context length, layer count,
    head sizes and sliding-window keys, and the RoPE factor tensors' values (``rope_freqs``,
    ``rope_factors_long`` / ``_short``) as lists. Nothing is checked but the file itself.

    Raises:
        PosEncError: a file that is not GGUF or cannot be read (one line, naming it).

    Examples:
        >>> import os, tempfile, gguf
        >>> from posenc.integrations.gguf import gguf_rope_metadata
        >>> path = os.path.join(tempfile.mkdtemp(), "qwen2.gguf")
        >>> w = gguf.GGUFWriter(path, "qwen2")
        >>> w.add_context_length(32768); w.add_rope_freq_base(1e6)
        >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.close()
        >>> gguf_rope_metadata(path)
        {'general.architecture': 'qwen2', 'qwen2.context_length': 32768, 'qwen2.rope.freq_base': 1000000.0}
    """
    src = open_gguf(path_or_reader)
    arch = src.get("general.architecture")
    out: dict[str, Any] = {"general.architecture": arch}
    if isinstance(arch, str):
        wanted = {f"{arch}.{k}" for k in _ROPE_CONTEXT_KEYS}
        for key, value in src.metadata.items():
            if key in wanted or key.startswith(f"{arch}.rope."):
                out[key] = value
    for name in _ROPE_TENSORS:
        values = src.tensor(name)
        if values is not None:
            out[name] = values.tolist()
    return out
