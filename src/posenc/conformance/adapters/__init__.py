"""Adapters for installable third-party implementations, run for real by
:func:`posenc.conformance.check`.

Each factory imports its framework when it is called (never at import: this package needs
NumPy only) and raises :class:`~posenc.PosEncError` naming what to install when it is
missing. Each docstring says which version it was checked against; ``docs/conformance.md``
holds the measured results.

- :mod:`~posenc.conformance.adapters.keras_hub`: ``SinePositionEncoding`` and
  ``RotaryEmbedding`` (keras-hub 0.32.0, Keras 3.15.1 on JAX 0.10.2);
- :mod:`~posenc.conformance.adapters.rotary_embedding_torch`: ``RotaryEmbedding``, plain and
  xPos (rotary-embedding-torch 0.9.1, torch 2.13);
- :mod:`~posenc.conformance.adapters.x_transformers`: ``RotaryEmbedding`` (plain and xPos),
  ``ScaledSinusoidalEmbedding``, ``AlibiPositionalBias``, ``RelativePositionBias``
  (x-transformers 2.31.10, torch 2.13).
"""

from __future__ import annotations

from posenc.conformance.adapters.keras_hub import (
    keras_hub_rotary_embedding,
    keras_hub_sine_position_encoding,
)
from posenc.conformance.adapters.rotary_embedding_torch import (
    rotary_embedding_torch_rope,
    rotary_embedding_torch_xpos,
)
from posenc.conformance.adapters.x_transformers import (
    x_transformers_alibi,
    x_transformers_rope,
    x_transformers_sinusoidal,
    x_transformers_t5,
    x_transformers_xpos,
)

__all__ = [
    "keras_hub_rotary_embedding",
    "keras_hub_sine_position_encoding",
    "rotary_embedding_torch_rope",
    "rotary_embedding_torch_xpos",
    "x_transformers_alibi",
    "x_transformers_rope",
    "x_transformers_sinusoidal",
    "x_transformers_t5",
    "x_transformers_xpos",
]
