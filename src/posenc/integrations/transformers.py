"""posenc and transformers: read a model's config, patch a loaded model, and the factors
some families multiply beside RoPE.

- configs in: :func:`rotary_from_config` (the :class:`posenc.RotaryEmbedding` equal to a
  family's rotary embedding, read from the config alone), :func:`scaling_from_transformers`
  (one ``rope_scaling`` dict), :func:`rope_layer_types` (the ``layer_type=`` values a config
  has);
- a model patched: :func:`patch` / :func:`unpatch` put posenc's RoPE inside a loaded model
  of :data:`PATCHABLE_FAMILIES` and take it out again (:class:`PatchedRotaryEmbedding` is
  the rotary module it installs);
- beside the rotation: :class:`QueryScale` and :func:`query_scale_from_config` (queries
  scaled by position: Llama 4's NoPE layers, Ministral 3 / Mistral 4's
  ``llama_4_scaling_beta``), :func:`rope_layers` (which layers rotate at all),
  :func:`softmax_scale_factor` (DeepSeek MLA's YaRN factor on the softmax scale).

These modules read transformers' configs (``rope_type``, ``original_max_position_embeddings``,
``max_position_embeddings``, ...); the translation of one scaling dict, both ways, is
:mod:`posenc.integrations.spelling`'s (through it ``RotaryEmbedding(scaling=)`` takes either
spelling). Reading a config dict needs no transformers installed; :func:`patch` needs it (the
``hf`` extra).
"""

from __future__ import annotations

from posenc.integrations._hf_config import rotary_from_config, scaling_from_transformers
from posenc.integrations._hf_patch import (
    PATCHABLE_FAMILIES,
    PatchedRotaryEmbedding,
    patch,
    unpatch,
)
from posenc.integrations._hf_query_scale import (
    QueryScale,
    query_scale_from_config,
    rope_layers,
    softmax_scale_factor,
)
from posenc.integrations._hf_reader import rope_layer_types

__all__ = [
    "PATCHABLE_FAMILIES",
    "PatchedRotaryEmbedding",
    "QueryScale",
    "patch",
    "query_scale_from_config",
    "rope_layer_types",
    "rope_layers",
    "rotary_from_config",
    "scaling_from_transformers",
    "softmax_scale_factor",
    "unpatch",
]
