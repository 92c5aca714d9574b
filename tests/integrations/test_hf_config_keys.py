"""A config dict's bad value is refused naming the key as the dict spells it (GPT-J's
``n_embd``, ``rope_scaling.original_max_position_embeddings``, ``mrope_section``), every key
the reader reads is checked (GPT-J's ``n_positions``, ``max_position_embeddings``), and a
``model_type`` no transformers family has is refused; valid dicts still read as transformers'
own rotary modules compute (whole cos/sin tables)."""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
import torch

import posenc
from posenc.integrations import _hf_dict
from posenc.integrations._hf_model_types import MODEL_TYPES, MODEL_TYPES_VERSION
from posenc.integrations.transformers import rope_layers, rotary_from_config


def _llama(**rope: Any) -> dict[str, Any]:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
        **rope,
    }
    return {
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
        "rope_theta": 10000.0,
        "rope_scaling": scaling,
    }


_GPTJ = {"model_type": "gptj", "n_embd": 64, "n_head": 4, "rotary_dim": 8, "n_positions": 256}
_PHI3 = {
    "model_type": "phi3",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "max_position_embeddings": 1024,
    "original_max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
}
_QWEN2_VL = {
    "model_type": "qwen2_vl",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
}


def _with(config: dict[str, Any], **keys: Any) -> dict[str, Any]:
    return {**config, **keys}


def _names(message: str, key: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_.]){re.escape(key)}(?![A-Za-z0-9_])", message) is not None


CASES = {
    # GPT-J spells hidden_size / num_attention_heads / max_position_embeddings its own way
    "gptj-n_embd-str": (_with(_GPTJ, n_embd="64"), "n_embd"),
    "gptj-n_embd-0": (_with(_GPTJ, n_embd=0), "n_embd"),
    "gptj-n_embd-huge": (_with(_GPTJ, n_embd=10**12), "n_embd"),
    "gptj-n_head-float": (_with(_GPTJ, n_head=4.5), "n_head"),
    "gptj-n_head-huge": (_with(_GPTJ, n_head=10**12), "n_head"),
    # n_positions / max_position_embeddings were read (bounded) but their type not checked
    "gptj-n_positions-str": (_with(_GPTJ, n_positions="256"), "n_positions"),
    "gptj-n_positions-neg": (_with(_GPTJ, n_positions=-1), "n_positions"),
    "gptj-n_positions-bool": (_with(_GPTJ, n_positions=True), "n_positions"),
    "llama-max_position_embeddings-float": (
        _with(_llama(), max_position_embeddings=256.5),
        "max_position_embeddings",
    ),
    "llama-max_position_embeddings-neg": (
        _with(_llama(), max_position_embeddings=-1),
        "max_position_embeddings",
    ),
    "phi3-max_position_embeddings-str": (
        _with(_PHI3, max_position_embeddings="1024"),
        "max_position_embeddings",
    ),
    "phi3-original_max_position_embeddings-0": (
        _with(_PHI3, original_max_position_embeddings=0),
        "original_max_position_embeddings",
    ),
    # a head dim of 0 names the key that made it so
    "llama-num_attention_heads-huge": (
        _with(_llama(), num_attention_heads=10**12),
        "num_attention_heads",
    ),
    # the RoPE parameters' keys, under the name the dict gives them (rope_scaling)
    "llama-original_max_position_embeddings-str": (
        _llama(original_max_position_embeddings="64"),
        "rope_scaling.original_max_position_embeddings",
    ),
    "llama-original_max_position_embeddings-bool": (
        _llama(original_max_position_embeddings=True),
        "rope_scaling.original_max_position_embeddings",
    ),
    "llama-rope_type-empty": (_llama(rope_type=""), "rope_scaling.rope_type"),
    "llama-rope_type-bogus": (_llama(rope_type="bogus"), "rope_scaling.rope_type"),
    "llama-rope_type-int": (_llama(rope_type=3), "rope_scaling.rope_type"),
    "phi3-type-bogus": (
        _with(_PHI3, rope_scaling={**_PHI3["rope_scaling"], "type": "bogus"}),
        "rope_scaling.type",
    ),
    "llama-rope_scaling-str": (_with(_llama(), rope_scaling="bogus"), "rope_scaling"),
    "llama-rope_parameters-str": (
        {"model_type": "llama", "rope_parameters": "bogus"},
        "rope_parameters",
    ),
    # M-RoPE's sections under their transformers name
    **{
        f"qwen2_vl-mrope_section-{name}": (
            _with(_QWEN2_VL, rope_scaling={"type": "mrope", "mrope_section": value}),
            "rope_scaling.mrope_section",
        )
        for name, value in [
            ("set", {2, 3}),
            ("str", "ab"),
            ("dict", {0: 2, 1: 3, 2: 3}),
            ("empty", []),
            ("sum", [1, 3, 3]),
            ("huge", [10**12, 3, 3]),
        ]
    },
    **{
        f"qwen2_vl-mrope_section-elem-{name}": (
            _with(_QWEN2_VL, rope_scaling={"type": "mrope", "mrope_section": value}),
            "rope_scaling.mrope_section[0]",
        )
        for name, value in [
            ("neg", [-1, 3, 3]),
            ("float", [2.5, 3, 3]),
            ("bool", [True, 3, 3]),
            ("nested", [[2, 3, 3]]),
        ]
    },
    # a theta under its legacy name (GPT-NeoX's rotary_emb_base) names that key
    "gpt_neox-rotary_emb_base-str": (
        {
            "model_type": "gpt_neox",
            "hidden_size": 64,
            "num_attention_heads": 4,
            "rotary_emb_base": "1e4",
        },
        "rotary_emb_base",
    ),
    # a family's model_type: a string that names one
    "model_type-empty": (_with(_llama(), model_type=""), "model_type"),
    "model_type-bogus": (_with(_GPTJ, model_type="bogus"), "model_type"),
    "model_type-int": (_with(_PHI3, model_type=3), "model_type"),
    "text_config-model_type-bogus": (
        {"model_type": "qwen2_vl", "text_config": {**_QWEN2_VL, "model_type": "bogus"}},
        "text_config.model_type",
    ),
}


@pytest.mark.parametrize(("config", "key"), list(CASES.values()), ids=list(CASES))
def test_refused_naming_the_dicts_own_key(config: dict[str, Any], key: str) -> None:
    with pytest.raises(posenc.PosEncError) as info:
        rotary_from_config(config)
    assert _names(str(info.value), key), str(info.value)


@pytest.mark.parametrize("model_type", ["", "bogus", "lama"])
def test_unknown_model_type_says_what_is_known(model_type: str) -> None:
    with pytest.raises(posenc.PosEncError) as info:
        rope_layers({"model_type": model_type, "num_hidden_layers": 4})
    message = str(info.value)
    assert _names(message, "model_type") and f"transformers {MODEL_TYPES_VERSION}" in message
    assert "'llama'" in message if model_type != "bogus" else "close:" in message


def test_model_types_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without transformers the names of the listed release (5.25) are known: a dict of a
    family reads, one of no family is refused."""
    monkeypatch.setattr(_hf_dict, "_config_mapping", lambda: None)
    known, source = _hf_dict.known_model_types()
    assert known == MODEL_TYPES and source == f"transformers {MODEL_TYPES_VERSION}"
    rope = rotary_from_config(_GPTJ)
    assert (rope.head_dim, rope.rotary_dim, rope.layout) == (16, 8, "interleaved")
    with pytest.raises(posenc.PosEncError, match="model_type"):
        rotary_from_config(_with(_GPTJ, model_type="bogus"))


def test_model_types_are_transformers() -> None:
    """The list is the CONFIG_MAPPING of the release it names (5.25): equal to that
    release's, within a later one's, and holding an earlier one's (5.24's)."""
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import CONFIG_MAPPING
    installed = set(CONFIG_MAPPING.keys())
    version = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    listed = tuple(int(part) for part in MODEL_TYPES_VERSION.split("."))
    if version == listed:
        assert installed == MODEL_TYPES
    elif version > listed:
        assert MODEL_TYPES <= installed, sorted(MODEL_TYPES - installed)
    else:
        assert installed <= MODEL_TYPES, sorted(installed - MODEL_TYPES)


def _tf_rotary(config: dict[str, Any]) -> Any:
    """transformers' own rotary module of ``config``."""
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    fields = {k: v for k, v in config.items() if k != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tf_config = AutoConfig.for_model(config["model_type"], **fields)
    return LlamaRotaryEmbedding(tf_config)


@pytest.mark.parametrize(
    "config",
    [_llama(), {k: v for k, v in _llama().items() if k != "max_position_embeddings"}],
    ids=["llama3", "no-max_position_embeddings"],
)
def test_valid_dicts_read_as_transformers(config: dict[str, Any]) -> None:
    """The checks refuse nothing valid: llama3 scaling's inv_freq equals transformers' and
    its cos/sin do to the float32 rounding of transformers' angles."""
    pytest.importorskip("transformers")
    rope = rotary_from_config(config)
    module = _tf_rotary(config)
    torch.testing.assert_close(rope.inv_freq, module.inv_freq.double(), rtol=1e-6, atol=0)
    positions = torch.arange(300)
    cos, sin = module(torch.zeros(1, 300, 16), positions[None])
    want_cos, want_sin = rope.cos_sin(positions, dtype=torch.float64)
    worst = 300 * 3.1e-7 + 1e-6  # transformers forms position * inv_freq in float32
    torch.testing.assert_close(cos[0, :, :8].double(), want_cos, rtol=0, atol=worst)
    torch.testing.assert_close(sin[0, :, :8].double(), want_sin, rtol=0, atol=worst)
