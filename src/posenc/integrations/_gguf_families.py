"""llama.cpp's per-architecture RoPE facts, keyed by a GGUF file's ``general.architecture``.

What a GGUF file's metadata does not say, llama.cpp keeps in its code; these tables hold
those facts (from ``llama_model_rope_type`` in ``src/llama-model.cpp``, the per-architecture
hyperparameter loaders and graph builders, and ``convert_hf_to_gguf.py``):

- :data:`ROPE_TYPES`: which pairing llama.cpp's ``ggml_rope_ext`` uses. ``NORM`` rotates
  adjacent channels ``(2i, 2i + 1)`` (posenc's ``"interleaved"``), ``NEOX`` the halves
  ``(i, i + n_rot / 2)`` (posenc's ``"half"``), ``MROPE`` / ``IMROPE`` the halves with
  M-RoPE sections (contiguous, or interleaved as Qwen3-VL's);
- :data:`NO_ROPE`: architectures without RoPE, with what they use instead;
- :data:`SLIDING`: architectures whose sliding-window layers have their own RoPE;
- :data:`PER_LAYER_REFUSED`: architectures whose per-layer RoPE posenc does not read;
- :data:`MLA`: multi-head latent attention (the rotated part of each head is
  ``rope.dimension_count`` channels of its own);
- :data:`TRANSFORMERS_UNPERMUTES`: where transformers' GGUF loader undoes the converter's
  permutation of the q/k projections.
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "MLA",
    "MROPE_WHEN_SECTIONS",
    "NO_ROPE",
    "PER_LAYER_REFUSED",
    "ROPE_TYPES",
    "SLIDING",
    "TRANSFORMERS_UNPERMUTES",
    "Sliding",
]

_NORM = (
    "arcee arctic baichuan bailingmoe chameleon chatglm cohere2 command-r deci deepseek "
    "deepseek2 deepseek2-ocr ernie4_5 ernie4_5-moe glm-dsa glm4 granite granitehybrid "
    "granitemoe internlm2 llada llama llama-embed llama4 maincoder minicpm mistral3 mistral4 "
    "neo-bert olmo plm smollm3 xverse"
)
_NEOX = (
    "afmoe apertus bailingmoe2 bitnet codeshell cogvlm dbrx dots1 dream eurobert exaone "
    "exaone-moe exaone4 falcon falcon-h1 gemma gemma-embedding gemma2 gemma3 gemma3n gemma4 "
    "glm4moe gpt-oss gptneox grok grovemoe hunyuan-dense hunyuan-moe hunyuan_vl jais2 "
    "jina-bert-v3 lfm2 lfm2moe llada-moe mimo2 minicpm3 minimax-m2 modern-bert nemotron "
    "nomic-bert nomic-bert-moe olmo2 olmoe openelm orion pangu-embedded phi2 phi3 phimoe plamo "
    "plamo2 plamo3 qwen qwen2 qwen2moe qwen3 qwen3moe qwen3next rnd1 seed_oss smallthinker "
    "stablelm starcoder2 step35"
)

#: ``general.architecture`` -> llama.cpp's rope type (``NORM``, ``NEOX``, ``MROPE``, ``IMROPE``).
ROPE_TYPES: dict[str, str] = {
    **dict.fromkeys(_NORM.split(), "NORM"),
    **dict.fromkeys(_NEOX.split(), "NEOX"),
    **dict.fromkeys(("qwen2vl", "paddleocr"), "MROPE"),
    **dict.fromkeys(("qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe"), "IMROPE"),
}

#: GLM-4, GLM-4-MoE and HunYuan-VL rotate with M-RoPE when the file gives
#: ``rope.dimension_sections`` (llama.cpp's ``use_mrope``), else with their ``ROPE_TYPES``.
MROPE_WHEN_SECTIONS = frozenset({"glm4", "glm4moe", "hunyuan_vl"})

_RECURRENT = "a recurrent model (state-space or RWKV), position comes from the recurrence"
#: Architectures without RoPE (``LLAMA_ROPE_TYPE_NONE``, or a rope type llama.cpp's graph
#: never uses): what they use instead.
NO_ROPE: dict[str, str] = {
    "gpt2": "learned absolute position embeddings",
    "gptj": "GPT-J's RoPE is not converted to GGUF by llama.cpp",
    "bert": "learned absolute position embeddings",
    "starcoder": "learned absolute position embeddings",
    "refact": "ALiBi",
    "bloom": "ALiBi",
    "mpt": "ALiBi",
    "jais": "ALiBi",
    "jina-bert-v2": "ALiBi",
    "t5": "T5 relative position buckets",
    "t5encoder": "T5 relative position buckets",
    "wavtokenizer-dec": "no attention positions (an audio decoder)",
    "clip": "a vision tower's own position embeddings (its mmproj file)",
    **dict.fromkeys(
        (
            "mamba",
            "mamba2",
            "jamba",
            "rwkv6",
            "rwkv6qwen2",
            "rwkv7",
            "arwkv7",
            "nemotron_h",
            "nemotron_h_moe",
            "kimi-linear",
        ),
        _RECURRENT,
    ),
}


@dataclasses.dataclass(frozen=True)
class Sliding:
    """The RoPE of an architecture whose sliding-window layers differ from the others.

    Layer ``il`` is a sliding-window layer when ``il % period < period - 1`` (llama.cpp's
    ``set_swa_pattern``), unless the file gives ``attention.sliding_window_pattern`` (a
    period, or one flag per layer).

    Attributes:
        period: the default pattern period.
        base: the sliding layers' base when the file gives no ``rope.freq_base_swa``
            (``None``: the others' ``rope.freq_base``).
        scaled: whether the file's scaling (``rope.scaling.*``) applies to the sliding
            layers too (Gemma 3: no, they keep base 10000 unscaled).
        full_rotates: whether the full-attention layers rotate at all (Cohere2: no).
        needs_window: the pattern holds only when ``attention.sliding_window`` is above 0.
    """

    period: int
    base: float | None
    scaled: bool
    full_rotates: bool = True
    needs_window: bool = False


#: Architectures with a RoPE per layer type (llama.cpp's ``rope_freq_base_train_swa``,
#: ``rope_freq_scale_train_swa`` and the builders that skip RoPE on some layers).
SLIDING: dict[str, Sliding] = {
    "gemma3": Sliding(period=6, base=10000.0, scaled=False, needs_window=True),
    "gpt-oss": Sliding(period=2, base=None, scaled=True),
    "cohere2": Sliding(period=4, base=None, scaled=True, full_rotates=False),
}

#: Architectures whose RoPE varies per layer in a way posenc does not read from GGUF.
PER_LAYER_REFUSED: dict[str, str] = {
    "llama4": "llama.cpp skips RoPE on every 4th layer (NoPE) and scales those layers' queries",
    "smollm3": "llama.cpp skips RoPE on every 4th layer (NoPE)",
    "gemma3n": "its layers differ in RoPE and head size (and share KV across layers)",
    "gemma4": "its full-attention layers use proportional RoPE with their own head size",
}

#: Multi-head latent attention: ``rope.dimension_count`` channels of each head rotate,
#: kept apart from the rest (the module's ``head_dim`` is that rope part).
MLA = frozenset({"deepseek2", "deepseek2-ocr", "glm-dsa", "minicpm3", "plm", "mistral4"})

#: The ``general.architecture`` values whose q/k projections transformers' GGUF loader
#: permutes back to the Hugging Face layout (``LlamaTensorProcessor``, transformers 5):
#: ``convert_hf_to_gguf.py`` permuted them so that llama.cpp's NORM rotation equals
#: transformers' half rotation. Every other architecture's tensors it keeps as stored.
TRANSFORMERS_UNPERMUTES = frozenset({"llama"})
