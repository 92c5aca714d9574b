"""What a transformers config does not spell out, per ``model_type``.

transformers keeps some RoPE facts in each family's modeling code rather than in its
config: the channel pairing its ``rotate_half`` / apply function uses, the default M-RoPE
sections its rotary module falls back to, and class defaults a ``config.json`` dict omits.
These tables hold them, read from transformers 5.24's modeling files; ``tests/integrations/
test_hf_families.py`` checks every entry (and every family not listed) against the installed
transformers, so a family whose code changes fails there rather than here.
"""

from __future__ import annotations

from typing import Any

# Families whose attention pairs channels (2i, 2i + 1): an interleaved ``rotate_half``
# (Cohere, GLM, ERNIE 4.5, Helium, Moonshine, GPT-J's ``rotate_every_two``), a complex
# rotation of adjacent pairs (Llama 4, DeepSeek-V2, PE), or DeepSeek's
# ``apply_rotary_pos_emb_interleave`` called unconditionally by the main attention (its
# output is in half order: the same dot products, channels permuted alike in q and k).
INTERLEAVED = frozenset(
    {
        "axk2",
        "bailing_hybrid",
        "codegen",
        "cohere",
        "cohere2",
        "cohere2_moe",
        "deepseek_v2",
        "deepseek_v32",
        "ernie4_5",
        "ernie4_5_moe",
        "glm",
        "glm4",
        "glm_moe_dsa",
        "gptj",
        "helium",
        "llama4",
        "llama4_text",
        "longcat_flash",
        "mistral_large4",
        "mistral_large4_text",
        "moonshine",
        "moonshine_streaming",
        "openai_privacy_filter",
        "pe_audio_encoder",
        "pe_audio_video_encoder",
        "pe_video_encoder",
    }
)

# Families that interleave only when ``config.rope_interleave`` is true (DeepSeek-V3 and its
# MLA descendants); the value is the config class's default, for dicts that omit the key.
ROPE_INTERLEAVE_DEFAULT = {
    "axk1": True,
    "deepseek_v3": True,
    "glm4_moe_lite": True,
    "mistral4": True,
    "youtu": True,
}

# Families whose rotary channels are the config's ``rotary_dim`` (a count of the first
# channels; GPT-J, CodeGen), not ``partial_rotary_factor`` (MiniMax-M3 has a ``rotary_dim``
# attribute its rotary module does not read).
ROTARY_DIM_ATTRIBUTE = frozenset({"gptj", "codegen"})

# Contiguous M-RoPE (Qwen2-VL): the sections transformers' rotary module uses when the
# config gives none.
MROPE_DEFAULT_SECTIONS: dict[str, tuple[int, ...]] = {
    "qwen2_vl": (16, 24, 24),
    "qwen2_vl_text": (16, 24, 24),
    "qwen2_5_vl": (16, 24, 24),
    "qwen2_5_vl_text": (16, 24, 24),
    "qwen2_5_omni": (16, 24, 24),
    "qwen2_5_omni_thinker": (16, 24, 24),
    "qwen2_5_omni_text": (16, 24, 24),
}

_MROPE_INTERLEAVED = (
    "M-RoPE with sections interleaved across frequencies (Qwen3-VL's apply_interleaved_mrope "
    "or a recomposition of the frequencies), which posenc's contiguous sections= cannot express"
)
_MROPE_OTHER = "M-RoPE whose sections are applied by its own apply function (not read yet)"
_PER_LAYER_HEAD_DIM = (
    "a head_dim that varies per layer (config.per_layer_config) and 'proportional' RoPE "
    "(pairs across the whole head): not read yet"
)

# Families posenc cannot express yet: model_type -> what is missing. rotary_from_config
# raises PosEncError naming both before it builds anything.
UNSUPPORTED: dict[str, str] = {
    "nanochat": "rotation by -theta (its rotate_half is cat(x2, -x1)); posenc rotates by +theta",
    "deepseek_v4": "rotary on the last qk_rope_head_dim channels of each head ([nope | rope])",
    "cosmos3_edge_text": _MROPE_INTERLEAVED,
    "hy_v4_vl_text": _MROPE_INTERLEAVED,
    "cohere_compass_text": _MROPE_INTERLEAVED,
    "qwen3_vl_text": _MROPE_INTERLEAVED,
    "qwen3_vl_moe_text": _MROPE_INTERLEAVED,
    "qwen3_5_text": _MROPE_INTERLEAVED,
    "qwen3_5_moe_text": _MROPE_INTERLEAVED,
    "qwen3_omni_moe_text": _MROPE_INTERLEAVED,
    "qwen3_omni_moe": _MROPE_INTERLEAVED,
    "qwen4_exp_text": _MROPE_INTERLEAVED,
    "ernie4_5_vl_moe_text": _MROPE_OTHER,
    "glm4v_text": _MROPE_OTHER,
    "glm4v_moe_text": _MROPE_OTHER,
    "glm_image_text": _MROPE_OTHER,
    "glm_ocr_text": _MROPE_OTHER,
    "paddleocr_vl": _MROPE_OTHER,
    "paddleocr_vl_text": _MROPE_OTHER,
    "hunyuan_vl_text": _MROPE_OTHER,
    "dots3_note_text": "per-layer-type MLA rope dims (indexed / sliding attention): not read yet",
    "gemma4_text": _PER_LAYER_HEAD_DIM,
    "gemma4_unified_text": _PER_LAYER_HEAD_DIM,
    "diffusion_gemma_text": _PER_LAYER_HEAD_DIM,
    "embedding_gemma2_text": _PER_LAYER_HEAD_DIM,
}

# Defaults of model classes that a plain dict cannot reveal (the config object knows them).
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt_neox": {"partial_rotary_factor": 0.25},
    "qwen2_vl": {"rope_theta": 1000000.0},
    "qwen2_vl_text": {"rope_theta": 1000000.0},
}


# GPT-2-style spellings of config attributes (transformers' ``attribute_map``; GPT-J,
# CodeGen): a ``config.json`` dict holds these names, the config object answers both.
DICT_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("n_embd",),
    "num_attention_heads": ("n_head",),
    "max_position_embeddings": ("n_positions",),
}

# Families whose legacy ``config.json`` (``rope_theta`` + ``rope_local_base_freq``, one
# ``rope_scaling``) transformers turns into RoPE parameters per layer type: the scaling and
# ``rope_theta`` go to full attention, ``rope_local_base_freq`` to sliding attention;
# the values are the class defaults (``default_theta``) for absent keys.
LEGACY_PER_LAYER_THETA: dict[str, dict[str, float]] = {
    "gemma3_text": {"global": 1_000_000.0, "local": 10_000.0},
    "gemma3n_text": {"global": 1_000_000.0, "local": 10_000.0},
    "t5gemma2_text": {"global": 1_000_000.0, "local": 10_000.0},
}


def legacy_per_layer(model_type: str, get: Any) -> dict[str, Any] | None:
    """Per-layer-type RoPE parameters of a legacy dict (``get``: its ``dict.get``), as
    transformers' ``convert_rope_params_to_dict`` builds them; ``None`` where none apply."""
    theta = LEGACY_PER_LAYER_THETA.get(model_type)
    if theta is None or get("rope_parameters") is not None:
        return None
    scaling = get("rope_scaling") or {}
    full = {"rope_type": "default", **scaling}
    full.setdefault("rope_theta", _or(get("rope_theta"), theta["global"]))
    local = _or(get("rope_local_base_freq"), theta["local"])
    return {
        "sliding_attention": {"rope_type": "default", "rope_theta": local},
        "full_attention": full,
    }


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def unsupported(model_type: str) -> str | None:
    """What posenc cannot express in this family (``None``: nothing known)."""
    return UNSUPPORTED.get(model_type)


def layout_of(model_type: str, rope_interleave: Any) -> str:
    """The pairing layout of a family's main attention."""
    if model_type in INTERLEAVED:
        return "interleaved"
    if model_type in ROPE_INTERLEAVE_DEFAULT:
        flag = ROPE_INTERLEAVE_DEFAULT[model_type] if rope_interleave is None else rope_interleave
        return "interleaved" if flag else "half"
    return "interleaved" if rope_interleave is True else "half"
