"""The families :func:`~._hf_patch.patch` covers, and how each computes and applies RoPE.

Per ``model_type`` of the text config: the modeling module (``transformers.models.<module>``),
the apply function(s) its attention calls with their pairing and parameters (the stand-ins
of :mod:`._hf_patch_applies`), and the form its rotary module returns (the outputs of
:class:`~._hf_patch_rotary.PatchedRotaryEmbedding`). Read from transformers 5.24's modeling
files; ``tests/integrations/test_hf_patch*.py`` builds a tiny model of every family here.

- Most families: ``apply_rotary_pos_emb(q, k, cos, sin)``, pairs as
  :func:`~._hf_families.layout_of` says, the rotary module's ``(cos, sin)``; DeepSeek-V3 also
  ``apply_rotary_pos_emb_interleave``.
- M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): the same apply function (their rotary modules
  recompose the sections into cos/sin), with 3-D ``position_ids``.
- GPT-J: ``apply_rotary_pos_emb(tensor, sin, cos)`` on the first ``rotary_dim`` channels,
  interleaved, after its rotary module's table ``embed_positions`` gave ``(sin, cos)``.
- Llama 4 (text): ``apply_rotary_emb(xq, xk, freqs_cis)``, interleaved pairs as a complex
  product, its rotary module's complex ``freqs_cis`` (its NoPE layers call nothing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from posenc.integrations import _hf_families as _families
from posenc.integrations._hf_patch_applies import (
    COMPLEX,
    ONE_TENSOR,
    STANDARD,
    WITH_POSITION_IDS,
    Pairing,
)
from posenc.integrations._hf_patch_rotary import Output

__all__ = [
    "FAMILIES",
    "INTERLEAVE_APPLY",
    "NOPE_FULL_ATTENTION",
    "NOPE_MODELS",
    "NO_POSITION_IDS",
    "PATCHABLE_FAMILIES",
    "REFUSED",
    "TRAILING_ROTARY",
    "Family",
]

# The apply function the attention of a rope_interleave family (DeepSeek-V3) calls when
# config.rope_interleave is true, instead of apply_rotary_pos_emb.
INTERLEAVE_APPLY = "apply_rotary_pos_emb_interleave"


@dataclasses.dataclass(frozen=True)
class Family:
    """A family's modeling module (``transformers.models.<module>``), per apply function its
    attention calls that function's pairing and parameters (checked when patching), and the
    form its rotary module returns."""

    module: str
    applies: Mapping[str, tuple[Pairing, tuple[str, ...]]]
    output: Output = "cos_sin"


def _family(model_type: str, module: str | None = None) -> Family:
    """The apply functions of a family (whose modeling module is ``module``, default its
    ``model_type``): ``apply_rotary_pos_emb`` pairs as the family's attention does without
    ``rope_interleave`` (:func:`~._hf_families.layout_of`: Cohere and GLM interleaved, ...),
    and a ``rope_interleave`` family also has :data:`INTERLEAVE_APPLY`."""
    applies: dict[str, tuple[Pairing, tuple[str, ...]]] = {
        "apply_rotary_pos_emb": (_families.layout_of(model_type, False), STANDARD)
    }
    if model_type in _families.ROPE_INTERLEAVE_DEFAULT:
        applies[INTERLEAVE_APPLY] = ("deinterleave", WITH_POSITION_IDS)
    return Family(module or model_type, applies)


# The families calling apply_rotary_pos_emb(q, k, cos, sin) with (cos, sin) from their
# rotary module, by model_type (that of the text config; the module of the same name).
_STANDARD_FAMILIES = (
    "llama mistral ministral mixtral qwen2 qwen2_moe qwen3 qwen3_moe gemma gemma2 phi phi3 "
    "gpt_neox olmo olmo2 olmo3 olmoe granite granitemoe stablelm starcoder2 smollm3 arcee "
    "exaone4 seed_oss cohere cohere2 glm glm4 deepseek_v3"
).split()
# Text configs whose modeling module is their multimodal model's.
_TEXT_OF = {
    "gemma3_text": "gemma3",
    "qwen2_vl_text": "qwen2_vl",  # M-RoPE, contiguous sections
    "qwen2_5_vl_text": "qwen2_5_vl",
    "qwen3_vl_text": "qwen3_vl",  # M-RoPE, interleaved sections
}
FAMILIES: dict[str, Family] = {
    **{t: _family(t) for t in _STANDARD_FAMILIES},
    **{t: _family(t, module) for t, module in _TEXT_OF.items()},
    "gptj": Family("gptj", {"apply_rotary_pos_emb": ("interleaved", ONE_TENSOR)}, "sin_cos"),
    "llama4_text": Family("llama4", {"apply_rotary_emb": ("interleaved", COMPLEX)}, "complex"),
}

PATCHABLE_FAMILIES: tuple[str, ...] = tuple(sorted(FAMILIES))
"""The ``model_type`` values :func:`patch` accepts (those of the text config)."""

# Families refused with a reason more specific than "not checked" (facts of transformers);
# patch also names what rotary_from_config refuses and models with no rotary module at all.
REFUSED = {
    "deepseek_v2": "its attention rotates [b, h, s, d] queries and keys by complex freqs_cis "
    "(its own apply_rotary_emb), a form patch has no stand-in for yet",
    **dict.fromkeys(("gpt2", "bert"), "it has no rotary embedding (learned positions)"),
    **dict.fromkeys(
        ("bloom", "mpt"), "it has no rotary embedding (ALiBi: a bias on the attention logits)"
    ),
    "llama4_vision_model": "its vision encoder's rotary is 2-D (patch rows and columns, complex "
    "freqs_cis), not the text RoPE patch replaces; patch the Llama 4 text model",
}

# For position maps (:mod:`._hf_patch_remap`), read from the attention forwards of
# transformers 5.25. Families whose full-attention layers skip RoPE: Cohere 2 always,
# EXAONE 4 when its config has a sliding window.
NOPE_FULL_ATTENTION = {"cohere2": "always", "exaone4": "with a sliding window"}
# Families with no RoPE at all whose full-attention layers are NoPE (Kimi Linear: MLA
# without RoPE beside linear-attention layers), told so rather than "not supported".
NOPE_MODELS = ("kimi_linear",)
# MLA families: the attention sees q = cat(q_pass, q_rot), its rotary channels trailing.
TRAILING_ROTARY = frozenset({"deepseek_v3"})
# Families whose attention layers are handed no position_ids.
NO_POSITION_IDS = frozenset({"llama4_text"})
