"""Each property on encodings whose answer is known analytically."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import PosEncError, registry
from posenc.analysis import (
    boundedness,
    decay,
    properties,
    resolve_encoding,
    roformer_bound,
    shift_structure,
    uniqueness,
)


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# --- boundedness ---------------------------------------------------------------------------


def test_naive_index_is_unbounded_and_swamps_tokens():
    r = boundedness({"name": "index", "dim": 16}, 300)
    p = torch.arange(300, dtype=torch.float64)
    torch.testing.assert_close(_t(r.norms), p * 4.0)  # p * sqrt(16)
    assert r.reference_norm == 4.0  # sqrt(dim): an N(0, 1) token
    assert (r.bounded, r.first_swamping, r.max_ratio) == (False, 2.0, 299.0)
    assert r.growth == pytest.approx(299 / 149)


@pytest.mark.parametrize("dim", [2, 8, 64])
def test_sinusoidal_norm_is_constant(dim):
    r = boundedness({"name": "sinusoidal", "dim": dim}, 256)
    expected = torch.full((256,), math.sqrt(dim / 2), dtype=torch.float64)
    torch.testing.assert_close(_t(r.norms), expected)
    assert r.bounded and r.first_swamping is None


def test_rotary_keeps_norms_and_bias_norm_is_the_largest_head():
    rope = boundedness("rope", 128)
    torch.testing.assert_close(_t(rope.norms), torch.ones(128, dtype=torch.float64))
    assert rope.bounded and rope.reference_norm == 1.0
    r = boundedness({"name": "alibi", "num_heads": 4}, 64)  # slopes 2^-2, 2^-4, 2^-6, 2^-8
    torch.testing.assert_close(_t(r.norms), 0.25 * torch.arange(64, dtype=torch.float64))
    assert not r.bounded and r.unit == "distance"


def test_none_is_zero_and_bounded():
    r = boundedness("none", 32)
    assert r.norms == (0.0,) * 32 and r.bounded and r.max_ratio == 0.0


def test_token_norm_and_swamp_ratio_are_used():
    r = boundedness({"name": "index", "dim": 4}, 100, token_norm=20.0, swamp_ratio=2.0)
    assert r.first_swamping == 21.0  # 2 * p > 2 * 20


# --- uniqueness ----------------------------------------------------------------------------

ONE_FREQUENCY = {"name": "sinusoidal", "dim": 2}  # (sin p, cos p): period 2 pi


def test_single_frequency_collides_at_two_pi():
    pos = torch.tensor([0.0, 1.0, 2 * math.pi, 3.0, 1.0 + 2 * math.pi], dtype=torch.float64)
    r = uniqueness(ONE_FREQUENCY, pos)
    pairs = sorted((c.a, c.b) for c in r.collisions)
    assert pairs == [(0.0, 2 * math.pi), (1.0, 1.0 + 2 * math.pi)]
    assert not r.unique and r.num_collisions == 2


def test_single_frequency_integer_positions_nearly_repeat_every_710():
    # 710 = 113 * 2 pi + 6e-5: the closest integer return of a 2 pi period below 1000.
    r = uniqueness(ONE_FREQUENCY, 1000, dtype=torch.float64, max_examples=500)
    assert r.num_collisions == 290
    assert {c.b - c.a for c in r.collisions} == {710.0}
    assert r.min_distance == pytest.approx(abs(2 * math.sin(710 / 2)), rel=1e-6)


def test_bf16_positions_merge_far_positions():
    rounded = uniqueness("sinusoidal", 1024, position_dtype=torch.bfloat16, max_examples=10_000)
    assert not rounded.unique
    for c in rounded.collisions:  # every collision is two positions bf16 cannot tell apart
        a, b = torch.tensor([c.a, c.b]).to(torch.bfloat16)
        assert a == b and c.distance == 0.0
    assert (
        min(c.a for c in rounded.collisions) == 256
    )  # bf16 holds every integer to 256: 257 -> 256
    assert uniqueness("sinusoidal", 1024).unique  # exact positions: all distinct


def test_none_collides_everywhere_and_t5_merges_far_distances():
    r = uniqueness("none", 20)
    assert r.num_collisions == 20 * 19 // 2 and r.min_distance == 0.0
    t5 = uniqueness({"name": "t5", "num_heads": 4, "max_distance": 32}, 100, max_examples=10_000)
    far = [c for c in t5.collisions if c.a >= 32]
    assert len(far) == 68 * 67 // 2  # distances 32..99 share the last bucket
    assert uniqueness("alibi", 100).unique


# --- shift structure -----------------------------------------------------------------------


@settings(max_examples=8)
@given(half=st.integers(1, 24), base=st.floats(10.0, 1e5))
def test_sinusoidal_dot_product_depends_only_on_offset(half, base):
    enc = posenc.SinusoidalEmbedding(2 * half, base=base)
    s = shift_structure(enc, 8 * half + 16)
    assert s.dot_depends_only_on_offset and s.linear_map_holds
    assert max(s.linear_map_residuals) < 1e-5


@pytest.mark.parametrize("name", ["rope", "xpos", "mrope", "axial_rope"])
def test_rotary_shift_is_one_rotation(name):
    s = shift_structure(name, 96)
    assert s.linear_map_holds and s.dot_depends_only_on_offset, s


@pytest.mark.parametrize("name", ["index", "learned"])
def test_index_and_learned_are_not_shift_maps(name):
    s = shift_structure(name, 256)
    assert s.linear_map_determined and not s.linear_map_holds
    assert not s.dot_depends_only_on_offset


def test_underdetermined_fit_is_flagged():
    s = shift_structure("learned", 32)  # 64 channels, fewer positions
    assert s.linear_map_determined is False and s.linear_map_holds is False


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire"])
def test_relative_biases_depend_only_on_offset(name):
    s = shift_structure(name, 64)
    assert s.linear_map_residuals is None and s.dot_depends_only_on_offset


# --- decay ---------------------------------------------------------------------------------


def test_sinusoidal_decay_is_the_cosine_sum():
    dim, base = 32, 10000.0
    d = decay({"name": "sinusoidal", "dim": dim, "base": base}, 50, anchors=4)
    w = base ** (-2.0 * torch.arange(dim // 2, dtype=torch.float64) / dim)
    k = torch.arange(51, dtype=torch.float64)
    expected = torch.cos(k[:, None] * w).sum(-1)  # sin a sin b + cos a cos b = cos(a - b)
    torch.testing.assert_close(_t(d.similarity), expected, atol=1e-5, rtol=0)


def test_rope_expected_qk_is_twice_the_cosine_sum_and_matches_sinusoidal():
    rope = resolve_encoding({"name": "rope", "head_dim": 32})
    d = decay(rope, 40)
    k = torch.arange(41, dtype=torch.float64)
    expected = 2 * torch.cos(k[:, None] * rope.inv_freq.double()).sum(-1)
    torch.testing.assert_close(_t(d.similarity), expected, atol=1e-5, rtol=0)
    sinusoidal = decay({"name": "sinusoidal", "dim": 32}, 40)
    torch.testing.assert_close(_t(d.normalized), _t(sinusoidal.normalized))


def _roformer_bound_loops(theta: np.ndarray, k: int) -> float:
    """Su et al. (2021), section 3.4.3, written out: (1/(d/2)) sum_j |sum_{i<j} e^{i k theta_i}|."""
    total = 0.0
    for j in range(1, len(theta) + 1):
        s = 0j
        for i in range(j):
            s += complex(math.cos(k * theta[i]), math.sin(k * theta[i]))
        total += abs(s)
    return total / len(theta)


def test_roformer_bound_matches_the_paper_formula():
    theta = 10000.0 ** (-2.0 * np.arange(16) / 32)
    ks = [0, 1, 5, 33, 250]
    got = roformer_bound(torch.tensor(theta), torch.tensor(ks))
    expected = torch.tensor([_roformer_bound_loops(theta, k) for k in ks], dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    rope = decay({"name": "rope", "head_dim": 32}, 250)
    torch.testing.assert_close(_t([rope.bound[k] for k in ks]), expected)


def test_alibi_decay_is_the_slope_per_head():
    alibi = resolve_encoding({"name": "alibi", "num_heads": 4})
    d = decay(alibi, 20)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)], dtype=torch.float64)
    expected = -slopes[:, None] * torch.arange(21, dtype=torch.float64)
    torch.testing.assert_close(_t(d.per_head), expected)
    assert d.normalized is None and d.bound is None


# --- every registered encoding -------------------------------------------------------------


@pytest.mark.parametrize("name", registry.names())
def test_every_registered_encoding_is_measured_with_defaults(name):
    props = properties(name, 48, shift_positions=48, max_distance=16)
    data = json.loads(json.dumps(props.to_dict(), allow_nan=False))
    assert data["encoding"] == name and data["kind"] == registry.get(name).kind
    row = props.summary()
    assert set(row) >= {"bounded", "unique", "offset_only", "decay_far"}


def test_instances_and_configs_are_accepted():
    enc = posenc.SinusoidalEmbedding(8)
    assert resolve_encoding(enc) is enc
    assert resolve_encoding({"name": "sinusoidal", "dim": 8}).to_config() == enc.to_config()
    assert resolve_encoding("learned").to_config()["max_len"] == 2048


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: boundedness("nosuch"), "name must be one of"),
        (lambda: boundedness(42), "encoding must be a registry name"),
        (lambda: boundedness({"dim": 4}), "must hold a 'name' key"),
        (
            lambda: uniqueness("sinusoidal", (5, 5)),
            r"non-empty range with start < stop, got \(5, 5\)",
        ),
        (lambda: uniqueness("sinusoidal", (10, 2)), "non-empty range"),
        (lambda: uniqueness("sinusoidal", 0), "non-empty range"),
        (lambda: uniqueness("sinusoidal", (1, 2, 3)), r"\(start, stop\) pair"),
        (lambda: uniqueness("sinusoidal", torch.zeros(2, 3)), "1-D tensor"),
        (lambda: uniqueness("sinusoidal", torch.tensor([1.0, math.nan])), "finite"),
        (lambda: uniqueness("sinusoidal", [3]), "at least 2 positions"),
        (lambda: uniqueness("alibi", torch.tensor([-1, 2])), "must be >= 0"),
        (lambda: uniqueness("sinusoidal", 8, rtol=-1.0), "rtol must be >= 0"),
        (lambda: shift_structure("sinusoidal", 8, offsets=[8]), "offsets must be <= 7"),
        (lambda: shift_structure("sinusoidal", 8, offsets=[]), "offsets must be a non-empty"),
        (lambda: decay("sinusoidal", 0), "max_distance must be >= 1"),
        (lambda: decay("sinusoidal", 4, anchors=0), "anchors must be >= 1"),
        (lambda: boundedness("index", 8, token_norm=0.0), "token_norm must be > 0"),
        (lambda: properties("rope", 1), "positions must be >= 2"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(PosEncError, match=match):
        call()
