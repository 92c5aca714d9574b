"""``posenc inspect --gguf FILE``: the RoPE posenc reads from a GGUF file's metadata.

Only the file's header is read (its keys, and the small RoPE factor tensors where present;
no weight is touched), so a multi-gigabyte model prints at once. The summary holds the
architecture, llama.cpp's rope type, the context length, the raw RoPE keys, and per layer
type its layers and encoding: base, rotary dim, layout for the tensors as stored and for the
weights as transformers loads them, scaling, attention scale and the module's config.
"""

from __future__ import annotations

from typing import Any

from posenc._errors import PosEncError
from posenc.cli._hf_inspect import MAX_LAYERS, encoding_summary
from posenc.integrations.gguf import gguf_layer_types, gguf_rope_metadata, rotary_from_gguf

__all__ = ["gguf_summary", "layer_ranges"]


def layer_ranges(layers: tuple[int, ...] | list[int]) -> str:
    """``0-4, 6-10, 12`` for the layer indices ``0, 1, 2, 3, 4, 6, ..., 10, 12``."""
    parts: list[str] = []
    start = prev = None
    for i in [*layers, None]:
        if i is not None and prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    return ", ".join(parts)


def _layer_summary(path: str, key: str | None, layers: tuple[int, ...]) -> dict[str, Any]:
    rope = rotary_from_gguf(path, layer=key)
    hf = rotary_from_gguf(path, layer=key, layout_for="transformers")
    return {
        "layers": list(layers),
        "rotates": True,
        **encoding_summary(rope),
        "llama_cpp_rope_type": _llama_cpp_rope_type(rope),
        "layout_transformers": hf.layout,
        "config": rope.to_config(),
    }


def _llama_cpp_rope_type(rope: Any) -> str:
    """llama.cpp's name of the rotation: NORM (adjacent pairs), NEOX (halves), MROPE / IMROPE
    (halves, with contiguous / interleaved sections)."""
    if rope.sections is not None:
        return "IMROPE" if rope.section_layout == "interleaved" else "MROPE"
    return "NORM" if rope.layout == "interleaved" else "NEOX"


def gguf_summary(path: str) -> dict[str, Any]:
    """What ``posenc inspect --gguf PATH`` prints, as a dict.

    Raises:
        PosEncError: a file that is not GGUF or cannot be read, an architecture without
            RoPE, RoPE posenc cannot express (one line, naming the file), or a
            ``block_count`` over :data:`~posenc.cli._hf_inspect.MAX_LAYERS` (every layer
            is listed).
    """
    metadata = gguf_rope_metadata(path)
    arch = metadata["general.architecture"]
    blocks = metadata.get(f"{arch}.block_count")
    if isinstance(blocks, int) and blocks > MAX_LAYERS:  # each layer is listed below
        raise PosEncError(
            f"--gguf {arch}.block_count must be at most {MAX_LAYERS} (the layers of a model), "
            f"got {blocks}"
        )
    types = gguf_layer_types(path)
    layers = {str(key or "all"): _layer_summary(path, key, idx) for key, idx in types.items()}
    blocks = metadata[f"{arch}.block_count"]
    rotating = {i for idx in types.values() for i in idx}
    nope = [i for i in range(blocks) if i not in rotating]
    if nope:
        layers["no_rope"] = {"layers": nope, "rotates": False}
    return {
        "file": path,
        "architecture": arch,
        "context_length": metadata.get(f"{arch}.context_length"),
        "block_count": blocks,
        "metadata": metadata,
        "layers": layers,
    }
