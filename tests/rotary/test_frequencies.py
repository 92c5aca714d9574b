"""rope_frequencies and the scaling registry: against the float64 reference, against
transformers' ROPE_INIT_FUNCTIONS for every shared rope type (its dicts read by
posenc.integrations.transformers.scaling_from_transformers), mathematical facts, the
registry. Parsing and the position-dependent hook: test_scalings.py; bad input:
test_scaling_errors.py.

Tolerances: posenc and the reference both compute in float64 (rtol 1e-12). transformers
computes ``base ** (2i / dim)`` in float32, so its frequencies carry a relative error of a
few float32 ulps (eps = 1.2e-7; measured <= 2.2e-7): rtol 1e-6 against it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import reference
from posenc.integrations.transformers import scaling_from_transformers
from posenc.rotary import (
    SCALINGS,
    DynamicScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    YarnScaling,
    parse_scaling,
)

from ._scaling_cases import ORIGINAL, tf_llama3, tf_longrope
from ._scaling_cases import longrope_factors as _longrope_factors

TF_RTOL = 1e-6  # transformers' float32 frequencies
REF_RTOL = 1e-12  # float64 against float64

HEAD_DIM = 64
MAX_POS = 2048  # transformers' max_position_embeddings in every config below
SEQ_LENS = [None, 300, ORIGINAL, ORIGINAL + 1, 1500, MAX_POS, 5000]  # inside and beyond


# name -> transformers' rope_parameters (without rope_theta), in transformers' spelling.
TF_CASES: dict[str, dict] = {
    "linear": {"rope_type": "linear", "factor": 3.0},
    # the whole head rotating (partial 1): tests/rotary/test_proportional.py has the rest
    "proportional": {"rope_type": "proportional", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "yarn-untruncated": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
        "truncate": False,
    },
    "yarn-truncate-none": {  # transformers reads truncate=None as false
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
        "truncate": None,
    },
    "yarn-mscale-ratio": {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": ORIGINAL,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "beta_fast": 16,
        "beta_slow": 2,
    },
    "yarn-mscale-only": {  # mscale alone is ignored by transformers: 0.1 ln(factor) + 1
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": ORIGINAL,
        "mscale": 0.707,
    },
    "yarn-attention-factor": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": ORIGINAL,
        "attention_factor": 0.75,
    },
    "yarn-factor-none": {  # DeepSeek style: factor = max_position / original
        "rope_type": "yarn",
        "factor": None,
        "original_max_position_embeddings": ORIGINAL,
    },
    "yarn-ramp-clamped": {  # high bound past dim/2: transformers clamps at dim - 1
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 2**20,
        "beta_slow": 0.25,
    },
    "longrope": tf_longrope(ORIGINAL, _longrope_factors(HEAD_DIM)),
    "longrope-factor-none": {  # Phi-3 style: attention scale from max_position / original
        "rope_type": "longrope",
        "original_max_position_embeddings": ORIGINAL,
        **_longrope_factors(HEAD_DIM),
    },
    "longrope-attention-factor": tf_longrope(
        ORIGINAL, _longrope_factors(HEAD_DIM), attention_factor=1.3
    ),
    "llama3": tf_llama3(ORIGINAL),
}


def _tf_config(rope_parameters: dict, *, base: float, partial: float | None = None):
    from transformers import LlamaConfig

    params = {**rope_parameters, "rope_theta": base}
    if partial is not None:
        params["partial_rotary_factor"] = partial
    return LlamaConfig(
        hidden_size=HEAD_DIM * 2,
        num_attention_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POS,
        rope_parameters=params,
    )


def _ours(rope_parameters: dict):
    """posenc's dataclass for transformers' dict plus what its functions read from the config
    (max_position_embeddings)."""
    if rope_parameters["rope_type"] in ("dynamic", "yarn", "longrope"):
        rope_parameters = {**rope_parameters, "max_position_embeddings": MAX_POS}
    return scaling_from_transformers(rope_parameters)


def _tf_frequencies(cfg, seq_len):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS[cfg.rope_parameters["rope_type"]](cfg, "cpu", seq_len=seq_len)


def _reference(dim, base, scaling, seq_len):
    params = parse_scaling(scaling)
    spec = None if params is None else dataclasses.asdict(params)
    inv_freq, scale = reference.rope_frequencies(dim, base=base, scaling=spec, seq_len=seq_len)
    return torch.from_numpy(inv_freq), scale


# --- against transformers ----------------------------------------------------------------------


@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("case", sorted(TF_CASES))
def test_matches_transformers(case: str, base: float) -> None:
    cfg = _tf_config(TF_CASES[case], base=base)
    for seq_len in SEQ_LENS:
        expected, expected_scale = _tf_frequencies(cfg, seq_len)
        inv_freq, scale = posenc.rope_frequencies(
            HEAD_DIM, base=base, scaling=_ours(TF_CASES[case]), seq_len=seq_len
        )
        assert inv_freq.dtype == torch.float64 and inv_freq.shape == (HEAD_DIM // 2,)
        torch.testing.assert_close(
            inv_freq,
            expected.double(),
            rtol=TF_RTOL,
            atol=0,
            msg=lambda m, s=seq_len: f"seq_len={s}: {m}",
        )
        assert scale == pytest.approx(expected_scale, rel=1e-12), f"seq_len={seq_len}"


@pytest.mark.parametrize("case", ["linear", "yarn", "longrope", "llama3", "dynamic"])
def test_matches_transformers_partial_rotary(case: str) -> None:
    """partial_rotary_factor: transformers' scaled functions use dim = head_dim * factor."""
    rope = dict(TF_CASES[case])
    if case == "longrope":
        rope.update(_longrope_factors(HEAD_DIM // 4))
    cfg = _tf_config(rope, base=10000.0, partial=0.25)
    for seq_len in (None, 1000, 5000):
        expected, expected_scale = _tf_frequencies(cfg, seq_len)
        inv_freq, scale = posenc.rope_frequencies(
            HEAD_DIM // 4, scaling=_ours(rope), seq_len=seq_len
        )
        torch.testing.assert_close(inv_freq, expected.double(), rtol=TF_RTOL, atol=0)
        assert scale == pytest.approx(expected_scale, rel=1e-12)


def test_default_matches_transformers() -> None:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = _tf_config({"rope_type": "default"}, base=10000.0)
    expected, expected_scale = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    default = scaling_from_transformers({"rope_type": "default"})
    for scaling in (None, default, {"type": "default", "factor": None}):
        inv_freq, scale = posenc.rope_frequencies(HEAD_DIM, scaling=scaling)
        torch.testing.assert_close(inv_freq, expected.double(), rtol=TF_RTOL, atol=0)
        assert scale == expected_scale == 1.0


def test_dynamic_matches_transformers_with_tensor_seq_len() -> None:
    """At run time transformers passes seq_len = max(position_ids) + 1 as a tensor."""
    cfg = _tf_config(TF_CASES["dynamic"], base=10000.0)
    for length in (100, 4096, 100_000):
        seq_len = torch.tensor(length)
        expected, _ = _tf_frequencies(cfg, seq_len)
        inv_freq, _ = posenc.rope_frequencies(
            HEAD_DIM, scaling=_ours(TF_CASES["dynamic"]), seq_len=seq_len
        )
        torch.testing.assert_close(inv_freq, expected.double(), rtol=TF_RTOL, atol=0)


# --- against the float64 reference ------------------------------------------------------------

OWN_CASES: dict[str, object] = {
    **{name: _ours(spec) for name, spec in TF_CASES.items()},
    "ntk": {"type": "ntk", "factor": 4.0},
    "ntk-dataclass": NTKScaling(factor=2.5),
    "linear-dataclass": LinearScaling(factor=1.5),
    "llama3-real": Llama3Scaling(
        factor=8, low_freq_factor=1, high_freq_factor=4, original_max_position=8192
    ),
}


@pytest.mark.parametrize("dim", [8, 64, 130])
@pytest.mark.parametrize("case", sorted(OWN_CASES))
def test_matches_reference(case: str, dim: int) -> None:
    scaling = OWN_CASES[case]
    if isinstance(scaling, LongRopeScaling):
        scaling = dataclasses.replace(scaling, **_longrope_factors(dim))
    for base in (10000.0, 1e6):
        for seq_len in SEQ_LENS:
            inv_freq, scale = posenc.rope_frequencies(
                dim, base=base, scaling=scaling, seq_len=seq_len
            )
            expected, expected_scale = _reference(dim, base, scaling, seq_len)
            torch.testing.assert_close(inv_freq, expected, rtol=REF_RTOL, atol=0)
            assert scale == pytest.approx(expected_scale, rel=1e-14)


def test_reference_default_is_roformer() -> None:
    inv_freq, scale = reference.rope_frequencies(6, base=100.0)
    np.testing.assert_allclose(inv_freq, [1.0, 100 ** (-2 / 6), 100 ** (-4 / 6)], rtol=1e-15)
    assert scale == 1.0


# --- facts -------------------------------------------------------------------------------------

dims = st.integers(2, 128).map(lambda n: 2 * n)
bases = st.floats(2.0, 1e7)
factors = st.floats(1.0, 64.0)


@given(dim=dims, base=bases, factor=factors)
def test_linear_is_default_over_factor(dim: int, base: float, factor: float) -> None:
    plain, _ = posenc.rope_frequencies(dim, base=base)
    inv_freq, scale = posenc.rope_frequencies(
        dim, base=base, scaling={"type": "linear", "factor": factor}
    )
    torch.testing.assert_close(inv_freq, plain / factor, rtol=1e-15, atol=0)
    assert scale == 1.0


@given(
    dim=dims,
    base=bases,
    factor=factors,
    max_position=st.integers(1, 10**6),
    seq_len=st.integers(-10, 10**6),
)
def test_dynamic_is_unscaled_within_max_position(dim, base, factor, max_position, seq_len) -> None:
    scaling = DynamicScaling(factor=factor, max_position=max_position)
    plain, _ = posenc.rope_frequencies(dim, base=base)
    inv_freq, _ = posenc.rope_frequencies(dim, base=base, scaling=scaling, seq_len=seq_len)
    if seq_len <= max_position:
        assert torch.equal(inv_freq, plain)
    before, _ = posenc.rope_frequencies(dim, base=base, scaling=scaling)  # state before any call
    assert torch.equal(before, plain)


@given(dim=dims.filter(lambda d: d >= 4), base=bases, factor=factors, ratio=st.floats(1.0, 50.0))
def test_dynamic_is_ntk_with_the_length_dependent_factor(dim, base, factor, ratio) -> None:
    """Dynamic NTK at seq_len = ratio * max_position is static NTK with factor f * ratio - (f - 1)."""
    max_position = 1000
    seq_len = ratio * max_position
    dynamic, _ = posenc.rope_frequencies(
        dim,
        base=base,
        scaling=DynamicScaling(factor=factor, max_position=max_position),
        seq_len=seq_len,
    )
    ntk, _ = posenc.rope_frequencies(
        dim, base=base, scaling=NTKScaling(factor=factor * ratio - (factor - 1))
    )
    torch.testing.assert_close(dynamic, ntk, rtol=1e-12, atol=0)


@given(dim=dims.filter(lambda d: d >= 4), base=bases, factor=factors)
def test_ntk_keeps_the_highest_and_interpolates_the_lowest_frequency(dim, base, factor) -> None:
    plain, _ = posenc.rope_frequencies(dim, base=base)
    ntk, _ = posenc.rope_frequencies(dim, base=base, scaling={"type": "ntk", "factor": factor})
    assert ntk[0] == plain[0] == 1.0
    # the last frequency is base^-(dim-2)/dim: the new base divides it by exactly factor
    assert float(ntk[-1]) == pytest.approx(float(plain[-1]) / factor, rel=1e-10)


@given(dim=dims, base=bases)
def test_factor_one_is_default(dim: int, base: float) -> None:
    plain, _ = posenc.rope_frequencies(dim, base=base)
    for scaling in (
        LinearScaling(factor=1),
        YarnScaling(factor=1, original_max_position=4096),
        Llama3Scaling(factor=1, low_freq_factor=1, high_freq_factor=4, original_max_position=8192),
    ):
        inv_freq, scale = posenc.rope_frequencies(dim, base=base, scaling=scaling, seq_len=10**6)
        torch.testing.assert_close(inv_freq, plain, rtol=1e-14, atol=0)
        assert scale == 1.0


def test_longrope_switches_once_the_largest_position_reaches_the_original_context() -> None:
    scaling = LongRopeScaling(original_max_position=ORIGINAL, factor=4.0, **_longrope_factors(8))
    plain, _ = posenc.rope_frequencies(8)
    short = plain / torch.tensor(scaling.short_factor, dtype=torch.float64)
    long = plain / torch.tensor(scaling.long_factor, dtype=torch.float64)
    # seq_len = largest position + 1: position ORIGINAL - 1 is short, position ORIGINAL is long
    for seq_len, expected in [
        (None, short),
        (1, short),
        (ORIGINAL, short),
        (ORIGINAL + 1, long),
        (10**7, long),
    ]:
        inv_freq, scale = posenc.rope_frequencies(8, scaling=scaling, seq_len=seq_len)
        torch.testing.assert_close(inv_freq, expected, rtol=1e-15, atol=0)
        assert scale == math.sqrt(1 + math.log(4.0) / math.log(ORIGINAL))


def test_yarn_keeps_high_and_interpolates_low_frequencies() -> None:
    dim, factor = 128, 16.0
    plain, _ = posenc.rope_frequencies(dim, base=10000.0)
    inv_freq, scale = posenc.rope_frequencies(
        dim, base=10000.0, scaling=YarnScaling(factor=factor, original_max_position=4096)
    )
    ratio = plain / inv_freq
    assert torch.equal(ratio[:10], torch.ones(10, dtype=torch.float64))
    torch.testing.assert_close(ratio[-10:], torch.full((10,), factor, dtype=torch.float64))
    assert scale == pytest.approx(0.1 * math.log(factor) + 1.0)


# --- registry and dataclasses ------------------------------------------------------------------


def test_registry_pairs_each_type_with_its_dataclass() -> None:
    assert set(SCALINGS) == {
        "linear",
        "dynamic",
        "ntk",
        "yarn",
        "longrope",
        "llama3",
        "proportional",
    }
    for name, (cls, fn) in SCALINGS.items():
        assert cls.type == name
        assert callable(fn)
    dependent = {name for name, (cls, _) in SCALINGS.items() if cls.position_dependent}
    assert dependent == {"dynamic", "longrope"}


@pytest.mark.parametrize("case", sorted(OWN_CASES))
def test_config_round_trip(case: str) -> None:
    params = parse_scaling(OWN_CASES[case])
    again = parse_scaling(dataclasses.asdict(params))
    assert again == params and again.type == params.type
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.factor = 2.0  # type: ignore[misc]
