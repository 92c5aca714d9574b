"""``query_scale_from_config`` and ``rope_layers`` against transformers' own attention: the
query the attention kernel receives (captured from the family's attention module) equals
posenc's rotated query times its :class:`QueryScale`; NoPE layers as the configs set them."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from posenc import PosEncError
from posenc.integrations.transformers import (
    QueryScale,
    query_scale_from_config,
    rope_layers,
    rotary_from_config,
    softmax_scale_factor,
)

pytest.importorskip("transformers")


def _captured_query(module, attention, monkeypatch, **inputs) -> torch.Tensor:
    """The query ``attention`` (a transformers attention module) hands its kernel."""
    seen: dict[str, torch.Tensor] = {}

    def capture(_self, query, key, value, *args, **kwargs):
        seen["q"] = query
        return torch.zeros(*query.shape[:1], query.shape[2], query.shape[1], value.shape[-1]), None

    monkeypatch.setattr(module.ALL_ATTENTION_FUNCTIONS, "get_interface", lambda *a, **k: capture)
    with torch.no_grad():
        attention(**inputs)
    return seen["q"]


def _quiet(cls, **options):
    """``cls(**options)``, its warnings (transformers' notes on the options) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**options)


# Two heads of 32 channels, small enough for a fast attention module.
_SMALL = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=2, head_dim=32)


def _inputs(config, rotary, n: int) -> tuple[dict[str, torch.Tensor | None], torch.Tensor]:
    """An attention module's inputs for ``n`` tokens (``rotary``: the family's rotary module
    class, for its position embeddings) and the positions ``[1, n]``."""
    hidden = torch.randn(1, n, config.hidden_size, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(n)[None]
    inputs = {
        "hidden_states": hidden,
        "position_embeddings": rotary(config)(hidden, positions),
        "attention_mask": None,
    }
    return inputs, positions


def _projected_query(attention, hidden: torch.Tensor) -> torch.Tensor:
    """The queries ``[1, 2, n, 32]`` before any rotation or scale."""
    with torch.no_grad():
        return attention.q_proj(hidden).view(1, hidden.shape[1], 2, 32).transpose(1, 2)


def test_ministral3_query_is_rotated_then_scaled(monkeypatch) -> None:
    from transformers import Ministral3Config
    from transformers.models.ministral3 import modeling_ministral3 as m

    rope_parameters = {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "factor": 16.0,
        "original_max_position_embeddings": 64,  # small: the scale steps inside the test
        "llama_4_scaling_beta": 0.1,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    }
    config = _quiet(
        Ministral3Config, **_SMALL, max_position_embeddings=1024, rope_parameters=rope_parameters
    )
    attention = m.Ministral3Attention(config, layer_idx=0).eval()
    inputs, positions = _inputs(config, m.Ministral3RotaryEmbedding, 300)
    theirs = _captured_query(m, attention, monkeypatch, **inputs, position_ids=positions)
    scale = query_scale_from_config(config)
    assert scale == QueryScale(beta=0.1, length=64.0)
    q = _projected_query(attention, inputs["hidden_states"])
    q_rot, _ = rotary_from_config(config)(q, q, positions)
    ours = q_rot * scale(positions, dtype=torch.float32)[:, None, :, None]
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("layer_idx", [0, 3])
def test_llama4_nope_layers_are_scaled(monkeypatch, layer_idx: int) -> None:
    """Layer 3 of 4 is NoPE (``no_rope_layers`` default: every 4th): no rotation, the
    temperature ``1 + 0.1 ln(1 + floor((p + 1) / floor_scale))``; layer 0 rotates and is not
    scaled."""
    from transformers import Llama4TextConfig
    from transformers.models.llama4 import modeling_llama4 as m

    config = _quiet(
        Llama4TextConfig,
        **_SMALL,
        num_hidden_layers=4,
        floor_scale=16,  # small: the temperature steps inside the test
        use_qk_norm=False,
    )
    assert rope_layers(config) == [bool(f) for f in config.no_rope_layers] == [1, 1, 1, 0]
    attention = m.Llama4TextAttention(config, layer_idx=layer_idx).eval()
    inputs, positions = _inputs(config, m.Llama4TextRotaryEmbedding, 100)
    theirs = _captured_query(m, attention, monkeypatch, **inputs)
    q = _projected_query(attention, inputs["hidden_states"])
    scale = query_scale_from_config(config, layer_idx=layer_idx)
    if layer_idx == 0:
        assert scale is None
        ours, _ = rotary_from_config(config)(q, q, positions)
    else:
        assert scale == QueryScale(beta=0.1, length=16.0, offset=1.0)
        ours = q * scale(positions, dtype=torch.float32)[:, None, :, None]
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["Llama4TextConfig", "SmolLM3Config", "MistralLarge4TextConfig"])
def test_rope_layers_are_the_configs(name: str) -> None:
    import transformers

    cls = getattr(transformers, name, None)
    if cls is None:
        pytest.skip(f"{name} is not in this transformers")
    config = _quiet(cls, num_hidden_layers=10)
    expected = [bool(f) for f in config.no_rope_layers]
    assert rope_layers(config) == expected
    assert rope_layers(config.to_dict()) == expected
    assert rope_layers({"model_type": config.model_type, "num_hidden_layers": 10}) == expected
    explicit = [1, 0] * 5
    assert rope_layers({**config.to_dict(), "no_rope_layers": explicit}) == [
        bool(f) for f in explicit
    ]


def test_rope_layers_of_layer_types_without_rope() -> None:
    config = {
        "model_type": "cohere_compass_text",
        "num_hidden_layers": 3,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {"full_attention": None, "sliding_attention": {"rope_theta": 1e4}},
    }
    assert rope_layers(config) == [False, True, False]


def test_families_without_a_query_scale() -> None:
    assert query_scale_from_config({"model_type": "llama", "num_hidden_layers": 2}) is None
    config = {"model_type": "llama4_text", "num_hidden_layers": 4, "attn_temperature_tuning": False}
    assert query_scale_from_config(config, layer_idx=3) is None


@pytest.mark.parametrize(
    ("config", "layer_idx", "match"),
    [
        ({"model_type": "llama4_text", "num_hidden_layers": 4}, None, "pass layer_idx="),
        ({"model_type": "llama4_text", "num_hidden_layers": 4}, 4, "layer_idx must be <= 3"),
        ({"model_type": "llama4_text"}, 0, "num_hidden_layers"),
        (
            {"model_type": "ministral3", "rope_parameters": {"rope_type": "yarn", "factor": 2.0}},
            None,
            "'llama_4_scaling_beta', 'original_max_position_embeddings'",
        ),
        (
            {
                "model_type": "mistral4",
                "rope_parameters": {
                    "llama_4_scaling_beta": 0.1,
                    "original_max_position_embeddings": 0,
                },
            },
            None,
            "length must be > 0",
        ),
        (
            {"model_type": "smollm3", "num_hidden_layers": 4, "no_rope_layers": [1, 1]},
            0,
            "at least num_hidden_layers = 4",
        ),
    ],
)
def test_bad_configs(config: dict, layer_idx, match: str) -> None:
    read = rope_layers if "no_rope_layers" in config else query_scale_from_config
    with pytest.raises(PosEncError, match=match):
        read(config) if read is rope_layers else read(config, layer_idx=layer_idx)


def test_query_scale_bad_positions() -> None:
    scale = QueryScale(beta=0.1, length=8.0)
    with pytest.raises(PosEncError):
        scale([1, 2])  # type: ignore[arg-type]
    with pytest.raises(PosEncError, match="beta"):
        QueryScale(beta=float("nan"), length=8.0)


# DeepSeek-V3's rope_scaling, as its config.json gives it (and as DeepSeek-V2's)
DEEPSEEK_V3_YARN = {
    "type": "yarn",
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
}


def test_deepseek_v3_softmax_scale_is_its_attention_scaling() -> None:
    """DeepSeek-V3's attention multiplies ``qk_head_dim ** -0.5`` by 1.874 (its
    ``self.scaling``), and its rotary ``attention_scale`` is 1."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    config = _quiet(
        DeepseekV3Config,
        rope_scaling=DEEPSEEK_V3_YARN,
        rope_theta=10000.0,
        max_position_embeddings=163840,
    )
    attention = m.DeepseekV3Attention(config, layer_idx=0)
    theirs = attention.scaling / attention.qk_head_dim**-0.5
    ours = softmax_scale_factor(config)
    assert ours == pytest.approx(theirs, rel=1e-12)
    assert ours == pytest.approx((0.1 * math.log(40) + 1) ** 2, rel=1e-15)
    assert round(ours, 3) == 1.874
    assert softmax_scale_factor(config.to_dict()) == ours
    assert softmax_scale_factor(
        {"model_type": "deepseek_v3", "rope_scaling": DEEPSEEK_V3_YARN}
    ) == (ours)
    assert rotary_from_config(config).attention_scale == pytest.approx(1.0)


@pytest.mark.parametrize("mscale_all_dim", [0.0, 0.707, 1.0])
@pytest.mark.parametrize("factor", [1.0, 4.0, 40.0])
def test_every_mla_family_softmax_scale(mscale_all_dim: float, factor: float) -> None:
    """Each family's own ``yarn_apply_mscale`` (what its attention multiplies its softmax scale
    by), for its default config given a YaRN scaling."""
    from tests.integrations.test_hf_families import FAMILIES

    from posenc.integrations import _hf_families as families

    checked = 0
    for family in FAMILIES.values():
        apply = getattr(family.module, "yarn_apply_mscale", None)
        if apply is None:
            continue
        assert family.model_type in families.MLA_SOFTMAX_MSCALE, family.model_type
        rope = {**DEEPSEEK_V3_YARN, "factor": factor, "mscale_all_dim": mscale_all_dim}
        config = {"model_type": family.model_type, "rope_scaling": rope}
        theirs = apply({**rope, "rope_type": "yarn"}, 1.0)
        assert softmax_scale_factor(config) == pytest.approx(theirs, rel=1e-12), family.case
        checked += 1
    assert checked >= 10


def test_softmax_scale_refusals() -> None:
    config = {"model_type": "deepseek_v3", "rope_scaling": {"type": "yarn", "mscale_all_dim": 1.0}}
    with pytest.raises(PosEncError, match=r"model_type 'deepseek_v3'.*'factor'"):
        softmax_scale_factor(config)
    assert softmax_scale_factor({"model_type": "deepseek_v3"}) == 1.0  # default RoPE


@pytest.mark.parametrize(
    ("scale", "positions"),
    [
        (QueryScale(beta=0.1, length=8.0, offset=1.0), [-(2**62), -100, -10, -9, -2, -1]),
        (QueryScale(beta=0.5, length=4.0), [-(2**40), -5, -4, -1]),
        (QueryScale(beta=-0.3, length=4.0), [-9, -1]),
    ],
    ids=["llama4", "mistral", "negative-beta"],
)
def test_negative_positions_scale_by_one(scale, positions):
    """Llama 4's scale was -inf at p in [-F-1, -2] and NaN below (log1p of -1 and less):
    padding given negative positions made NaN queries. Below the first step it is 1, as at
    every non-negative position before it; above, transformers' expression."""
    p = torch.tensor([*positions, 0, 3, 7, 8, 100])
    got = scale(p)
    steps = torch.floor((p.double() + scale.offset) / scale.length)
    want = torch.where(steps < 0, 1.0, 1.0 + scale.beta * torch.log1p(steps.clamp_min(0)))
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert bool(torch.isfinite(got).all()) and bool((got[p < 0] == 1.0).all())
    with pytest.raises(PosEncError, match="dtype must be a floating-point dtype"):
        scale(p, dtype=torch.int64)
