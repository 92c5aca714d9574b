"""Full-module parity: ``rotary_from_config(cfg)(q, k, positions)`` against transformers' own
rotary embedding class + ``apply_rotary_pos_emb`` (Llama, GPT-NeoX partial rotary, Phi-3
LongRoPE, Qwen2-VL M-RoPE) for every rope type, with per-sample position rows inside and
beyond the original context. Configs are built locally; nothing is downloaded.

Tolerances. posenc forms the angles ``p * inv_freq`` in float64 from float64 frequencies;
transformers forms them in float32 from float32 frequencies. Against the float64
reference (:mod:`posenc.reference`) posenc is held to float32 rounding of cos/sin and of
the output (atol 2e-6 on unit-variance q/k). transformers' angle error grows with the
position: float32 ``inv_freq`` carries a relative error up to ~2.5e-7 and the float32
product another 2^-24, so at position ``p`` its angle is off by up to
``p * 3.1e-7`` (rad); the rotated value is off by that times ``|(x_i, x_j)|`` (its channel
pair) times the attention scale. The tolerance against transformers is that bound, per
element at that element's position (plus float32 output rounding); the test checks that
transformers stays within it, and that posenc is closer to the float64 reference than
transformers is whenever transformers' error is measurable (measured at position ~4000:
posenc 3e-7, transformers 3e-4).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

import posenc
from posenc import PosEncError, RotaryEmbedding, reference
from posenc.integrations.transformers import rotary_from_config

from ._reference import reference_rotation
from ._scaling_cases import longrope_factors, tf_llama3, tf_longrope

transformers = pytest.importorskip("transformers")

HEAD_DIM, HEADS, KV_HEADS = 32, 4, 2
MAX_POS = 256
ORIGINAL = 64
SEQ = 12

# name -> (per-sample start offsets): the positions are arange(SEQ) + offset per row
POSITION_CASES = {
    "inside": (0, 30),  # largest position 41 < ORIGINAL
    "past-original": (0, 100),  # 111: past the original context, inside max_position
    "past-max": (300, 4000),  # 4011: past max_position_embeddings (dynamic rescales)
}

# Angle error of transformers' float32 path per unit position (see the module docstring).
TF_ANGLE_ERROR_PER_POSITION = 3.1e-7
REF_ATOL = 2e-6


def _lr(dim: int) -> dict:
    return longrope_factors(dim, 0.05, 0.7)


LLAMA_CASES: dict[str, dict] = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": ORIGINAL,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "beta_fast": 16.0,
    },
    "yarn-factor-none": {
        "rope_type": "yarn",
        "factor": None,
        "original_max_position_embeddings": ORIGINAL,
    },
    "longrope": tf_longrope(ORIGINAL, _lr(HEAD_DIM)),
    "llama3": tf_llama3(ORIGINAL),
}


def _llama(rope_parameters: dict, base: float = 10000.0):
    return transformers.LlamaConfig(
        hidden_size=HEAD_DIM * HEADS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POS,
        rope_parameters={**rope_parameters, "rope_theta": base},
    )


def _qk(batch: int = 2, seq: int = SEQ, head_dim: int = HEAD_DIM):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(batch, HEADS, seq, head_dim, generator=g)
    k = torch.randn(batch, KV_HEADS, seq, head_dim, generator=g)
    return q, k


def _positions(offsets, seq: int = SEQ) -> torch.Tensor:
    return torch.stack([torch.arange(seq) + o for o in offsets])  # [b, s], one row per sample


def _reference_qk(rope: RotaryEmbedding, q, k, positions, axes_last=None):
    """float64 expected output: posenc.reference's frequencies (at this call's length) and rotation."""
    pos = positions if axes_last is None else axes_last
    spec = None if rope.scaling is None else dataclasses.asdict(rope.scaling)
    inv_freq, scale = reference.rope_frequencies(
        rope.rotary_dim, base=rope.base, scaling=spec, seq_len=float(pos.max()) + 1
    )
    return reference_rotation(
        q,
        k,
        pos,
        pos,
        inv_freq,
        layout=rope.layout,
        attention_scale=scale,
        sections=rope.sections,
    )


def _tf_bound(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, scale: float):
    """Per element: transformers' float32 angle error at that element's position times the
    norm of its channel pair (half layout: channel i pairs with i +- r/2), plus rounding."""
    rot = x[..., :rotary_dim]
    pair = torch.sqrt(rot**2 + rot.roll(rotary_dim // 2, dims=-1) ** 2)  # |(x_i, x_partner)|
    pair = torch.cat([pair, torch.zeros_like(x[..., rotary_dim:])], dim=-1)  # pass-through: exact
    p = positions.abs().double()  # [b, s]
    return pair.double() * scale * TF_ANGLE_ERROR_PER_POSITION * p[:, None, :, None] + REF_ATOL


def _check(ours, theirs, expected, inputs, positions, rope) -> None:
    """ours vs float64 tightly; transformers vs float64 within its float32 angle error at each
    element's position; ours vs transformers within that same bound."""
    for a, b, e, x in zip(ours, theirs, expected, inputs):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
        torch.testing.assert_close(a.double(), e, rtol=0, atol=REF_ATOL)
        bound = _tf_bound(x, positions, rope.rotary_dim, rope.attention_scale)
        assert bool(((b.double() - e).abs() <= bound).all()), "transformers outside its bound"
        assert bool(((a.double() - b.double()).abs() <= bound + REF_ATOL).all())
        ours_err, tf_err = (a.double() - e).abs().max(), (b.double() - e).abs().max()
        if tf_err > 10 * REF_ATOL:  # transformers' float32 angles have visibly drifted
            assert ours_err < tf_err


def _transformers_llama(cfg, q, k, positions):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    module = LlamaRotaryEmbedding(cfg)  # fresh: transformers' dynamic state depends on history
    cos, sin = module(q, positions)
    return apply_rotary_pos_emb(q, k, cos, sin)


@pytest.mark.parametrize("where", sorted(POSITION_CASES))
@pytest.mark.parametrize("case", sorted(LLAMA_CASES))
def test_llama_rope_types(case: str, where: str) -> None:
    cfg = _llama(LLAMA_CASES[case])
    rope = rotary_from_config(cfg)
    q, k = _qk()
    positions = _positions(POSITION_CASES[where])
    theirs = _transformers_llama(cfg, q, k, positions)
    ours = rope(q, k, positions)
    expected = _reference_qk(rope, q, k, positions)
    _check(ours, theirs, expected, (q, k), positions, rope)


@pytest.mark.parametrize("case", sorted(LLAMA_CASES))
def test_frequencies_and_scale_as_transformers_holds_them(case: str) -> None:
    """inv_freq / attention_scale attributes equal transformers' module before its first call."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = _llama(LLAMA_CASES[case], base=500000.0)
    rope, module = rotary_from_config(cfg), LlamaRotaryEmbedding(cfg)
    torch.testing.assert_close(rope.inv_freq, module.inv_freq.double(), rtol=1e-6, atol=0)
    assert rope.attention_scale == pytest.approx(module.attention_scaling, rel=1e-12)


@pytest.mark.parametrize("case", sorted(LLAMA_CASES))
def test_dict_config_builds_the_same_module(case: str) -> None:
    cfg = _llama(LLAMA_CASES[case])
    rope = rotary_from_config(cfg)
    assert rotary_from_config(cfg.to_dict()).to_config() == rope.to_config()
    # the module's own config (scaling included) survives JSON and posenc.build
    config = json.loads(json.dumps(rope.to_config()))
    again = posenc.build(config)
    assert again.to_config() == rope.to_config() and again.scaling == rope.scaling
    q, k = _qk()
    positions = _positions(POSITION_CASES["past-max"])
    for a, b in zip(again(q, k, positions), rope(q, k, positions)):
        assert torch.equal(a, b)


def test_legacy_rope_scaling_dict() -> None:
    """A transformers 4 style config.json: rope_scaling + rope_theta as top-level keys."""
    legacy = {
        "hidden_size": 128,
        "num_attention_heads": 4,
        "max_position_embeddings": MAX_POS,
        "rope_theta": 500000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0},
    }
    rope = rotary_from_config(legacy)
    cfg = transformers.LlamaConfig(**legacy)
    q, k = _qk()
    positions = _positions(POSITION_CASES["past-original"])
    theirs = _transformers_llama(cfg, q, k, positions)
    _check(
        rope(q, k, positions), theirs, _reference_qk(rope, q, k, positions), (q, k), positions, rope
    )
    assert rope.base == 500000.0 and rope.scaling.factor == 2.0


@pytest.mark.parametrize("scaling", [None, {"rope_type": "dynamic", "factor": 2.0}])
@pytest.mark.parametrize("where", ["inside", "past-max"])
def test_gpt_neox_partial_rotary(where: str, scaling) -> None:
    from transformers.models.gpt_neox.modeling_gpt_neox import (
        GPTNeoXRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    rope_parameters = {"rope_theta": 10000.0, "partial_rotary_factor": 0.25, **(scaling or {})}
    cfg = transformers.GPTNeoXConfig(
        hidden_size=HEAD_DIM * 2 * HEADS,
        num_attention_heads=HEADS,
        max_position_embeddings=MAX_POS,
        rope_parameters=rope_parameters,
    )
    rope = rotary_from_config(cfg)
    assert (rope.head_dim, rope.rotary_dim) == (2 * HEAD_DIM, HEAD_DIM // 2)
    q, k = _qk(head_dim=2 * HEAD_DIM)
    k = torch.cat([k, k], dim=1)  # GPT-NeoX has no GQA
    positions = _positions(POSITION_CASES[where])
    cos, sin = GPTNeoXRotaryEmbedding(cfg)(q, positions)
    theirs = apply_rotary_pos_emb(q, k, cos, sin)
    ours = rope(q, k, positions)
    _check(ours, theirs, _reference_qk(rope, q, k, positions), (q, k), positions, rope)
    for x, y in zip((q, k), ours):  # the channels past rotary_dim pass through untouched
        assert torch.equal(y[..., rope.rotary_dim :], x[..., rope.rotary_dim :])


def test_gpt_neox_legacy_attributes() -> None:
    """Older GPT-NeoX config.json: rotary_pct and rotary_emb_base as top-level keys."""
    legacy = {
        "model_type": "gpt_neox",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "rotary_pct": 0.5,
        "rotary_emb_base": 1000,
        "max_position_embeddings": 2048,
    }
    rope = rotary_from_config(legacy)
    cfg = transformers.GPTNeoXConfig(**legacy)
    assert (rope.rotary_dim, rope.base) == (32, 1000.0)
    assert rope.to_config() == rotary_from_config(cfg).to_config()
    no_pct = {k: v for k, v in legacy.items() if k != "rotary_pct"}  # the class default: 0.25
    assert rotary_from_config(no_pct).rotary_dim == 16


@pytest.mark.parametrize("where", sorted(POSITION_CASES))
def test_phi3_longrope(where: str) -> None:
    """Phi-3: longrope whose original context is a top-level attribute and factor absent."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

    cfg = transformers.Phi3Config(
        hidden_size=HEAD_DIM * HEADS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POS,
        original_max_position_embeddings=ORIGINAL,
        rope_parameters={"rope_type": "longrope", **_lr(HEAD_DIM)},
    )
    rope = rotary_from_config(cfg)
    assert rope.scaling.original_max_position == ORIGINAL and rope.scaling.factor is None
    module = Phi3RotaryEmbedding(cfg)
    assert rope.attention_scale == pytest.approx(module.attention_scaling, rel=1e-12)
    assert rope.attention_scale == pytest.approx(
        math.sqrt(1 + math.log(MAX_POS / ORIGINAL) / math.log(ORIGINAL))
    )
    q, k = _qk()
    positions = _positions(POSITION_CASES[where])
    cos, sin = module(q, positions)
    theirs = apply_rotary_pos_emb(q, k, cos, sin)
    ours = rope(q, k, positions)
    _check(ours, theirs, _reference_qk(rope, q, k, positions), (q, k), positions, rope)


@pytest.mark.parametrize("legacy", [False, True], ids=["rope_parameters", "legacy-mrope-type"])
def test_qwen2_vl_mrope(legacy: bool) -> None:
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (
        Qwen2VLRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    sections = [4, 6, 6]  # sums to HEAD_DIM / 2
    rope_parameters = {"rope_theta": 10000.0, "mrope_section": sections}
    if legacy:
        rope_parameters["type"] = "mrope"
    cfg = transformers.Qwen2VLConfig(
        text_config={
            "hidden_size": HEAD_DIM * HEADS,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "max_position_embeddings": MAX_POS,
            "rope_parameters": rope_parameters,
        }
    )
    rope = rotary_from_config(cfg)
    assert rope.sections == tuple(sections)
    assert rotary_from_config(cfg.to_dict()).to_config() == rope.to_config()
    q, k = _qk()
    # [3, b, s] (temporal, height, width) as Qwen2-VL builds them: a text prefix (all axes
    # equal), then a 2 x 5 image grid at one time step, with different offsets per sample
    g = torch.Generator().manual_seed(2)
    text = torch.arange(2)[None, None].expand(3, 2, 2)
    grid = torch.stack([torch.zeros(10), torch.arange(10) // 5, torch.arange(10) % 5]).long()
    image = 2 + grid[:, None].expand(3, 2, 10) + torch.randint(0, 50, (1, 2, 1), generator=g)
    tf_positions = torch.cat([text, image], dim=-1)  # [3, b, s]
    cos, sin = Qwen2VLRotaryEmbedding(cfg.get_text_config())(q, tf_positions)
    theirs = apply_rotary_pos_emb(q, k, cos, sin)
    positions = tf_positions.permute(1, 2, 0)  # posenc: [b, s, n_axes]
    ours = rope(q, k, positions)
    expected = _reference_qk(rope, q, k, None, axes_last=positions)
    _check(ours, theirs, expected, (q, k), tf_positions.amax(dim=0), rope)


# --- bad configs -------------------------------------------------------------------------------

GOOD = {"hidden_size": 128, "num_attention_heads": 4, "max_position_embeddings": 1024}


def _params(**params) -> dict:
    return {"rope_parameters": params}


def _scaling(**scaling) -> dict:
    return {"rope_scaling": scaling}


# id -> (what the config changes from GOOD, the error's match)
BAD_CONFIGS = {
    "unknown-type": (
        _params(rope_type="no_such_type", rope_theta=1e4),
        "rope_type must be one of 'default', 'linear'",
    ),
    "missing-factor": (
        _params(rope_type="linear", rope_theta=1e4),
        "missing required key.*'factor'",
    ),
    "factor-below-1": (_scaling(type="linear", factor=0.5), "factor must be >= 1.0"),
    "unknown-key": (  # M-RoPE's flag in a family without M-RoPE
        _scaling(type="linear", factor=2, mrope_interleaved=True),
        "scaling key 'mrope_interleaved' is not a scaling parameter",
    ),
    "llama3-missing": (
        _scaling(rope_type="llama3", factor=8),
        "missing required key.*'low_freq_factor'",
    ),
    "default-with-factor": (
        _scaling(rope_type="default", factor=2),
        "takes no scaling parameters",
    ),
    "dynamic-no-max": (
        {**_scaling(type="dynamic", factor=2), "max_position_embeddings": None},
        "missing required key.*'max_position'",
    ),
    "no-head-dim": ({"hidden_size": None}, "head_dim, or hidden_size and num_attention_heads"),
    "odd-rotary-dim-scaled": (  # odd with rope type 'default' is transformers' dim + 1
        {"partial_rotary_factor": 0.3, **_params(rope_type="linear", factor=2.0)},
        r"int\(32 \* 0.3\) must be even",
    ),
    "partial-zero": ({"partial_rotary_factor": 0.0}, "partial_rotary_factor must be > 0.0"),
    "partial-above-1": ({"rotary_pct": 1.5}, "rotary_pct must be <= 1.0"),
    "theta-one": ({"rope_theta": 1.0}, "rope_theta must be > 1.0"),
    "bad-sections": (_params(rope_type="default", mrope_section=[4, 4, 4]), "mrope_section"),
    "rope-not-dict": ({"rope_parameters": [1, 2]}, "rope_parameters must be a dict"),
    "nested-no-layer-type": (
        _params(full_attention={"rope_type": "default"}, sliding_attention=None),
        "pass layer_type=",
    ),
}


@pytest.mark.parametrize(("update", "match"), list(BAD_CONFIGS.values()), ids=list(BAD_CONFIGS))
def test_bad_config(update: dict, match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        rotary_from_config({**GOOD, **update})


def test_layer_types() -> None:
    nested = {
        **GOOD,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    }
    full = rotary_from_config(nested, layer_type="full_attention")
    sliding = rotary_from_config(nested, layer_type="sliding_attention")
    assert (full.base, full.scaling.factor) == (1e6, 8.0)
    assert (sliding.base, sliding.scaling) == (1e4, None)
    with pytest.raises(PosEncError, match="layer_type must be one of 'full_attention'"):
        rotary_from_config(nested, layer_type="global")
    with pytest.raises(PosEncError, match="layer_type must be None"):
        rotary_from_config(GOOD, layer_type="full_attention")


def test_layout_option() -> None:
    assert rotary_from_config(GOOD, layout="interleaved").layout == "interleaved"
    with pytest.raises(PosEncError, match="layout must be one of 'half', 'interleaved'"):
        rotary_from_config(GOOD, layout="neox")


def test_reference_frequencies_float64() -> None:
    """Sanity of the float64 path used above: the reference equals the module's attribute."""
    rope = rotary_from_config(_llama(LLAMA_CASES["llama3"]))
    inv_freq, _ = reference.rope_frequencies(
        rope.rotary_dim, base=rope.base, scaling=dataclasses.asdict(rope.scaling)
    )
    np.testing.assert_allclose(rope.inv_freq.numpy(), inv_freq, rtol=1e-13)
