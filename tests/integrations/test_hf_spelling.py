"""``patch(model, scaling=...)`` in every spelling: posenc's, a transformers ``rope_scaling``
dict and a whole transformers 5 ``rope_parameters`` dict give the same logits (bit for
bit), equal within float32 rounding to those of a model of the same weights whose config
carries that scaling (transformers' own rotary module); a ``rope_theta`` sets the base, a
``partial_rotary_factor`` or ``mrope_section`` other than the model's is refused before
anything changes.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc import PosEncError  # noqa: E402
from posenc.integrations.transformers import patch  # noqa: E402

from . import _tiny_models as tiny  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5  # logits are ~0.6 at most: atol is ~1e-5 relative to the largest
_LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
_LONGROPE = {
    "short_factor": [1.0 + i / 8 for i in range(4)],
    "long_factor": [2.0 + i for i in range(4)],
}
_YARN = {"factor": 4.0, "beta_fast": 16.0}

# id -> (model_type, posenc's spelling, transformers' rope_scaling spelling, the model's
# config overrides). The rope_parameters spelling is the latter with the model's
# rope_theta (and partial_rotary_factor where it has one).
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "llama-yarn": (
        "llama",
        {"type": "yarn", **_YARN, "original_max_position": 4096},
        {"rope_type": "yarn", **_YARN, "original_max_position_embeddings": 4096},
        {"max_position_embeddings": 16384},
    ),
    "llama-yarn-filled": (  # original_max_position_embeddings from max_position_embeddings
        "llama",
        {"type": "yarn", **_YARN, "original_max_position": 4096},
        {"rope_type": "yarn", **_YARN},
        {},
    ),
    "llama-linear-legacy-type": (
        "llama",
        {"type": "linear", "factor": 4.0},
        {"type": "linear", "factor": 4.0, "rope_type": "linear"},
        {},
    ),
    "llama-llama3": (
        "llama",
        {"type": "llama3", "original_max_position": 1024, **_LLAMA3},
        {"rope_type": "llama3", "original_max_position_embeddings": 1024, **_LLAMA3},
        {},
    ),
    "qwen2-dynamic": (  # dynamic's length: the config's max_position_embeddings
        "qwen2",
        {"type": "dynamic", "factor": 2.0, "max_position": 4096},
        {"rope_type": "dynamic", "factor": 2.0},
        {},
    ),
    "phi3-longrope": (  # rotary_dim 8 of head_dim 16: 4 factors; past 1024 the long ones
        "phi3",
        {"type": "longrope", "original_max_position": 1024, "factor": 4.0, **_LONGROPE},
        {"rope_type": "longrope", "original_max_position_embeddings": 1024, **_LONGROPE},
        {"original_max_position_embeddings": 1024},  # Phi-3 reads the attribute
    ),
    "phi3-su": (  # early Phi-3 configs' name of LongRoPE
        "phi3",
        {"type": "longrope", "original_max_position": 1024, "factor": 4.0, **_LONGROPE},
        {"type": "su", "original_max_position_embeddings": 1024, "factor": 4.0, **_LONGROPE},
        {"original_max_position_embeddings": 1024},
    ),
    "neox-yarn": (
        "gpt_neox",
        {"type": "yarn", "factor": 2.0, "original_max_position": 2048},
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048},
        {},
    ),
    "gptj-linear": (
        "gptj",
        {"type": "linear", "factor": 2.0},
        {"rope_type": "linear", "factor": 2.0},
        {},
    ),
    "llama4-yarn": (  # its config's llama3 scaling replaced
        "llama4_text",
        {"type": "yarn", "factor": 2.0, "original_max_position": 2048},
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 2048},
        {},
    ),
}


def _v5(model: Any, spelling: dict[str, Any]) -> dict[str, Any]:
    """transformers 5's rope_parameters: the scaling with the model's non-scaling keys."""
    rope = getattr(tiny.text_model(model).config, "rope_parameters", None) or {}
    general = ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")
    return {**{k: rope[k] for k in general if k in rope}, **spelling}


def _configured(model_type: str, rope_parameters: dict, extra: dict, weights: Any) -> Any:
    """A model of the same weights whose config carries ``rope_parameters``."""
    if model_type == "gptj":
        return None  # GPT-J's rotary module has no scaling: nothing of transformers' to compare
    # transformers' config fills the dict it is given (rope_type, ...): give it a copy
    configured = tiny.model(model_type, rope_parameters=copy.deepcopy(rope_parameters), **extra)
    configured.load_state_dict(weights.state_dict())
    return configured


@pytest.mark.parametrize("case", list(CASES))
def test_every_spelling_gives_the_logits_of_a_model_configured_with_it(case: str) -> None:
    model_type, ours, theirs, extra = CASES[case]
    ids = tiny.ids()
    models = {name: tiny.model(model_type, **extra) for name in ("posenc", "rope_scaling", "v5")}
    v5 = _v5(models["v5"], theirs)
    configured = _configured(model_type, v5, extra, models["posenc"])
    for name, spelling in zip(models, (ours, theirs, v5)):
        patch(models[name], scaling=spelling)
    for offset in (0, 3000):
        positions = torch.arange(ids.shape[1])[None] + offset
        got = {name: tiny.logits(m, ids, positions) for name, m in models.items()}
        assert torch.equal(got["rope_scaling"], got["posenc"]), offset
        assert torch.equal(got["v5"], got["posenc"]), offset
        if configured is not None:
            expected = tiny.logits(configured, ids, positions)
            torch.testing.assert_close(got["posenc"], expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("spelling", "base"),
    [
        ({"rope_type": "default", "rope_theta": 5e5}, 5e5),
        ({"rope_theta": 5e5}, 5e5),  # no rope type: transformers' default
        ({"rope_type": "linear", "factor": 2.0, "rope_theta": 2e4}, 2e4),
    ],
    ids=["default", "theta-only", "linear"],
)
def test_rope_theta_in_scaling_sets_the_base(spelling: dict, base: float) -> None:
    model = tiny.model("llama")
    configured = tiny.model("llama", rope_parameters=copy.deepcopy(spelling))
    configured.load_state_dict(model.state_dict())
    patch(model, scaling=spelling)
    assert model.model.rotary_emb.ropes[None].base == base
    ids, positions = tiny.ids(), torch.arange(24)[None] + 3000
    torch.testing.assert_close(
        tiny.logits(model, ids, positions),
        tiny.logits(configured, ids, positions),
        rtol=RTOL,
        atol=ATOL,
    )


@pytest.mark.parametrize(
    "scaling",
    [
        {"full_attention": {"type": "linear", "factor": 8.0}},
        {"full_attention": {"rope_type": "linear", "factor": 8.0}},
        {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}},
    ],
    ids=["posenc", "rope_scaling", "rope_parameters"],
)
def test_scaling_per_layer_type_for_gemma3(scaling: dict) -> None:
    model = tiny.model("gemma3_text")
    rope = model.config.rope_parameters
    configured = tiny.model(
        "gemma3_text",
        rope_parameters={
            "sliding_attention": dict(rope["sliding_attention"]),
            "full_attention": {**rope["full_attention"], "rope_type": "linear", "factor": 8.0},
        },
    )
    configured.load_state_dict(model.state_dict())
    patch(model, scaling=scaling)
    ropes = model.base_model.rotary_emb.ropes
    assert ropes["sliding_attention"].scaling is None
    assert ropes["sliding_attention"].base == rope["sliding_attention"]["rope_theta"]
    assert ropes["full_attention"].base == rope["full_attention"]["rope_theta"]
    ids, positions = tiny.ids(), torch.arange(24)[None] + 3000
    torch.testing.assert_close(
        tiny.logits(model, ids, positions),
        tiny.logits(configured, ids, positions),
        rtol=RTOL,
        atol=ATOL,
    )


def test_gemma3_sliding_theta_set_per_layer_type() -> None:
    model = tiny.model("gemma3_text")
    rope = model.config.rope_parameters
    edited = {"rope_type": "default", "rope_theta": 20000.0}
    configured = tiny.model(
        "gemma3_text",
        rope_parameters={
            "sliding_attention": edited,
            "full_attention": dict(rope["full_attention"]),
        },
    )
    configured.load_state_dict(model.state_dict())
    patch(model, scaling={"sliding_attention": edited})
    assert model.base_model.rotary_emb.ropes["sliding_attention"].base == 20000.0
    ids, positions = tiny.ids(), torch.arange(24)[None] + 100
    torch.testing.assert_close(
        tiny.logits(model, ids, positions),
        tiny.logits(configured, ids, positions),
        rtol=RTOL,
        atol=ATOL,
    )


@pytest.mark.parametrize("model_type", sorted(tiny.VL_CONFIGS))
def test_mrope_rope_parameters_with_3d_positions(model_type: str) -> None:
    """A VL model's rope_parameters (mrope_section, Qwen3-VL's mrope_interleaved) edited to a
    linear scaling: the same logits as a model configured so, at 3-D positions."""
    model = tiny.model(model_type)
    spelling = _v5(model, {"rope_type": "linear", "factor": 2.0})
    assert "mrope_section" in spelling
    if model_type == "qwen3_vl_text":
        spelling["mrope_interleaved"] = True  # in its published configs (and ignored)
    configured = tiny.model(model_type, rope_parameters=copy.deepcopy(spelling))
    configured.load_state_dict(model.state_dict())
    patch(model, scaling=spelling)
    ids = tiny.ids()
    g = torch.Generator().manual_seed(4)
    positions = torch.randint(0, 3000, (3, *ids.shape), generator=g)  # [3, b, s]: t, h, w
    torch.testing.assert_close(
        tiny.logits(model, ids, positions),
        tiny.logits(configured, ids, positions),
        rtol=RTOL,
        atol=ATOL,
    )


# --- refusals leave the model unchanged -------------------------------------------------------

# id -> (model_type, scaling, the error's match)
BAD = {
    "partial-differs": (
        "phi3",
        {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 1.0},
        r"scaling is invalid: .* changes the model's rotary_dim from 8 to 16; patch changes the "
        r"frequencies only",
    ),
    "mrope-section-differs": (
        "qwen2_vl_text",
        {"rope_type": "default", "mrope_section": [4, 2, 2]},
        r"changes the model's sections from \(2, 3, 3\) to \(4, 2, 2\)",
    ),
    "yarn-without-factor": (
        "llama",
        {"rope_type": "yarn"},
        r"scaling is invalid: model_type 'llama': rope type 'yarn' requires the key\(s\) "
        r"\['factor'\]",
    ),
    "unknown-key": (
        "llama",
        {"rope_type": "linear", "factor": 2.0, "fator": 3},
        "unknown key 'fator'",
    ),
    "theta-below-1": (
        "llama",
        {"rope_type": "default", "rope_theta": 0.5},
        "rope_theta must be > 1.0",
    ),
    "types-disagree": (
        "llama",
        {"type": "linear", "rope_type": "yarn", "factor": 2.0},
        "'type' and 'rope_type' disagree",
    ),
    "per-type-bad": (
        "gemma3_text",
        {"full_attention": {"rope_type": "linear", "factor": 0.5}},
        "factor must be >= 1.0",
    ),
}


@pytest.mark.parametrize(("model_type", "scaling", "match"), list(BAD.values()), ids=list(BAD))
def test_bad_scaling_refused_before_any_change(model_type: str, scaling: dict, match: str) -> None:
    model = tiny.model(model_type)
    ids = tiny.ids()
    expected, tree = tiny.logits(model, ids), tiny.tree(model)
    with pytest.raises(PosEncError, match=match):
        patch(model, scaling=scaling)
    assert tiny.tree(model) == tree and tiny.instance_forwards(model) == []
    assert "_posenc_patch" not in model.__dict__
    assert torch.equal(tiny.logits(model, ids), expected)
