"""Bias encodings: a term added to the scaled attention logits, from (query, key, head).

Each family is a pure function and a thin :class:`posenc._base.BiasEncoding` module named
``*Bias``. ``bias(q_len, k_len, *, q_positions, k_positions)`` validates and resolves the
positions once and returns ``[h, q, k]`` (``[b, h, q, k]`` for batched positions) through
``bias_at(q_positions, k_positions)``, which takes positions already resolved by
:func:`posenc.positions.resolve_pair` and validates nothing (what attention calls). Except
for the query-dependent Shaw keys and the contextual and gated biases (CoPE, forgetting
attention: their term depends on the tokens, see :mod:`posenc.bias.cope` and
:mod:`posenc.bias.fox`), ``score_mod`` (validating) and ``score_mod_at`` (resolved
positions) compute the same bias from indices inside FlexAttention.

The names of posenc 0.1.0 (``ALiBi``, ``FIRE``, ``Kerple``, ``ShawRelative``) still work for
one release, with a ``DeprecationWarning``.
"""

from typing import Any

from posenc.bias._common import renamed
from posenc.bias.alibi import ALiBiBias, alibi_bias, alibi_slopes
from posenc.bias.cope import CoPEBias, cope_bias, cope_position_logits, cope_positions
from posenc.bias.fire import FIREBias, fire_bias, fire_normalized_distance
from posenc.bias.fox import FoXBias, fox_bias, fox_cumulative
from posenc.bias.kerple import KerpleBias, kerple_bias
from posenc.bias.shaw import ShawRelativeBias, shaw_relative_logits, shaw_relative_values
from posenc.bias.t5 import T5RelativeBias, t5_relative_bias, t5_relative_bucket

__all__ = [
    "ALiBiBias",
    "CoPEBias",
    "FIREBias",
    "FoXBias",
    "KerpleBias",
    "ShawRelativeBias",
    "T5RelativeBias",
    "alibi_bias",
    "alibi_slopes",
    "cope_bias",
    "cope_position_logits",
    "cope_positions",
    "fire_bias",
    "fire_normalized_distance",
    "fox_bias",
    "fox_cumulative",
    "kerple_bias",
    "shaw_relative_logits",
    "shaw_relative_values",
    "t5_relative_bias",
    "t5_relative_bucket",
]

# Old name -> class (posenc 0.1.0); removed in the next release.
_RENAMED = {
    "ALiBi": ALiBiBias,
    "FIRE": FIREBias,
    "Kerple": KerpleBias,
    "ShawRelative": ShawRelativeBias,
}


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, _RENAMED)
