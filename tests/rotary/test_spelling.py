"""transformers' spellings of a scaling, taken by RotaryEmbedding(scaling=) and (deprecated)
rope_frequencies(scaling=): every spelling gives cos/sin equal (bit for bit) to posenc's
spelling of the same scaling, and close to transformers' own rotary module built from a
config with those rope_parameters; a rope_theta, partial_rotary_factor, mrope_section or
mrope_interleaved that disagrees with the module's own arguments is refused.

Tolerance against transformers: its angles are float32 (``p * inv_freq`` off by up to
``3.1e-7 * p`` rad, see test_transformers_parity.py), so at positions below ``MAX_P`` its
cos/sin are within ``3.1e-7 * MAX_P`` times the attention scale, plus float32 rounding.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import posenc
from posenc import PosEncError, RotaryEmbedding
from posenc.integrations.transformers import scaling_from_transformers

from ._scaling_cases import longrope_factors, tf_llama3, tf_longrope

transformers = pytest.importorskip("transformers")

HEAD_DIM, MAX_POS, ORIGINAL, THETA = 32, 256, 64, 10000.0
OFFSETS = (0, 300)  # per row: inside the original context, past max_position_embeddings
SEQ = 24
MAX_P = max(OFFSETS) + SEQ
TF_ATOL = 3.1e-7 * MAX_P + 2e-6
_LR = longrope_factors(HEAD_DIM, 0.05, 0.7)
_LR_POSENC = {"type": "longrope", "factor": 4.0, "original_max_position": ORIGINAL, **_LR}
_LLAMA3_POSENC = {
    "type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position": ORIGINAL,
}
_YARN = {"factor": 4.0, "beta_fast": 16.0}

# id -> (transformers' spelling given to posenc, posenc's spelling of the same scaling,
# transformers' rope_parameters for its own module: None where it has no such type)
SPELLINGS: dict[str, tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]] = {
    "linear": (
        {"rope_type": "linear", "factor": 4.0},
        {"type": "linear", "factor": 4.0},
        {"rope_type": "linear", "factor": 4.0},
    ),
    "linear-v5": (  # a whole rope_parameters dict: its rope_theta is the base
        {"rope_type": "linear", "factor": 4.0, "rope_theta": THETA},
        {"type": "linear", "factor": 4.0},
        {"rope_type": "linear", "factor": 4.0},
    ),
    "default-v5": ({"rope_type": "default", "rope_theta": THETA}, None, {"rope_type": "default"}),
    "theta-only": ({"rope_theta": THETA}, None, {"rope_type": "default"}),  # transformers' default
    "dynamic": (  # max_position_embeddings: a config attribute in transformers, a key here
        {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": MAX_POS},
        {"type": "dynamic", "factor": 2.0, "max_position": MAX_POS},
        {"rope_type": "dynamic", "factor": 2.0},
    ),
    "yarn": (
        {"rope_type": "yarn", **_YARN, "original_max_position_embeddings": ORIGINAL},
        {"type": "yarn", **_YARN, "original_max_position": ORIGINAL},
        {"rope_type": "yarn", **_YARN, "original_max_position_embeddings": ORIGINAL},
    ),
    "yarn-legacy-type-truncate-none": (  # "type" (transformers 4); truncate None is false
        {"type": "yarn", **_YARN, "original_max_position_embeddings": ORIGINAL, "truncate": None},
        {"type": "yarn", **_YARN, "original_max_position": ORIGINAL, "truncate": False},
        {
            "rope_type": "yarn",
            **_YARN,
            "original_max_position_embeddings": ORIGINAL,
            "truncate": False,
        },
    ),
    "longrope": (tf_longrope(ORIGINAL, _LR), _LR_POSENC, tf_longrope(ORIGINAL, _LR)),
    "longrope-su": (  # early Phi-3 configs
        {**tf_longrope(ORIGINAL, _LR), "rope_type": "su"},
        _LR_POSENC,
        tf_longrope(ORIGINAL, _LR),
    ),
    "llama3-v5": (
        {**tf_llama3(ORIGINAL), "rope_theta": THETA},
        _LLAMA3_POSENC,
        tf_llama3(ORIGINAL),
    ),
}


def _positions() -> torch.Tensor:
    return torch.stack([torch.arange(SEQ) + o for o in OFFSETS])  # [b, s]


def _llama_cos_sin(rope_parameters: dict, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """transformers' Llama rotary module's cos/sin, one value per frequency ``[b, s, d/2]``."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.LlamaConfig(
            hidden_size=HEAD_DIM * 4,
            num_attention_heads=4,
            head_dim=HEAD_DIM,
            max_position_embeddings=MAX_POS,
            rope_parameters={**rope_parameters, "rope_theta": THETA},
        )
        cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1), positions)
    half = cos.shape[-1] // 2
    return cos[..., :half], sin[..., :half]


@pytest.mark.parametrize("case", list(SPELLINGS))
def test_rotary_embedding_takes_transformers_spelling(case: str) -> None:
    theirs, ours, tf_parameters = SPELLINGS[case]
    positions = _positions()
    rope = RotaryEmbedding(HEAD_DIM, base=THETA, scaling=theirs)
    same = RotaryEmbedding(HEAD_DIM, base=THETA, scaling=ours)
    assert rope.scaling == same.scaling and rope.to_config() == same.to_config()
    got, expected = rope.cos_sin(positions), same.cos_sin(positions)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    if "rope_theta" not in theirs:  # a rope_scaling dict: scaling_from_transformers reads it alike
        assert rope.scaling == scaling_from_transformers(theirs)
    scale = rope.attention_scale
    for mine, peer in zip(got, _llama_cos_sin(tf_parameters, positions)):
        torch.testing.assert_close(mine, peer, rtol=0, atol=TF_ATOL * scale)


def test_partial_rotary_factor_in_rope_parameters() -> None:
    """GPT-NeoX's rope_parameters with partial_rotary_factor: RotaryEmbedding's rotary_dim."""
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

    params = {
        "rope_type": "linear",
        "factor": 2.0,
        "rope_theta": THETA,
        "partial_rotary_factor": 0.5,
    }
    positions = _positions()
    rope = RotaryEmbedding(HEAD_DIM, base=THETA, rotary_dim=HEAD_DIM // 2, scaling=params)
    same = RotaryEmbedding(
        HEAD_DIM, base=THETA, rotary_dim=16, scaling={"type": "linear", "factor": 2.0}
    )
    got = rope.cos_sin(positions)
    assert all(torch.equal(a, b) for a, b in zip(got, same.cos_sin(positions)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.GPTNeoXConfig(
            hidden_size=HEAD_DIM * 4,
            num_attention_heads=4,
            max_position_embeddings=MAX_POS,
            rope_parameters=params,
        )
        cos, sin = GPTNeoXRotaryEmbedding(config)(torch.zeros(1), positions)
    for mine, peer in zip(got, (cos[..., :8], sin[..., :8])):
        torch.testing.assert_close(mine, peer, rtol=0, atol=TF_ATOL)


@pytest.mark.parametrize(
    ("family", "section_layout", "sections"),
    [("qwen2_vl", "contiguous", [2, 3, 3]), ("qwen3_vl", "interleaved", [4, 2, 2])],
)
def test_mrope_rope_parameters(family: str, section_layout: str, sections: list[int]) -> None:
    """Qwen2-VL's and Qwen3-VL's rope_parameters (mrope_section, mrope_interleaved) taken by
    an M-RoPE RotaryEmbedding of the same sections, against their own rotary modules."""
    import importlib

    head_dim = 16
    params = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": sections}
    if section_layout == "interleaved":
        params["mrope_interleaved"] = True
    rope = RotaryEmbedding(
        head_dim, base=1e6, sections=sections, section_layout=section_layout, scaling=params
    )
    assert rope.scaling is None
    g = torch.Generator().manual_seed(3)
    positions = torch.randint(0, 300, (2, SEQ, 3), generator=g)  # [b, s, 3]: t, h, w
    name = "Qwen2VLTextConfig" if family == "qwen2_vl" else "Qwen3VLTextConfig"
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cls = (
        module.Qwen2VLRotaryEmbedding if family == "qwen2_vl" else module.Qwen3VLTextRotaryEmbedding
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = getattr(transformers, name)(
            hidden_size=head_dim * 4,
            num_attention_heads=4,
            head_dim=head_dim,
            rope_parameters=params,
        )
        cos, sin = cls(config)(torch.zeros(1), positions.permute(2, 0, 1))
    for mine, peer in zip(rope.cos_sin(positions), (cos[..., :8], sin[..., :8])):
        torch.testing.assert_close(mine, peer, rtol=0, atol=TF_ATOL)


# --- refusals ---------------------------------------------------------------------------------

# id -> (RotaryEmbedding's arguments, the error's match)
BAD = {
    "theta-differs": (
        {"scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}},
        r"RotaryEmbedding: scaling's rope_theta must equal base=10000.0 .*pass base=500000.0\), "
        r"got 500000.0",
    ),
    "theta-string": (
        {"scaling": {"rope_theta": "1e4"}},
        r"rope_theta must equal base=10000.0 .*got '1e4'",
    ),
    "partial-differs": (
        {"scaling": {"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": 0.5}},
        r"partial_rotary_factor 0.5 rotates 16 of the 32 channels, but rotary_dim is 32: "
        r"pass rotary_dim=16",
    ),
    "mrope-without-sections": (
        {"scaling": {"rope_type": "default", "mrope_section": [4, 6, 6]}},
        r"mrope_section must equal sections=None \(pass sections=\[4, 6, 6\]\)",
    ),
    "mrope-other-sections": (
        {"sections": (4, 6, 6), "scaling": {"rope_type": "default", "mrope_section": [6, 6, 4]}},
        r"mrope_section must equal sections=\(4, 6, 6\)",
    ),
    "mrope-interleaved-contiguous": (
        {"sections": (4, 6, 6), "scaling": {"rope_type": "default", "mrope_interleaved": True}},
        r"mrope_interleaved True needs M-RoPE sections with section_layout='interleaved'",
    ),
    "types-disagree": (
        {"scaling": {"type": "linear", "rope_type": "yarn", "factor": 2.0}},
        "'type' and 'rope_type' disagree",
    ),
    "unknown-key": (
        {"scaling": {"rope_type": "linear", "factor": 2.0, "fator": 3}},
        "scaling 'linear' got unknown key 'fator'; allowed: factor",
    ),
    "unknown-type": (
        {"scaling": {"rope_type": "ntk-aware", "factor": 2.0}},
        "scaling type must be one of",
    ),
    "twice": (
        {
            "scaling": {
                "rope_type": "yarn",
                "factor": 2,
                "original_max_position": 8,
                "original_max_position_embeddings": 8,
            }
        },
        "got 'original_max_position' twice",
    ),
    "missing": (
        {"scaling": {"rope_type": "dynamic", "factor": 2.0}},
        "missing required key.*'max_position'",
    ),
    "bad-value": ({"scaling": {"rope_type": "linear", "factor": 0.5}}, "factor must be >= 1.0"),
}


@pytest.mark.parametrize(("kwargs", "match"), list(BAD.values()), ids=list(BAD))
def test_rotary_embedding_refuses(kwargs: dict, match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        RotaryEmbedding(HEAD_DIM, base=THETA, **kwargs)


# --- rope_frequencies: transformers' spelling deprecated for one release ------------------------

_DEPRECATION = (
    r"rope_frequencies\(scaling=...\) in transformers' spelling \(.*\) is deprecated .* posenc's "
    r"spelling .*scaling_from_transformers"
)


@pytest.mark.parametrize("case", [c for c in SPELLINGS if SPELLINGS[c][1] is not None])
def test_rope_frequencies_reads_transformers_spelling_with_a_warning(case: str) -> None:
    theirs, ours, _ = SPELLINGS[case]
    with pytest.warns(DeprecationWarning, match=_DEPRECATION):
        got = posenc.rope_frequencies(HEAD_DIM, base=THETA, scaling=theirs, seq_len=MAX_P)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # posenc's spelling: no warning
        expected = posenc.rope_frequencies(HEAD_DIM, base=THETA, scaling=ours, seq_len=MAX_P)
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]


@pytest.mark.parametrize(
    ("scaling", "match"),
    [
        (
            {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5},
            "rope_frequencies: scaling's rope_theta must equal base",
        ),
        (
            {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5},
            "pass the rotary dim instead",
        ),
        ({"rope_type": "default", "mrope_section": [4, 6, 6]}, "must equal sections=None"),
    ],
    ids=["theta", "partial", "mrope"],
)
def test_rope_frequencies_refuses_what_it_has_no_argument_for(scaling: dict, match: str) -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(PosEncError, match=match):
        posenc.rope_frequencies(HEAD_DIM, base=THETA, scaling=scaling)


def test_parse_scaling_stays_posenc_only() -> None:
    """parse_scaling (and so a saved config's scaling) keeps one spelling; its hint names
    where transformers' is read."""
    with pytest.raises(PosEncError, match="RotaryEmbedding\\(scaling=\\) takes it as is"):
        posenc.rotary.parse_scaling({"rope_type": "linear", "factor": 2.0})
