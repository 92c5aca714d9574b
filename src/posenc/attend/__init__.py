"""Attention that takes any encoding, as one room: dispatch, paths, Flex, prepared encodings.

The public face is short: :func:`attention` (``posenc.attention``), :func:`prepare_encoding`
and :class:`PreparedEncoding` (an encoding's positions and derived tensors, computed once
per forward pass), and :data:`BACKENDS`. Inside:

- :mod:`posenc.attend.dispatch`: ``attention`` itself: validation, choosing a path;
- :mod:`posenc.attend.paths`: the eager and SDPA paths and the one mask rule they share;
- :mod:`posenc.attend.folded`: SDPA with a separable gated term (forgetting attention)
  folded into the keys;
- :mod:`posenc.attend.flex`: the FlexAttention path (compiled kernels, block masks);
- :mod:`posenc.attend.prepared`: ``PreparedEncoding`` and ``prepare_encoding``.

The package knows the encoding kinds of :mod:`posenc._base` (their protocols), never a
concrete encoding class, and builds names and configs with :func:`posenc.registry.build`.
"""

from posenc.attend.dispatch import BACKENDS, FLEX_MIN_BIAS_BYTES, attention
from posenc.attend.prepared import PreparedEncoding, prepare_encoding

__all__ = ["BACKENDS", "FLEX_MIN_BIAS_BYTES", "PreparedEncoding", "attention", "prepare_encoding"]
