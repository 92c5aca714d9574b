"""The tiny random-weight transformers models of every family ``patch`` covers, shared by
tests/integrations/test_hf_patch*.py and test_hf_spelling.py.

Each is built from its own config class (2 layers, hidden 64, vocab 128, 4 query heads and
2 key / value heads; no download). The VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) are whole
image-text models with a one-block vision tower of their own config, so that a tiny image
(:func:`image_inputs`) goes through their M-RoPE position code.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import transformers

# The tiny model of every family: its sizes, heads (4 query, 2 key / value) and special tokens.
SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
BASE = {**SIZES, **HEADS, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
_LLAMA3 = {  # Llama 4's published scaling (llama3), on a small original context
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 1024,
}
# model_type -> (config class, its small sizes). Partial rotary where the family has it.
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": 16}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "qwen3_moe": ("Qwen3MoeConfig", {"head_dim": 16, "num_experts": 4, **_MOE}),
    "gemma": ("GemmaConfig", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": 16}),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": 16}),
    "phi3": ("Phi3Config", {"partial_rotary_factor": 0.5}),
    "gpt_neox": ("GPTNeoXConfig", {"rotary_pct": 0.5}),
    "cohere": ("CohereConfig", {}),
    "glm4": ("Glm4Config", {}),  # partial_rotary_factor 0.5, interleaved pairs
    "olmo": ("OlmoConfig", {}),
    "olmo2": ("Olmo2Config", {}),
    "granite": ("GraniteConfig", {}),
    "stablelm": ("StableLmConfig", {}),  # partial_rotary_factor 0.25
    "starcoder2": ("Starcoder2Config", {}),
    "ministral": ("MinistralConfig", {"sliding_window": 16, "head_dim": 16}),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        {"num_experts": 4, "shared_expert_intermediate_size": 32, **_MOE},
    ),
    "phi": ("PhiConfig", {}),  # partial_rotary_factor 0.5
    "olmo3": ("Olmo3Config", {"sliding_window": 16}),
    "olmoe": ("OlmoeConfig", {"num_experts": 4, "num_experts_per_tok": 2}),
    "granitemoe": ("GraniteMoeConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "smollm3": ("SmolLM3Config", {}),
    "arcee": ("ArceeConfig", {}),
    "exaone4": ("Exaone4Config", {"sliding_window": 16}),
    "seed_oss": ("SeedOssConfig", {"head_dim": 16}),
    "cohere2": ("Cohere2Config", {"sliding_window": 16}),
    "glm": ("GlmConfig", {"head_dim": 16}),  # partial_rotary_factor 0.5, interleaved pairs
    "deepseek_v3": (  # MLA, rope_interleave (its default): the interleaved apply
        "DeepseekV3Config",
        {
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "n_routed_experts": 4,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            **_MOE,
        },
    ),
    # GPT-J: the first rotary_dim = 8 of 16 channels rotate, interleaved, from its table of
    # n_positions (max_position_embeddings) sinusoids
    "gptj": ("GPTJConfig", {"rotary_dim": 8}),
    # Llama 4 (text): complex freqs_cis, interleaved pairs, llama3 scaling; four layers so
    # that the last is a NoPE layer (no_rope_layers: every 4th) with its temperature tuning
    "llama4_text": (
        "Llama4TextConfig",
        {
            "num_hidden_layers": 4,
            "head_dim": 16,
            "intermediate_size_mlp": 128,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "floor_scale": 8,  # the NoPE layers' temperature grows within the test positions
            "rope_parameters": _LLAMA3,
        },
    ),
}
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "deepseek_v3")

# The VL families: model_type of the text config -> (config class, M-RoPE sections of the
# 16-channel heads (sum 8), the vision config). Image tokens: IMAGE between START and END.
IMAGE, START, END, VIDEO = 127, 125, 126, 124
VL_CONFIGS: dict[str, tuple[str, list[int], dict[str, Any]]] = {
    "qwen2_vl_text": (
        "Qwen2VLConfig",
        [2, 3, 3],
        dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2),
    ),
    "qwen2_5_vl_text": (
        "Qwen2_5_VLConfig",
        [2, 3, 3],
        dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            num_heads=2,
            window_size=56,
            fullatt_block_indexes=[0],
        ),
    ),
    "qwen3_vl_text": (  # interleaved M-RoPE
        "Qwen3VLConfig",
        [4, 2, 2],
        dict(
            depth=1,
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=64,
            num_heads=2,
            num_position_embeddings=16,
            deepstack_visual_indexes=[0],
        ),
    ),
}
_VISION = dict(patch_size=14, spatial_merge_size=2, temporal_patch_size=2)

ALL_FAMILIES = sorted({*CONFIGS, *VL_CONFIGS})


def config(model_type: str, **extra: Any) -> Any:
    """The config of a text family's tiny model (``extra`` overrides its values)."""
    name, sizes = CONFIGS[model_type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = getattr(transformers, name)(**{**BASE, **sizes, **extra})
    assert built.model_type == model_type
    return built


def vl_config(model_type: str, **text: Any) -> Any:
    """The config of a VL family's tiny image-text model (``text`` overrides its text config)."""
    name, sections, vision = VL_CONFIGS[model_type]
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": sections}
    text_config = {**BASE, "head_dim": 16, "rope_parameters": rope, **text}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = getattr(transformers, name)(
            text_config=text_config,
            vision_config={**vision, **_VISION},
            image_token_id=IMAGE,
            video_token_id=VIDEO,
            vision_start_token_id=START,
            vision_end_token_id=END,
        )
    assert built.get_text_config().model_type == model_type
    return built


def model(model_type: str, seed: int = 0, *, float64: bool = False, **extra: Any) -> Any:
    """A tiny random model of the family (eval mode): a causal LM, or for a VL family the
    image-text model."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if model_type in VL_CONFIGS:
            auto = transformers.AutoModelForImageTextToText
            return auto.from_config(vl_config(model_type, **extra)).eval()
        built = config(model_type, **extra)
        torch.manual_seed(seed)
        # the experts' default grouped_mm takes no float64: the eager loop does
        eager = float64 and model_type in MOE_FAMILIES
        kwargs = {"experts_implementation": "eager"} if eager else {}
        return transformers.AutoModelForCausalLM.from_config(built, **kwargs).eval()


def text_model(model: Any) -> Any:
    """The decoder holding ``rotary_emb`` (the language model of an image-text model)."""
    return next(m for m in model.modules() if "rotary_emb" in m._modules)


def ids(batch: int = 2, seq: int = 24, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 124, (batch, seq), generator=gen)


def image_inputs(seed: int = 2) -> dict[str, torch.Tensor]:
    """A text prompt around one tiny image (1 x 2 x 4 patches of 14 pixels: two merged
    tokens), as the processor gives it: ``input_ids [1, 9]``, ``mm_token_type_ids``,
    ``pixel_values [8, 3 * 2 * 14 * 14]`` and ``image_grid_thw``."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.tensor([[5, 6, START, IMAGE, IMAGE, END, 7, 8, 9]])
    return {
        "input_ids": input_ids,
        "mm_token_type_ids": (input_ids == IMAGE).int(),
        "pixel_values": torch.randn(8, 3 * 2 * 14 * 14, generator=gen),
        "image_grid_thw": torch.tensor([[1, 2, 4]]),
    }


def logits(model: Any, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, position_ids=positions).logits


def tree(model: Any) -> list[tuple[str, int]]:
    return [(name, id(module)) for name, module in model.named_modules()]


def instance_forwards(model: Any) -> list[str]:
    return [name for name, module in model.named_modules() if "forward" in module.__dict__]
