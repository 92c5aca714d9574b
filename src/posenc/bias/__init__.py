"""Bias encodings: a term added to the scaled attention logits, from (query, key, head).

Each family is a pure function and a thin :class:`posenc._base.BiasEncoding` module named
``*Bias``. ``bias(q_len, k_len, *, q_positions, k_positions)`` validates and resolves the
positions once and returns ``[h, q, k]`` (``[b, h, q, k]`` for batched positions) through
``bias_at(q_positions, k_positions)``, which takes positions already resolved by
:func:`posenc.positions.resolve_pair` and validates nothing (what attention calls). Except
for the query-dependent Shaw keys, ``score_mod`` (validating) and ``score_mod_at``
(resolved positions) compute the same bias from indices inside FlexAttention.

Terms that depend on the tokens are not biases of positions and live with their own
protocols: CoPE in :mod:`posenc.contextual`, forgetting attention in :mod:`posenc.gated`.

Deprecated for one release, with a ``DeprecationWarning``: the old class names (``ALiBi``,
``FIRE``, ``Kerple``, ``ShawRelative``), and CoPE's and forgetting attention's names here
and in ``posenc.bias.cope`` / ``posenc.bias.fox`` (they live in their own rooms).
"""

from typing import Any

from posenc._deprecated import moved
from posenc.bias._common import renamed
from posenc.bias.alibi import ALiBiBias, alibi_bias, alibi_slopes
from posenc.bias.fire import FIREBias, fire_bias, fire_normalized_distance
from posenc.bias.kerple import KerpleBias, kerple_bias
from posenc.bias.shaw import ShawRelativeBias, shaw_relative_logits, shaw_relative_values
from posenc.bias.t5 import T5RelativeBias, t5_relative_bias, t5_relative_bucket

__all__ = [
    "ALiBiBias",
    "FIREBias",
    "KerpleBias",
    "ShawRelativeBias",
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

# Old name -> class (posenc 0.1.0); removed in the next release.
_RENAMED = {
    "ALiBi": ALiBiBias,
    "FIRE": FIREBias,
    "Kerple": KerpleBias,
    "ShawRelative": ShawRelativeBias,
}


# Moved name -> its new module (after 0.1.0); removed in the next release.
_MOVED = {
    **dict.fromkeys(("CoPEBias", "cope_bias", "cope_position_logits", "cope_positions"), "cope"),
    **dict.fromkeys(("FoXBias", "fox_bias", "fox_cumulative"), "fox"),
}
_NEW_HOMES = {"cope": "posenc.contextual.cope", "fox": "posenc.gated.fox"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return moved(__name__, name, _NEW_HOMES[_MOVED[name]], _MOVED)
    return renamed(__name__, name, _RENAMED)
