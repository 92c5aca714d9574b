"""Contextual encodings: a logit term computed from the logits, queries and keys themselves.

Members implement :class:`posenc._base.ContextualEncoding` (``contextual_bias_at``), and
:func:`posenc.attention` adds their term on its eager and query-chunked paths; a new member
works there and in ``TinyTransformer`` without touching either. Each is a pure function
plus a thin module, as every family.

- :mod:`posenc.contextual.cope`: CoPE (Golovneva et al., 2024), positions counted by gates
  on ``q . k``.
- :mod:`posenc.contextual.cope_fused`: attention with a term of CoPE's counted form fused on
  the CPU (``cope_cpu.c``, built by :mod:`posenc._native`), what ``posenc.attention`` runs for
  CoPE on CPU tensors.
"""

from posenc.contextual.cope import (
    POSITION_LOGITS,
    CoPEBias,
    cope_bias,
    cope_position_logits,
    cope_positions,
)

__all__ = ["POSITION_LOGITS", "CoPEBias", "cope_bias", "cope_position_logits", "cope_positions"]
