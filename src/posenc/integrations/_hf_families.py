"""What a transformers config does not spell out, per ``model_type``.

transformers keeps some RoPE facts in each family's modeling code rather than in its
config: the channel pairing its ``rotate_half`` / apply function uses, the default M-RoPE
sections its rotary module falls back to, and class defaults a ``config.json`` dict omits.
These tables hold them, read from transformers 5.24's and 5.25's modeling files;
``tests/integrations/test_hf_families.py`` checks every entry (and every family not listed)
against the installed transformers, so a family whose code changes fails there rather than
here. The vision towers' axial rotaries have theirs in :mod:`posenc.integrations._hf_vision`.
"""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Any

from posenc._errors import PosEncError
from posenc.rotary.layout import Layout

# Families whose attention pairs channels (2i, 2i + 1): an interleaved ``rotate_half``
# (Cohere, GLM, ERNIE 4.5, Helium, Moonshine, GPT-J's ``rotate_every_two``), a complex
# rotation of adjacent pairs (Llama 4, DeepSeek-V2, PE), or DeepSeek's
# ``apply_rotary_pos_emb_interleave`` called unconditionally by the main attention (its
# output is in half order: the same dot products, channels permuted alike in q and k).
INTERLEAVED = frozenset(
    {
        "axk2",
        "bailing_hybrid",
        # BLT's rotate_half pairs (2i, 2i + 1) and its cos/sin are repeat_interleave'd: its
        # components' configs (the top-level "blt" config has no rotary of its own)
        "blt_global_transformer",
        "blt_local_decoder",
        "blt_local_encoder",
        "blt_patcher",
        "codegen",
        "cohere",
        "cohere2",
        "cohere2_moe",
        "deepseek_v2",
        "deepseek_v32",
        "deepseek_v4",
        "dots3_note_text",
        "ergo",  # its rotate_half pairs (2i, 2i + 1), its cos/sin repeat_interleave'd
        "ernie4_5",
        "ernie4_5_moe",
        "ernie4_5_vl_moe_text",
        "glm",
        "glm4",
        "glm4v_text",
        "glm_ocr_text",
        "glm_moe_dsa",
        "gptj",
        "helium",
        "hy_v4",  # from transformers 5.25 (LAYOUT_BEFORE)
        "hy_v4_vl_text",
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

# Families whose pairing changed in a transformers release: model_type -> (the release, the
# pairing of the releases before it). HY-V4's attention called ``apply_rotary_pos_emb``
# (half pairs) in 5.24 and DeepSeek's interleaved apply from 5.25 on: posenc pairs as the
# installed transformers does, and as the newest release without one (a dict read alone).
LAYOUT_BEFORE: dict[str, tuple[tuple[int, int], Layout]] = {"hy_v4": ((5, 25), "half")}

# Families that interleave only when ``config.rope_interleave`` is true (DeepSeek-V3 and its
# MLA descendants); the value is the config class's default, for dicts that omit the key.
ROPE_INTERLEAVE_DEFAULT = {
    "axk1": True,
    "deepseek_v3": True,
    "glm4_moe_lite": True,
    "mistral4": True,
    "youtu": True,
}

# MLA families whose ``partial_rotary_factor`` is a fraction of more than the rope part: the
# rotary dim is ``int(H * partial_rotary_factor)`` of the ``qk_rope_head_dim`` channels, with
# H = ``qk_nope_head_dim + qk_rope_head_dim`` (Mistral 4 sets ``head_dim`` to it, whatever a
# dict says; default factor ``qk_rope_head_dim / H``) or the config's ``head_dim`` (dots.3).
# Every other MLA family sets ``head_dim = qk_rope_head_dim``.
MLA_PARTIAL_OF: dict[str, str] = {"mistral4": "qk_nope+qk_rope", "dots3_note_text": "head_dim"}

# Families whose attention rotates the *last* rotary channels of each head ([nope | rope]:
# DeepSeek-V4, interleaved), ``int(head_dim * partial_rotary_factor)`` of the full head_dim
# (its ``qk_rope_head_dim`` is that count, not the module's head dim).
TRAILING_ROTARY = frozenset({"deepseek_v4"})

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
    **dict.fromkeys(
        (
            "cohere_compass_text",
            "cosmos3_edge_text",
            "hy_v4_vl_text",
            "qwen3_omni_moe_text",
            "qwen3_vl_text",
            "qwen3_vl_moe_text",
        ),
        (24, 20, 20),
    ),
    **dict.fromkeys(("qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp_text"), (11, 11, 10)),
    **dict.fromkeys(
        ("glm4v_text", "glm4v_moe_text", "glm_image_text", "glm_ocr_text"), (8, 12, 12)
    ),
    **dict.fromkeys(("paddleocr_vl", "paddleocr_vl_text"), (16, 24, 24)),
    "qwen2_5_omni_talker": (16, 24, 24),
    "qwen3_omni_moe_talker_text": (24, 20, 20),
    # ERNIE 4.5-VL, in its own (H, W, T) order (see MROPE_SPATIAL_INTERLEAVED)
    "ernie4_5_vl_moe_text": (22, 22, 20),
}

# M-RoPE whose rotary module splits the frequencies equally among its axes, with no
# sections in the config: model_type -> the number of axes (NeoMME: two, row and column,
# interleaved, ``[head_dim * partial / 4] * 2``; its positions ``[2, b, s]``).
MROPE_EQUAL_SECTIONS: dict[str, int] = {"neomme": 2}

# M-RoPE whose spatial axes alternate over the first frequencies and whose temporal axis
# takes the last ones (ERNIE 4.5-VL: ``mrope_section`` lists (H, W, T), the frequency j below
# H + W takes H for even j and W for odd j): posenc's ``section_layout="spatial_interleaved"``
# with the sections in the positions' axis order (T, H, W).
MROPE_SPATIAL_INTERLEAVED = frozenset({"ernie4_5_vl_moe_text"})

# Interleaved M-RoPE (Qwen3-VL's ``apply_interleaved_mrope`` / ``recomposition_frequencies``:
# frequency j takes axis j % 3 below 3 * sections[axis], else the temporal axis), whatever
# the config's ``mrope_interleaved`` / ``interleaved`` keys say (their configs ignore them
# and their rotary modules interleave unconditionally).
MROPE_INTERLEAVED = frozenset(
    {
        "cohere_compass_text",
        "cosmos3_edge_text",
        "hy_v4_vl_text",
        "neomme",
        "qwen3_5_text",
        "qwen3_5_moe_text",
        "qwen3_omni_moe",
        "qwen3_omni_moe_talker_text",
        "qwen3_omni_moe_text",
        "qwen3_vl_text",
        "qwen3_vl_moe_text",
        "qwen4_exp_text",
    }
)
# rope_parameters keys these families' configs accept and ignore (the flag above)
MROPE_IGNORED_KEYS = ("mrope_interleaved", "interleaved")

_HUNYUAN_DOUBLED = (
    "M-RoPE sections over the doubled (cos, cos) channels: the two channels of a pair can take "
    "different axes (not a rotation posenc can express)"
)

# Families posenc cannot express yet: model_type -> what is missing. rotary_from_config
# raises PosEncError naming both before it builds anything.
UNSUPPORTED: dict[str, str] = {"hunyuan_vl_text": _HUNYUAN_DOUBLED}

# Families whose rotate_half is cat(x2, -x1): a rotation by -theta (``direction="negative"``).
NEGATIVE_DIRECTION = frozenset({"nanochat"})

# Composite configs with no rotary of their own, whose components each build one:
# model_type -> the attributes holding the components' configs.
COMPONENTS: dict[str, tuple[str, ...]] = {
    "blt": ("encoder_config", "decoder_config", "global_config", "patcher_config"),
    "nemotron3_diarization": ("audio_config",),
    # PI0.5: the PaliGemma VLM's text model and the action expert (a Gemma config) each
    "pi05": ("vlm_config", "dit_config"),
}

# Families whose attention multiplies the queries by 1 + beta * ln(1 + floor(p / L)), with
# rope_parameters["llama_4_scaling_beta"] and its "original_max_position_embeddings" (a key
# their configs accept beside the scaling; see posenc.integrations._hf_query_scale).
LLAMA4_SCALING_BETA = frozenset({"ministral3", "mistral4"})

# Families whose attention multiplies its softmax scale by YaRN's mscale(factor,
# mscale_all_dim) ** 2 (``yarn_apply_mscale``: DeepSeek-V2 / V3's MLA and descendants).
MLA_SOFTMAX_MSCALE = frozenset(
    {
        "axk1",
        "axk2",
        "bailing_hybrid",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "glm4_moe_lite",
        "glm_moe_dsa",
        "hy_v4",
        "hy_v4_vl",
        "hy_v4_vl_text",
        "longcat_flash",
        "minicpm3",
        "mistral4",
        "mistral_large4",
        "mistral_large4_text",
        "youtu",
    }
)

# Llama 4's NoPE-layer temperature: its config class defaults.
_LLAMA4_TEMPERATURE = {"attn_temperature_tuning": True, "attn_scale": 0.1, "floor_scale": 8192}
NOPE_TEMPERATURE: dict[str, dict[str, Any]] = {
    "llama4": _LLAMA4_TEMPERATURE,
    "llama4_text": _LLAMA4_TEMPERATURE,
}

# Families with ``no_rope_layers`` (1 = RoPE, 0 = NoPE): the default NoPE interval.
NO_ROPE_LAYERS: dict[str, int] = {
    "llama4": 4,
    "llama4_text": 4,
    "smollm3": 4,
    "mistral_large4": 4,
    "mistral_large4_text": 4,
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


# Families whose config class gives the full-attention layers their own head dim
# (``global_head_dim``, popped in ``__post_init__`` with this default, into
# ``per_layer_config``) unless the dict holds ``per_layer_config`` itself.
GLOBAL_HEAD_DIM_DEFAULT: dict[str, int] = {
    "gemma4_text": 512,
    "gemma4_unified_text": 512,
    "diffusion_gemma_text": 512,
    "embedding_gemma2_text": 512,
}


# Per-layer attributes (``per_layer_config``) a rotary module reads.
PER_LAYER_ROPE_KEYS = ("head_dim",)


def layer_overrides(model_type: str, get: Any, layer_type: str) -> dict[str, Any]:
    """The RoPE attributes (:data:`PER_LAYER_ROPE_KEYS`) one layer type of a dict config
    overrides (``get``: its ``dict.get``): from ``per_layer_config`` (layer index ->
    overrides, alike across the layers of the type), or the family's ``global_head_dim`` for
    ``"full_attention"``; ``{}`` where none."""
    per_layer = get("per_layer_config")
    if per_layer is None:
        default = GLOBAL_HEAD_DIM_DEFAULT.get(model_type)
        if default is None or layer_type != "full_attention":
            return {}
        return {"head_dim": _or(get("global_head_dim"), default)}
    kinds = get("layer_types")
    if not isinstance(per_layer, dict) or not isinstance(kinds, list):
        raise PosEncError(
            "config per_layer_config must be a dict of layer index -> overrides, with "
            f"layer_types a list, got {type(per_layer).__name__} and {type(kinds).__name__}"
        )
    by_index = {int(k): v for k, v in per_layer.items()}
    found = [
        {k: v for k, v in by_index.get(i, {}).items() if k in PER_LAYER_ROPE_KEYS}
        for i, kind in enumerate(kinds)
        if kind == layer_type
    ]
    if any(f != found[0] for f in found):
        raise PosEncError(
            f"per_layer_config must override the layers of type {layer_type!r} alike, got {found}"
        )
    return dict(found[0]) if found else {}


# Families whose rotary module reads ``rope_parameters[layer_type]`` for every type in
# ``layer_types`` (no flat form; the config drops dangling top-level ``rope_theta`` /
# ``rope_type`` beside per-layer-type entries).
PER_LAYER_TYPE_ONLY = frozenset({"cohere_compass_text"})


def per_layer_type_rope(rope: dict[str, Any], layer_types: Any) -> dict[str, Any]:
    """``rope_parameters`` of a :data:`PER_LAYER_TYPE_ONLY` family, as its config keeps them."""
    kinds = sorted(set(layer_types or ()))
    if set(rope) & set(kinds):
        rope = {k: v for k, v in rope.items() if k not in ("rope_theta", "rope_type")}
    missing = [k for k in kinds if k not in rope]
    if missing:
        raise PosEncError(
            f"rope_parameters must hold an entry (a dict, or None for no RoPE) for every layer "
            f"type in layer_types (transformers raises KeyError), missing {missing}"
        )
    return rope


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def unsupported(model_type: str) -> str | None:
    """What posenc cannot express in this family (``None``: nothing known)."""
    return UNSUPPORTED.get(model_type)


def components(model_type: str) -> str | None:
    """Why a composite config has no rotary of its own, naming its components' configs
    (``None``: not such a config)."""
    parts = COMPONENTS.get(model_type)
    if parts is None:
        return None
    named = " or ".join(f"config.{p}" for p in parts)
    return (
        f"this config has no rotary embedding of its own; its component models each build one "
        f"from their own config: pass {named}"
    )


def layout_of(model_type: str, rope_interleave: Any) -> Layout:
    """The pairing layout of a family's main attention (in the installed transformers, for
    the families of :data:`LAYOUT_BEFORE`)."""
    before = LAYOUT_BEFORE.get(model_type)
    if before is not None:
        release = installed_release()
        if release is not None and release < before[0]:
            return before[1]
    if model_type in INTERLEAVED:
        return "interleaved"
    if model_type in ROPE_INTERLEAVE_DEFAULT:
        flag = ROPE_INTERLEAVE_DEFAULT[model_type] if rope_interleave is None else rope_interleave
        return "interleaved" if flag else "half"
    return "interleaved" if rope_interleave is True else "half"


@functools.cache
def installed_release() -> tuple[int, int] | None:
    """The installed transformers' ``(major, minor)`` (``None``: not installed, or a version
    string that does not start with two numbers), read from its package metadata without
    importing it."""
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None
    parts = version.split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])
