"""Scaling specs and the position-dependent hook: parse_scaling reads posenc's spellings
only (and points transformers' dicts to scaling_from_transformers), saved configs still
parse, and RotaryEmbedding takes each call's frequencies from the scaling's hook.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import posenc
from posenc import PosEncError, RotaryEmbedding
from posenc.integrations.transformers import scaling_from_transformers
from posenc.rotary import (
    SCALINGS,
    DynamicScaling,
    LinearScaling,
    LongRopeScaling,
    YarnScaling,
    parse_scaling,
)
from posenc.rotary.frequencies import ScalingParams

from ._scaling_cases import ORIGINAL
from ._scaling_cases import longrope_factors as _longrope_factors


def test_scaling_from_transformers_reads_both_spellings() -> None:
    ours = {"type": "yarn", "factor": 4, "original_max_position": 1024, "beta_fast": 16}
    theirs = {
        "rope_type": "yarn",
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "beta_fast": 16,
    }
    assert (
        parse_scaling(ours)
        == scaling_from_transformers(theirs)
        == scaling_from_transformers(ours)
        == YarnScaling(factor=4.0, original_max_position=1024, beta_fast=16.0)
    )
    assert (
        scaling_from_transformers(
            {"type": "su", "original_max_position": 8, "factor": 2, **_longrope_factors(4)}
        ).type
        == "longrope"
    )
    assert parse_scaling(None) is None and scaling_from_transformers(None) is None
    assert scaling_from_transformers({"rope_type": "default"}) is None
    assert parse_scaling({"type": "default"}) is None
    params = LinearScaling(factor=2)
    assert parse_scaling(params) is params


def test_truncate_none_is_false_for_transformers_and_absent_for_posenc() -> None:
    spec = {"factor": 4.0, "original_max_position": ORIGINAL, "truncate": None}
    assert scaling_from_transformers({"rope_type": "yarn", **spec}).truncate is False
    assert parse_scaling({"type": "yarn", **spec}).truncate is True  # None: the default


HINT = "read by posenc.integrations.transformers.scaling_from_transformers"


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 2.0},
        {"type": "linear", "rope_type": "linear", "factor": 2.0},
        {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64},
        {"type": "dynamic", "factor": 2.0, "max_position_embeddings": 64},
    ],
    ids=["rope-type-only", "rope-type-too", "original-embeddings", "max-embeddings"],
)
def test_parse_scaling_refuses_transformers_spellings_with_a_hint(scaling: dict) -> None:
    with pytest.raises(PosEncError, match=HINT) as info:
        parse_scaling(scaling)
    message = str(info.value)
    assert "must hold a 'type' key" in message or "unknown key" in message
    assert scaling_from_transformers(scaling) is not None  # what the hint points to reads it


def test_parse_scaling_names_the_unknown_key_and_the_allowed_ones() -> None:
    with pytest.raises(PosEncError) as info:
        parse_scaling({"type": "dynamic", "factor": 2.0, "max_len": 64})
    assert str(info.value).startswith(
        "scaling 'dynamic' got unknown key 'max_len'; allowed: factor, max_position ("
    )
    assert HINT in str(info.value)


def test_saved_0_1_0_rope_scalings_still_parse() -> None:
    import json
    from pathlib import Path

    saved = json.loads((Path(__file__).parents[1] / "data" / "configs_0_1_0.json").read_text())
    scalings = [c["scaling"] for c in saved["configs"] if c["name"] == "rope" and c["scaling"]]
    assert {s["type"] for s in scalings} == {
        "yarn",
        "dynamic",
        "longrope",
        "llama3",
        "linear",
        "ntk",
    }
    for spec in scalings:
        params = parse_scaling(spec)
        assert dataclasses.asdict(params) == {
            k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()
        }


# --- the position-dependent hook ------------------------------------------------------------


def test_only_position_dependent_scalings_override_the_hook() -> None:
    for name, (cls, _) in SCALINGS.items():
        assert issubclass(cls, ScalingParams)
        overridden = cls.call_frequencies is not ScalingParams.call_frequencies
        assert overridden == cls.position_dependent, name


def test_hook_of_a_static_scaling_gives_the_construction_frequencies() -> None:
    asked = []

    def frequencies(seq_len):
        asked.append(seq_len)
        return torch.ones(4, dtype=torch.float64)

    scaling = LinearScaling(factor=2)
    inv_freq, scale = scaling.call_frequencies(torch.tensor(10**6.0), frequencies, 0.5)
    assert asked == [None] and scale == 0.5 and torch.equal(inv_freq, torch.ones(4).double())
    assert scaling.precomputed_lengths() == ()


def _rope_cos(rope: RotaryEmbedding, positions: torch.Tensor) -> torch.Tensor:
    return rope.cos_sin(positions, dtype=torch.float64)[0]


def test_longrope_switches_at_the_boundary_on_the_device_without_item(monkeypatch) -> None:
    scaling = LongRopeScaling(original_max_position=ORIGINAL, factor=4.0, **_longrope_factors(8))
    assert scaling.precomputed_lengths() == (ORIGINAL + 1,)
    rope = RotaryEmbedding(8, scaling=scaling)
    plain, _ = posenc.rope_frequencies(8)
    short = plain / torch.tensor(scaling.short_factor, dtype=torch.float64)
    long = plain / torch.tensor(scaling.long_factor, dtype=torch.float64)
    scale = math.sqrt(1 + math.log(4.0) / math.log(ORIGINAL))
    assert rope.attention_scale == scale

    def no_sync(self):
        raise AssertionError("Tensor.item() called: a host synchronisation")

    monkeypatch.setattr(torch.Tensor, "item", no_sync)
    for largest, expected in [(0, short), (ORIGINAL - 1, short), (ORIGINAL, long), (5000, long)]:
        inv_freq, got_scale = rope._call_frequencies(
            [torch.tensor([0, largest])], torch.device("cpu")
        )
        torch.testing.assert_close(inv_freq, expected, rtol=1e-15, atol=0)
        assert got_scale == scale
        # the hook directly: the largest position as a device scalar
        direct, _ = scaling.call_frequencies(
            torch.tensor(float(largest), dtype=torch.float64),
            lambda n: (
                short if n is None else posenc.rope_frequencies(8, scaling=scaling, seq_len=n)[0]
            ),
            scale,
        )
        torch.testing.assert_close(direct, expected, rtol=1e-15, atol=0)
    # a whole call: the largest of the query and key positions decides, for both
    positions = torch.arange(ORIGINAL - 2, ORIGINAL + 1)
    angles = positions[:, None].double() * long
    torch.testing.assert_close(_rope_cos(rope, positions), angles.cos() * scale, rtol=1e-12, atol=0)
    positions = torch.arange(ORIGINAL - 2, ORIGINAL)
    angles = positions[:, None].double() * short
    torch.testing.assert_close(_rope_cos(rope, positions), angles.cos() * scale, rtol=1e-12, atol=0)


def test_dynamic_recomputes_from_the_largest_position(monkeypatch) -> None:
    scaling = DynamicScaling(factor=2.0, max_position=64)
    rope = RotaryEmbedding(8, scaling=scaling)
    synced = []
    item = torch.Tensor.item

    def counted(self):
        synced.append(1)
        return item(self)

    monkeypatch.setattr(torch.Tensor, "item", counted)
    cpu = torch.device("cpu")
    for largest in (10, 63, 64, 100, 1000, 100):
        inv_freq, scale = rope._call_frequencies([torch.tensor([0, largest])], cpu)
        # below max_position: the unscaled frequencies (seq_len = max(largest + 1, max_position))
        expected, _ = posenc.rope_frequencies(8, scaling=scaling, seq_len=max(largest + 1, 64))
        torch.testing.assert_close(inv_freq, expected, rtol=0, atol=0)
        assert scale == 1.0
    assert len(synced) == 6  # one host synchronisation per call
    # cached per (seq_len, device): a repeated length gives the same tensor
    again, _ = rope._call_frequencies([torch.tensor([1000])], cpu)
    assert again is rope._call_frequencies([torch.tensor([1000])], cpu)[0]
    # no positions: the construction frequencies, without reading any value
    empty, _ = rope._call_frequencies([torch.zeros(0, dtype=torch.long)], cpu)
    assert torch.equal(empty, rope.inv_freq) and len(synced) == 8
