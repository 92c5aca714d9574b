"""LongRoPE's per-frequency factors written into a copy of a GGUF file, as llama.cpp reads
them: what ``posenc extend --search`` exports for llama.cpp and ollama.

Read at llama.cpp 0c1e570 (vendored by llama-cpp-python 0.3.36):

- the factors are the tensors ``rope_factors_long.weight`` and ``rope_factors_short.weight``
  (float32, ``n_rot / 2`` values), loaded per layer (``TENSOR_DUPLICATED``) only by the
  architectures of :data:`LONGROPE_ARCHS` (``src/models/*.cpp``), whose graphs pass
  ``get_rope_factors`` to ``ggml_rope_ext``. Any other architecture would refuse the copy
  (``llama-model-loader.cpp``: "wrong number of tensors");
- ``get_rope_factors`` (``src/llama-model.cpp``) returns ``rope_freqs`` when the file has
  it (so it is removed), else the long set once the context per sequence (``-c``) exceeds
  ``n_ctx_orig_yarn`` (``{arch}.rope.scaling.original_context_length``), else the short;
- ``{arch}.rope.scaling.type`` ``longrope`` keeps ``yarn_ext_factor`` at 0 (no ramp), and no
  ``rope.scaling.factor`` is written (its inverse would scale every frequency again);
- cos/sin are multiplied by ``{arch}.rope.scaling.attn_factor`` (``src/llama-context.cpp``:
  ``yarn_attn_factor *= rope_attn_factor``): the attention factor transformers computes,
  ``sqrt(1 + ln(factor) / ln(original))`` unless the scaling sets it;
- ``{arch}.context_length`` becomes the target (llama-server's cap per slot).

The copy reads back through :func:`posenc.integrations.gguf.rotary_from_gguf` as the same
scaling, up to float32 rounding of the factors and of the attention factor.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from posenc._errors import PosEncError, check_int, describe
from posenc.integrations._engine_llama import GGUF_VALUE_TYPES
from posenc.integrations.gguf_write import write_scaled_gguf
from posenc.integrations.spelling import is_transformers_spelling, posenc_spelling
from posenc.rotary.frequencies import LongRopeScaling, parse_scaling, rope_frequencies

__all__ = ["LONGROPE_ARCHS", "longrope_gguf", "write_longrope_gguf"]

#: The architectures whose llama.cpp loader creates ``rope_factors_long`` / ``_short`` and
#: whose graph rotates with them (llama.cpp 0c1e570, ``src/models/*.cpp``).
LONGROPE_ARCHS = (
    "llama",
    "deci",
    "phi3",
    "phimoe",
    "mistral3",
    "apertus",
    "granite",
    "granitemoe",
    "granite_swa",
    "minicpm",
    "minicpm3",
    "step35",
)


def _longrope(scaling: Any) -> LongRopeScaling:
    """``scaling`` (a :class:`LongRopeScaling`, or a dict in posenc's or transformers'
    spelling) as the dataclass; any other type refused."""
    if isinstance(scaling, Mapping) and is_transformers_spelling(scaling):
        scaling = posenc_spelling(scaling)
    params = parse_scaling(scaling) if isinstance(scaling, (Mapping, LongRopeScaling)) else None
    if not isinstance(params, LongRopeScaling):
        kind = getattr(params, "type", None) or describe(scaling)
        raise PosEncError(f"scaling must be a longrope scaling (its factors), got {kind}")
    for name in ("short_factor", "long_factor"):
        values = np.asarray(getattr(params, name), dtype=np.float64)
        with np.errstate(over="ignore"):
            stored = values.astype(np.float32)
        if not np.isfinite(stored).all() or (stored <= 0).any():
            at = int(np.argmax(~np.isfinite(stored) | (stored <= 0)))
            raise PosEncError(
                f"scaling {name}[{at}] must be positive and finite in float32 (a GGUF "
                f"tensor's type), got {float(values[at])!r}"
            )
    return params


def longrope_gguf(
    scaling: Any, *, arch: str, target: int, rotary_dim: int | None = None
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """The keys, their GGUF types and the tensors a GGUF copy of architecture ``arch``
    needs so that llama.cpp, run with ``-c target``, rotates with ``scaling`` (LongRoPE);
    ``rotary_dim`` (when known) the file's rotated channels, twice the factors' count.

    Returns:
        ``(metadata, types, tensors)`` for
        :func:`posenc.integrations.gguf_write.write_scaled_gguf`: ``rope_freqs.weight``
        set to ``None`` (removed); other ``rope.scaling`` keys of the input are the caller's
        to remove.

    Raises:
        PosEncError: not a longrope scaling, factors not positive or not finite in float32,
            their count not ``rotary_dim / 2``, an architecture llama.cpp reads no LongRoPE
            factors for, a ``target`` that is no length.
    """
    params = _longrope(scaling)
    target = check_int("target", target, min=1, max=2**32 - 1)  # context_length: a uint32
    if arch not in LONGROPE_ARCHS:
        raise PosEncError(
            f"llama.cpp reads LongRoPE's factor tensors only for the architectures "
            f"{', '.join(LONGROPE_ARCHS)} (llama.cpp 0c1e570 src/models/*.cpp), got {arch!r}"
        )
    if rotary_dim is not None and len(params.long_factor) != rotary_dim // 2:
        raise PosEncError(
            f"scaling long_factor must hold rotary_dim / 2 = {rotary_dim // 2} factors (one "
            f"per rotated pair of the file), got {len(params.long_factor)}"
        )
    # the attention factor: LongRoPE's, whatever the base (the dim only matches the factors)
    _, scale = rope_frequencies(2 * len(params.long_factor), scaling=params)
    rope = f"{arch}.rope.scaling."
    metadata: dict[str, Any] = {
        f"{arch}.context_length": target,
        rope + "type": "longrope",
        rope + "original_context_length": params.original_max_position,
        rope + "attn_factor": float(scale),
    }
    types = {k: GGUF_VALUE_TYPES[k.removeprefix(arch + ".")] for k in metadata}
    tensors: dict[str, Any] = {
        "rope_factors_long.weight": list(params.long_factor),
        "rope_factors_short.weight": list(params.short_factor),
        "rope_freqs.weight": None,
    }
    return metadata, types, tensors


def write_longrope_gguf(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    scaling: Any,
    *,
    target: int,
    overwrite: bool = False,
    check: Callable[[Path], object] | None = None,
) -> dict[str, Any]:
    """Write ``dst``, a copy of the GGUF file ``src`` that llama.cpp runs at ``target``
    tokens with the LongRoPE ``scaling`` (:func:`longrope_gguf`'s keys and tensors; the
    input's other ``rope.scaling`` keys removed). The copy is read back by
    :func:`~posenc.integrations.gguf.rotary_from_gguf` (every layer type) before ``check``
    runs; ``overwrite`` and ``check`` as
    :func:`~posenc.integrations.gguf_write.write_scaled_gguf`, which writes it and whose
    record it returns.

    Raises:
        PosEncError: what :func:`longrope_gguf` and ``write_scaled_gguf`` refuse, or a file
            whose RoPE posenc cannot read.
        OSError: the environment refuses the write.
    """
    from posenc.integrations.gguf import gguf_layer_types, gguf_rope_metadata, rotary_from_gguf

    _longrope(scaling)  # the scaling first: a bad one is refused before the file is read
    for name, value in (("src", src), ("dst", dst)):
        if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
            raise PosEncError(f"{name} must be the path of a GGUF file, got {value!r}")
    if not Path(src).is_file():
        raise PosEncError(f"src must be an existing GGUF file, got {str(src)!r}")
    held = gguf_rope_metadata(src)  # the input's own scaling may be one posenc cannot read
    arch = str(held.get("general.architecture"))
    dim = held.get(f"{arch}.rope.dimension_count")
    metadata, types, tensors = longrope_gguf(
        scaling, arch=arch, target=target, rotary_dim=dim if isinstance(dim, int) else None
    )
    stale = [k for k in held if k.startswith(f"{arch}.rope.scaling.") and k not in metadata]
    metadata.update(dict.fromkeys(stale))

    def read_back(path: Path) -> None:
        for layer in gguf_layer_types(path):  # the factors' count against the file's heads
            rotary_from_gguf(path, layer=layer)
        if check is not None:
            check(path)

    return write_scaled_gguf(
        src, dst, metadata, types=types, overwrite=overwrite, check=read_back, tensors=tensors
    )
