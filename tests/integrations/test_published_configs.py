"""Published ``config.json`` files (their RoPE fields, ``tests/data/hf_configs``, sources in
its ``SOURCES.md``) read from the JSON dict by ``rotary_from_config`` and compared with
transformers' own rotary module and apply function built from the same dict through the
family's config class: positions 0..4095 and scattered up to 1e6, float32 and bfloat16,
with the bounds of ``test_hf_families``. Families posenc refuses raise one line of
``PosEncError`` naming the ``model_type``.
"""

from __future__ import annotations

import json
import pathlib
import warnings

import pytest
import torch
from tests.integrations import _hf_families as hf
from tests.integrations.test_hf_families import (
    FAMILIES,
    _check,
    _compare,
    _expected,
    _inputs,
    _reference_key,
)

from posenc import PosEncError
from posenc.integrations.transformers import (
    QueryScale,
    query_scale_from_config,
    rope_layers,
    rotary_from_config,
)

pytest.importorskip("transformers")

CONFIGS = pathlib.Path(__file__).parents[1] / "data" / "hf_configs"
# fixture -> what the one-line refusal says (the rest must match transformers); every
# published fixture is read now (Ministral 3 since its query scale has its own function)
REFUSED: dict[str, str] = {}
# (fixture, rope_parameters key removed, what the refusal says): a published config missing a
# key transformers requires
MISSING_KEY = [
    ("ministral3_3b_2512", "factor", "requires the key(s) ['factor']"),
    ("ministral3_3b_2512", "llama_4_scaling_beta", "must hold ['llama_4_scaling_beta'"),
]
FIXTURES = sorted(p.stem for p in CONFIGS.glob("*.json"))


def load(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def transformers_config(data: dict):
    """The family's config object from the dict, and its harness ``Family``."""
    text = data.get("text_config", data)
    family = next(f for f in FAMILIES.values() if f.model_type == text["model_type"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = family.config_cls(**{k: v for k, v in text.items() if k != "model_type"})
    return family, config


def test_every_fixture_has_a_source() -> None:
    sources = (CONFIGS / "SOURCES.md").read_text()
    assert FIXTURES and set(REFUSED) <= set(FIXTURES)
    for name in FIXTURES:
        assert f"`{name}.json`" in sources, name


@pytest.mark.parametrize("name", sorted(set(FIXTURES) - set(REFUSED)))
def test_published_config_matches_transformers(name: str) -> None:
    data = load(name)
    family, config = transformers_config(data)

    def read(layer_type):
        rope = rotary_from_config(data, layer_type=layer_type)  # the JSON dict, as published
        assert rope.head_dim == rotary_from_config(config, layer_type=layer_type).head_dim
        return rope

    _compare(family, config, read)


@pytest.mark.parametrize(("name", "key", "says"), MISSING_KEY)
def test_published_config_missing_a_key_refused_in_one_line(name: str, key: str, says: str):
    data = load(name)
    text = data.get("text_config", data)
    rope = {k: v for k, v in text["rope_parameters"].items() if k != key}
    broken = {**data, "text_config": {**text, "rope_parameters": rope}}
    read = query_scale_from_config if key == "llama_4_scaling_beta" else rotary_from_config
    with pytest.raises(PosEncError) as info:
        read(broken)
    message = str(info.value)
    assert "\n" not in message and f"model_type {text['model_type']!r}" in message
    assert says in message


def test_ministral3_query_scale_is_published() -> None:
    """Ministral 3's ``llama_4_scaling_beta`` 0.1 over its original context 16384: the
    queries are scaled by 1 + 0.1 ln(1 + floor(p / 16384)), as transformers' attention does
    (``get_llama_4_attn_scale``)."""
    from transformers.models.ministral3 import modeling_ministral3

    scale = query_scale_from_config(load("ministral3_3b_2512"))
    assert scale == QueryScale(beta=0.1, length=16384.0)
    positions = torch.cat([torch.arange(0, 200_000, 97), torch.tensor([16383, 16384, 32768])])
    theirs = modeling_ministral3.get_llama_4_attn_scale(positions[None], 0.1, 16384)
    torch.testing.assert_close(scale(positions[None], dtype=torch.float32), theirs[:, 0, :, 0])


def _compare_at(name: str, limit: int) -> None:
    """The fixture against transformers at the shared positions below ``limit`` only."""
    data = load(name)
    family, config = transformers_config(data)
    module = hf.rotary_module(family, config)
    rope = rotary_from_config(data)
    positions = hf.positions(None, limit)
    exp = _expected(rope, positions, _reference_key(rope, (rope.position_coords, limit)))
    q, k = _inputs(rope.head_dim, positions.shape[1])
    for dtype in (torch.float32, torch.bfloat16):
        qd, kd = q.to(dtype), k.to(dtype)
        theirs = hf.transformers_qk(family, config, None, qd, kd, positions, module)
        _check(rope(qd, kd, positions), theirs, exp, dtype)


@pytest.mark.parametrize(
    ("name", "rotary_dim", "head_dim"),
    [("phi3_5_mini_instruct", 96, 96), ("phi4_mini_instruct", 96, 128)],
)
def test_phi_longrope_is_published(name: str, rotary_dim: int, head_dim: int) -> None:
    """Phi-3.5-mini / Phi-4-mini: ``longrope`` with their 48 short and long factors over the
    original 4096 positions (131072 now: attention scale sqrt(1 + ln 32 / ln 4096)); within
    the original context transformers takes the short factors, which posenc matches too."""
    import math

    data = load(name)
    rope = rotary_from_config(data)
    scaling = rope.scaling
    published = data["rope_scaling"]
    assert type(scaling).__name__ == "LongRopeScaling"
    assert scaling.short_factor == tuple(published["short_factor"])
    assert scaling.long_factor == tuple(published["long_factor"])
    assert scaling.original_max_position == 4096 and scaling.max_position == 131072
    assert (rope.rotary_dim, rope.head_dim) == (rotary_dim, head_dim)
    assert len(published["long_factor"]) == rotary_dim // 2
    assert rope.attention_scale == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    _compare_at(name, 4096)  # short factors only


def test_llama4_scout_rope_layers_and_query_scale() -> None:
    """Llama 4 Scout (no ``no_rope_layers`` / ``attn_*`` keys in the copy: transformers'
    defaults): every 4th of its 48 layers is NoPE, and only those scale their queries, by
    ``1 + 0.1 ln(1 + floor((p + 1) / 8192))`` as transformers' attention does."""
    data = load("llama4_scout_17b_16e_instruct")
    _, config = transformers_config(data)
    layers = rope_layers(data)
    assert layers == [bool(f) for f in config.no_rope_layers]
    assert layers == [(i + 1) % 4 != 0 for i in range(48)]
    positions = torch.cat([torch.arange(0, 200_000, 97), torch.tensor([8190, 8191, 16383])])
    for i, uses_rope in enumerate(layers):
        scale = query_scale_from_config(data, layer_idx=i)
        if uses_rope:
            assert scale is None, i
            continue
        assert scale == QueryScale(beta=config.attn_scale, length=config.floor_scale, offset=1.0)
        theirs = torch.log1p(torch.floor((positions.float() + 1.0) / config.floor_scale))
        theirs = theirs * config.attn_scale + 1.0
        torch.testing.assert_close(scale(positions, dtype=torch.float32), theirs)
    scaling = rotary_from_config(data).scaling
    assert (scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor) == (16.0, 1.0, 1.0)
