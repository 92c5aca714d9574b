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
    _expected,
    _inputs,
    _one_thread,  # noqa: F401  (the module's one-thread fixture)
    _reference_key,
)

from posenc import PosEncError
from posenc.integrations.transformers import rotary_from_config

pytest.importorskip("transformers")

CONFIGS = pathlib.Path(__file__).parents[1] / "data" / "hf_configs"
# fixture -> what the one-line refusal says (the rest must match transformers)
REFUSED = {
    "ministral3_3b_2512": "unknown key 'llama_4_scaling_beta'",
}
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
    module = hf.rotary_module(family, config)
    layer_types = hf.layer_types(config)
    assert layer_types
    for layer_type in layer_types:
        rope = rotary_from_config(data, layer_type=layer_type)  # the JSON dict, as published
        assert rope.head_dim == rotary_from_config(config, layer_type=layer_type).head_dim
        positions_key = (rope.position_coords, hf.position_limit(module))
        positions = hf.positions(*positions_key)
        exp = _expected(rope, positions, _reference_key(rope, positions_key))
        q, k = _inputs(rope.head_dim, positions.shape[1])
        for dtype in (torch.float32, torch.bfloat16):
            qd, kd = q.to(dtype), k.to(dtype)
            theirs = hf.transformers_qk(family, config, layer_type, qd, kd, positions, module)
            _check(rope(qd, kd, positions), theirs, exp, dtype)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_published_config_refused_in_one_line(name: str) -> None:
    data = load(name)
    model_type = data.get("text_config", data)["model_type"]
    with pytest.raises(PosEncError) as info:
        rotary_from_config(data)
    message = str(info.value)
    assert "\n" not in message and f"model_type {model_type!r}" in message
    assert REFUSED[name] in message
