"""keras-hub's ``SinePositionEncoding`` and ``RotaryEmbedding``, run for real on Keras'
JAX backend.

Checked against keras-hub 0.32.0 with Keras 3.15.1 and JAX 0.10.2 (CPU). What it does, read
from ``keras_hub/src/layers/modeling/``: ``SinePositionEncoding`` interleaves (even channels
sin, odd cos) at ``base^(-2 (i // 2) / d)`` and forms the positions, the rates and the
angles in the layer's compute dtype; ``RotaryEmbedding`` pairs halves, forms its angles in
float32 and casts cos and sin to the compute dtype before the multiply; its ``rope_type``
is ``"linear"``, ``"dynamic"`` (the frequencies divided by ``factor^(d / (d - 2))``: one
factor for every channel) or ``"yarn"``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from posenc.conformance._api import Adapter, Unsupported
from posenc.conformance.adapters._common import check_dtype, missing, no_extra, scaling_kind

__all__ = ["keras_hub_rotary_embedding", "keras_hub_sine_position_encoding"]

#: posenc's scaling type -> keras-hub's ``rope_type`` (posenc's ``ntk`` and ``dynamic`` both
#: go to keras-hub's ``dynamic``, which names itself after them).
ROPE_TYPES = {
    "default": "linear",
    "linear": "linear",
    "ntk": "dynamic",
    "dynamic": "dynamic",
    "yarn": "yarn",
}


def _keras() -> tuple[Any, Any, str]:
    """``(keras, keras_hub, source)``, Keras on the JAX backend unless one is chosen."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    try:
        import keras
        import keras_hub
    except ImportError as e:
        raise missing("keras-hub", "keras-hub jax", e) from None
    backend = keras.backend.backend()
    source = f"keras-hub {keras_hub.__version__} (Keras {keras.__version__}, {backend} backend)"
    return keras, keras_hub, source


def keras_hub_sine_position_encoding(dtype: str = "float32") -> Adapter:
    """``keras_hub.layers.SinePositionEncoding`` as a sinusoidal-table adapter.

    Each position ``p`` is one call with ``start_index=p`` on a ``[1, 1, dim]`` input: the
    layer's own path (``arange(1) + start_index`` cast to the compute dtype), no positions
    passed in from outside.

    Args:
        dtype: the layer's dtype policy, ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns: an :class:`Adapter` (``table``, family ``sinusoidal``, layout interleaved).

    Raises:
        PosEncError: keras-hub (or a Keras backend) is not installed, or a bad ``dtype``.
    """
    dtype = check_dtype(dtype)
    keras, keras_hub, source = _keras()

    def table(positions: np.ndarray, dim: int, *, base: float) -> np.ndarray:
        layer = keras_hub.layers.SinePositionEncoding(max_wavelength=base, dtype=dtype)
        x = keras.ops.zeros((1, 1, dim), dtype=dtype)
        rows = [layer(x, start_index=int(p)) for p in np.asarray(positions).reshape(-1)]
        return np.stack([np.asarray(keras.ops.convert_to_numpy(r), np.float64)[0, 0] for r in rows])

    return Adapter(
        f"keras-hub SinePositionEncoding [{dtype}]",
        "table",
        "sinusoidal",
        table,
        convention={"layout": "interleaved", "order": "sin_cos"},
        dtype=dtype,
        source=source,
    )


def keras_hub_rotary_embedding(dtype: str = "float32") -> Adapter:
    """``keras_hub.layers.RotaryEmbedding`` as a rotation adapter.

    q and k ``[seq, heads, dim]`` go in as ``[1, seq, heads, dim]`` (``sequence_axis=1``)
    with ``positions=``; a partial ``rotary_dim`` rotates the first ``rotary_dim`` channels
    through the layer and passes the rest, as keras-hub's GPT-NeoX attention does. Scalings:
    default, linear (``scaling_factor``), ntk and dynamic (``rope_type="dynamic"``,
    ``scaling_factor=factor``), yarn (``rope_type="yarn"``, its ``beta_fast``, ``beta_slow``,
    ``original_max_position_embeddings``, ``truncate``); others raise
    :class:`~posenc.conformance.Unsupported`.

    Args:
        dtype: the layer's dtype policy (and q, k's), ``"float32"``, ``"bfloat16"`` or
            ``"float16"``.

    Returns: an :class:`Adapter` (``rotate``, family ``rope``, layout half).

    Raises:
        PosEncError: keras-hub is not installed, or a bad ``dtype``.
    """
    dtype = check_dtype(dtype)
    keras, keras_hub, source = _keras()

    def rotate(
        q: np.ndarray,
        k: np.ndarray,
        positions: np.ndarray,
        *,
        base: float,
        scaling: Mapping[str, Any] | None,
        rotary_dim: int,
        **extra: Any,
    ) -> tuple[np.ndarray, np.ndarray]:
        no_extra(extra, "keras-hub RotaryEmbedding")
        kind = scaling_kind(scaling, tuple(ROPE_TYPES), "keras-hub RotaryEmbedding")
        options: dict[str, Any] = {"rope_type": ROPE_TYPES[kind]}
        s = dict(scaling or {})
        if kind != "default":
            options["scaling_factor"] = float(s["factor"])
        if kind == "yarn":
            if any(s.get(key) is not None for key in ("attention_factor", "mscale")):
                raise Unsupported("keras-hub's YaRN has no attention_factor or mscale")
            options.update(
                beta_fast=float(s.get("beta_fast", 32.0)),
                beta_slow=float(s.get("beta_slow", 1.0)),
                original_max_position_embeddings=int(s["original_max_position"]),
                truncate=bool(s.get("truncate", True)),
            )
        layer = keras_hub.layers.RotaryEmbedding(max_wavelength=base, dtype=dtype, **options)
        pos = keras.ops.convert_to_tensor(np.asarray(positions))
        out = []
        for x in (q, k):
            head = keras.ops.cast(np.asarray(x)[None], dtype)  # [1, seq, heads, dim]
            rotated = layer(head[..., :rotary_dim], positions=pos)
            full = keras.ops.concatenate([rotated, head[..., rotary_dim:]], axis=-1)
            out.append(np.asarray(keras.ops.convert_to_numpy(full), np.float64)[0])
        return out[0], out[1]

    return Adapter(
        f"keras-hub RotaryEmbedding [{dtype}]",
        "rotate",
        "rope",
        rotate,
        convention={"layout": "half"},
        dtype=dtype,
        source=source,
    )
