"""Gated encodings: a logit term from per-token gates the model computes.

Members implement :class:`posenc._base.GatedEncoding` (``check_gates``, ``gate_bias_at``,
``gate_score_mod_at``); :func:`posenc.attention` takes the gates as ``gates=[b, h, k]``,
and ``TinyTransformer`` gives every layer that uses one a gate projection ``dim ->
num_heads``. A new member works in both without touching either.

- :mod:`posenc.gated.fox`: forgetting attention (Lin et al., 2025), log forget gates summed
  between key and query.
"""

from posenc.gated.fox import FoXBias, fox_bias, fox_cumulative

__all__ = ["FoXBias", "fox_bias", "fox_cumulative"]
