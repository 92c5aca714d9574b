"""Tiny random hybrid models saved as transformers folders, for ``posenc extend``'s tests of
models whose layers do not all carry RoPE: Cohere 2 and EXAONE 4 (RoPE on their
sliding-window layers only, NoPE full attention), SmolLM3 (``no_rope_layers``: a NoPE layer
among RoPE ones) and Kimi Linear (MLA without RoPE beside linear attention). Each has the
byte tokenizer of :mod:`tests.extend._tiny` and its sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from tests.extend._tiny import BYTE_IDS, SIZES, byte_tokenizer

#: Two layers: a local one, then a full-attention one.
_TWO = ["sliding_attention", "full_attention"]


def _config(model_type: str, context: int) -> Any:
    common = {**SIZES, **BYTE_IDS, "max_position_embeddings": context}
    if model_type == "cohere2":
        return transformers.Cohere2Config(**common, sliding_window=16, layer_types=_TWO)
    if model_type == "exaone4":
        return transformers.Exaone4Config(**common, sliding_window=16, layer_types=_TWO)
    if model_type == "smollm3":
        # layer 1 is NoPE (no_rope_layers: 1 = RoPE, 0 = NoPE)
        return transformers.SmolLM3Config(**common, no_rope_layers=[1, 0])
    if model_type == "kimi_linear":
        attn = {"full_attn_layers": [2], "kda_layers": [1], "head_dim": 8, "num_heads": 4}
        return transformers.KimiLinearConfig(**common, linear_attn_config=attn)
    raise ValueError(f"no tiny config for {model_type!r}")


def tiny_hybrid(folder: Path, model_type: str, *, context: int = 512, seed: int = 0) -> Path:
    """A 2-layer random model of ``model_type`` (``cohere2``, ``exaone4``, ``smollm3``,
    ``kimi_linear``) trained (nominally) at ``context`` tokens, saved in ``folder``."""
    torch.manual_seed(seed)
    config = _config(model_type, context)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder
