"""Bias encodings: a term added to the scaled attention logits, from (query, key, head).

Each family is a pure function (``*_bias``) and a thin :class:`posenc._base.BiasEncoding`
module whose ``bias(q_len, k_len, *, q_positions, k_positions)`` returns ``[h, q, k]``
(``[b, h, q, k]`` for batched positions) and whose ``score_mod`` computes the same bias from
indices inside FlexAttention.
"""

from posenc.bias.alibi import ALiBi, alibi_bias, alibi_slopes
from posenc.bias.t5 import T5RelativeBias, t5_relative_bias, t5_relative_bucket

__all__ = [
    "ALiBi",
    "T5RelativeBias",
    "alibi_bias",
    "alibi_slopes",
    "t5_relative_bias",
    "t5_relative_bucket",
]
