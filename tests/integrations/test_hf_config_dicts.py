"""Config dicts read with their family's class defaults, and what a config may not do.

- Every family found in the installed transformers (``_hf_families.discover``): the dict
  ``save_pretrained`` writes (``to_diff_dict``: only what differs from the class defaults, as
  a published ``config.json``) gives the module of the config object itself (compared
  number for number with transformers in ``test_hf_families``).
- Gemma 3's published ``config.json`` (``google/gemma-3-4b-it``), whose ``text_config`` relies
  on ``Gemma3TextConfig``'s defaults, against transformers' own rotary built from it; without
  transformers, the missing key is named where it belongs (``text_config.head_dim``).
- Sizes a config sets are refused before anything big is built, quickly, naming the key and
  the bytes; bad ``rope_type`` / ``model_type`` values are ``PosEncError`` naming them.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import pytest
from tests.integrations import _hf_families as hf
from tests.integrations.test_hf_families import FAMILIES, REFUSED, _compare

from posenc import PosEncError
from posenc.integrations.transformers import rope_layer_types, rope_layers, rotary_from_config

transformers = pytest.importorskip("transformers")


def _modules(config) -> dict:
    return {t: rotary_from_config(config, layer_type=t).to_config() for t in hf.layer_types(config)}


def _dict_cases() -> list[str]:
    """The families whose ``model_type`` names their config class in transformers'
    ``CONFIG_MAPPING`` (those a ``config.json`` can name), refused ones aside."""
    cases = []
    for case, family in sorted(FAMILIES.items()):
        try:
            named = transformers.CONFIG_MAPPING[family.model_type]
        except KeyError:
            continue
        if named is family.config_cls and case not in REFUSED:
            cases.append(case)
    return cases


# Composite dicts whose text part is not under "text_config" (the dict reader looks there
# only; their config objects are read through get_text_config): a known gap, listed.
NOT_TEXT_CONFIG = {
    "dia": "decoder_config",
    "qwen2_5_omni": "thinker_config.text_config",
    "t5gemma": "encoder / decoder",
    "voxtral_realtime": "text_config of its own defaults",
}
DICT_CASES = [
    pytest.param(
        case,
        marks=pytest.mark.xfail(
            reason=f"its text part: {NOT_TEXT_CONFIG[case]}", raises=PosEncError, strict=True
        ),
    )
    if case in NOT_TEXT_CONFIG
    else case
    for case in _dict_cases()
]


def test_dict_cases_cover_the_families() -> None:
    assert len(DICT_CASES) > 150


@pytest.mark.parametrize("case", DICT_CASES)
def test_diff_dict_reads_as_the_config_object(case: str) -> None:
    family = FAMILIES[case]
    config = family.config()
    # what save_pretrained writes, through JSON
    data = json.loads(json.dumps(family.config_cls().to_diff_dict(), default=str))
    data["model_type"] = family.model_type
    expected = _modules(config)
    got = {t: rotary_from_config(data, layer_type=t).to_config() for t in expected}
    assert got == expected
    assert rope_layer_types(data) == rope_layer_types(config)


# google/gemma-3-4b-it's config.json (its text_config gives no head_dim, heads or theta)
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


def test_gemma3_published_dict_matches_transformers() -> None:
    """The dict as published, per layer type, against Gemma 3's own rotary module built
    from it (``Gemma3Config.from_dict``), number for number."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.Gemma3Config.from_dict(GEMMA3_4B).get_text_config()
    assert rope_layer_types(GEMMA3_4B) == ["sliding_attention", "full_attention"]
    full = rotary_from_config(GEMMA3_4B, layer_type="full_attention")
    assert (full.head_dim, full.base, full.scaling.factor) == (256, 1e6, 8.0)
    assert rotary_from_config(GEMMA3_4B, layer_type="sliding_attention").base == 1e4
    family = next(f for f in FAMILIES.values() if f.model_type == "gemma3_text")
    _compare(family, config, read=lambda t: rotary_from_config(GEMMA3_4B, layer_type=t))


def test_without_transformers_the_missing_key_is_named(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    with pytest.raises(PosEncError) as info:
        rotary_from_config(GEMMA3_4B, layer_type="full_attention")
    message = str(info.value)
    assert "model_type 'gemma3_text'" in message and "text_config.head_dim" in message
    assert "missing text_config.num_attention_heads" in message
    assert "transformers is not installed" in message
    gemma = {**GEMMA3_4B, "text_config": {**GEMMA3_4B["text_config"], "head_dim": 256}}
    assert rotary_from_config(gemma, layer_type="full_attention").head_dim == 256


@pytest.mark.parametrize(
    ("config", "key"),
    [
        (
            {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 10**8},
            "head_dim must be <= 65536",
        ),
        ({"hidden_size": 64, "num_attention_heads": 4, "head_dim": 10**8}, "head_dim must be"),
        (
            {"model_type": "llama", "hidden_size": 4 * 10**8, "num_attention_heads": 4},
            "head_dim (hidden_size // num_attention_heads = 400000000 // 4) must be",
        ),
        (
            {"hidden_size": 4 * 10**8, "num_attention_heads": 4},
            "head_dim (hidden_size // num_attention_heads = 400000000 // 4) must be",
        ),
        (
            {"model_type": "deepseek_v3", "qk_rope_head_dim": 10**8, "qk_nope_head_dim": 64},
            "qk_rope_head_dim must be <= 65536",
        ),
        (
            {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_positions": 10**8},
            "n_positions must be <= 67108864",
        ),
        (
            {"model_type": "llama", "max_position_embeddings": 10**8},
            "max_position_embeddings must be <= 67108864",
        ),
        (
            {
                "model_type": "llama",
                "rope_scaling": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 10**9,
                },
            },
            "rope_scaling.original_max_position_embeddings must be <= 67108864",
        ),
        (
            {"model_type": "qwen2_vl_vision", "embed_dim": 16 * 10**8, "num_heads": 16},
            "head_dim must be <= 65536",
        ),
    ],
    ids=[
        "head_dim",
        "head_dim-no-family",
        "hidden_size",
        "hidden_size-no-family",
        "mla",
        "gptj",
        "context",
        "yarn",
        "vision",
    ],
)
def test_sizes_refused_before_anything_is_built(config: dict, key: str) -> None:
    rotary_from_config({"model_type": "llama"})  # transformers imported before timing
    start = time.perf_counter()
    with pytest.raises(PosEncError) as info:
        rotary_from_config(config)
    assert time.perf_counter() - start < 1.0
    assert key in str(info.value) and "bytes" in str(info.value)


def test_published_context_lengths_are_read() -> None:
    """Llama 4 Scout's 10,485,760 positions are within the bound."""
    rope = rotary_from_config({"model_type": "llama", "max_position_embeddings": 10_485_760})
    assert rope.head_dim == 128


@pytest.mark.parametrize(
    "config",
    [
        {"num_hidden_layers": 10**12},
        {"model_type": "gemma3_text", "num_hidden_layers": 10**12},
        {"model_type": "gemma3", "text_config": {"num_hidden_layers": 3 * 10**7}},
    ],
    ids=["no-family", "gemma3_text", "text_config"],
)
@pytest.mark.parametrize("reader", [rope_layers, rope_layer_types, rotary_from_config])
def test_layer_count_bounded(config: dict, reader) -> None:
    start = time.perf_counter()
    with pytest.raises(PosEncError, match=r"num_hidden_layers must be <= 65536"):
        reader(config)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("model_type", [None, "llama"])
@pytest.mark.parametrize("key", ["rope_type", "type"])
def test_rope_type_must_be_a_string(model_type, key: str) -> None:
    config = {"hidden_size": 64, "num_attention_heads": 4, "rope_scaling": {key: ["linear"]}}
    if model_type is not None:
        config["model_type"] = model_type
    with pytest.raises(PosEncError, match=rf"{key} must be a string.*\['linear'\]"):
        rotary_from_config(config)


@pytest.mark.parametrize("value", [3, ["llama"], {"name": "llama"}, True])
@pytest.mark.parametrize("where", ["top", "text_config"])
def test_model_type_must_be_a_string(value, where: str) -> None:
    config = {"hidden_size": 64, "num_attention_heads": 4}
    if where == "top":
        config["model_type"] = value
        match = "config model_type must be a string"
    else:
        config = {"model_type": "gemma3", "text_config": {**config, "model_type": value}}
        match = "config text_config.model_type must be a string"
    for reader in (rotary_from_config, rope_layer_types, rope_layers):
        with pytest.raises(PosEncError, match=match):
            reader(config)
