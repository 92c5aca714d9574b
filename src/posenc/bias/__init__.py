"""Bias encodings: a term added to the scaled attention logits, from (query, key, head).

Each family is a pure function and a thin :class:`posenc._base.BiasEncoding` module whose
``bias(q_len, k_len, *, q_positions, k_positions)`` returns ``[h, q, k]`` (``[b, h, q, k]``
for batched positions) and, except for the query-dependent Shaw keys, whose ``score_mod``
computes the same bias from indices inside FlexAttention.
"""

from posenc.bias.alibi import ALiBi, alibi_bias, alibi_slopes
from posenc.bias.fire import FIRE, fire_bias, fire_normalized_distance
from posenc.bias.kerple import Kerple, kerple_bias
from posenc.bias.shaw import ShawRelative, shaw_relative_logits, shaw_relative_values
from posenc.bias.t5 import T5RelativeBias, t5_relative_bias, t5_relative_bucket

__all__ = [
    "FIRE",
    "ALiBi",
    "Kerple",
    "ShawRelative",
    "T5RelativeBias",
    "alibi_bias",
    "alibi_slopes",
    "fire_bias",
    "fire_normalized_distance",
    "kerple_bias",
    "shaw_relative_logits",
    "shaw_relative_values",
    "t5_relative_bias",
    "t5_relative_bucket",
]
