"""ALiBi: slopes against the paper and BLOOM, the bias against the float64 reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import PosEncError
from posenc import reference as ref
from posenc.bias import alibi_bias

# --- slopes ---------------------------------------------------------------------


@pytest.mark.parametrize("num_heads", range(1, 65))
def test_slopes_equal_the_paper_formula(num_heads, as_tensor):
    # The reference follows the paper's recursion in float64; posenc rounds its closed form once.
    expected = as_tensor(ref.alibi_slopes(num_heads))
    got = posenc.alibi_slopes(num_heads)
    assert got.dtype == torch.float32 and got.shape == (num_heads,)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("num_heads", [1, 2, 3, 5, 6, 8, 12, 16, 24, 32, 40, 64, 112])
def test_slopes_match_bloom(num_heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    # BLOOM's alibi row for key position 1 is the slope itself.
    alibi = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), num_heads, torch.float32)
    bloom = alibi.reshape(num_heads, 2)[:, 1]
    # BLOOM raises a float32 base to float32 powers: a few ulps from the exact value.
    torch.testing.assert_close(posenc.alibi_slopes(num_heads), bloom, rtol=1e-6, atol=0)


@pytest.mark.parametrize("num_heads", [4, 6, 12])
def test_bias_matches_bloom_up_to_a_per_query_constant(num_heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    # BLOOM adds m * j (softmax ignores a per-row constant); ours is -m (i - j) = m j - m i.
    length = 9
    bloom = build_alibi_tensor(torch.ones(1, length, dtype=torch.long), num_heads, torch.float32)
    bloom = bloom.reshape(num_heads, 1, length).expand(num_heads, length, length)
    alibi = posenc.ALiBiBias(num_heads)
    shifted = alibi.bias(length) + alibi.slopes[:, None, None] * torch.arange(length)[:, None]
    torch.testing.assert_close(shifted, bloom, rtol=1e-6, atol=1e-6)


# --- bias -----------------------------------------------------------------------


def test_values_are_exact_for_power_of_two_slopes():
    # 4 heads: slopes 2^-2, 2^-4, 2^-6, 2^-8, so every product is exact in float32.
    bias = posenc.ALiBiBias(4).bias(6)
    i = torch.arange(6)[:, None]
    j = torch.arange(6)[None, :]
    expected = -posenc.alibi_slopes(4)[:, None, None] * (i - j)
    assert torch.equal(bias, expected)
    assert bias.dtype == torch.float32 and bias.shape == (4, 6, 6)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("num_heads", [1, 5, 8])
def test_bias_equals_reference(num_heads, causal, as_tensor):
    bias = posenc.ALiBiBias(num_heads, causal=causal).bias(7)
    expected = ref.alibi_bias(range(7), range(7), ref.alibi_slopes(num_heads), causal=causal)
    torch.testing.assert_close(bias, as_tensor(expected), rtol=1e-6, atol=1e-7)


def test_causal_false_is_symmetric_and_non_positive():
    bias = posenc.ALiBiBias(3, causal=False).bias(8)
    assert torch.equal(bias, bias.transpose(-1, -2))
    assert bool((bias <= 0).all())


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_decoding_queries_are_the_last_positions(causal, as_tensor):
    alibi = posenc.ALiBiBias(6, causal=causal)
    step = alibi.bias(2, 9)
    assert step.shape == (6, 2, 9)
    assert torch.equal(step, alibi.bias(9)[:, -2:, :])
    expected = ref.alibi_bias([7, 8], range(9), ref.alibi_slopes(6), causal=causal)
    torch.testing.assert_close(step, as_tensor(expected), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_batched_positions(causal, as_tensor):
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    pos = posenc.positions.from_attention_mask(mask)  # left padding
    alibi = posenc.ALiBiBias(3, causal=causal)
    bias = alibi.bias(5, q_positions=pos, k_positions=pos)
    assert bias.shape == (3, 3, 5, 5)
    expected = ref.alibi_bias(pos.numpy(), pos.numpy(), ref.alibi_slopes(3), causal=causal)
    torch.testing.assert_close(bias, as_tensor(expected), rtol=1e-6, atol=1e-7)
    # One row of the batch equals the unbatched call with that row's positions.
    assert torch.equal(bias[2], alibi.bias(5, q_positions=pos[2], k_positions=pos[2]))


def test_batched_keys_with_shared_queries(as_tensor):
    k = torch.tensor([[0, 1, 2, 3], [10, 11, 12, 13]])
    q = torch.tensor([3])
    bias = posenc.ALiBiBias(2).bias(1, 4, q_positions=q, k_positions=k)
    expected = ref.alibi_bias(q.numpy(), k.numpy(), ref.alibi_slopes(2))
    assert bias.shape == (2, 2, 1, 4)
    torch.testing.assert_close(bias, as_tensor(expected), rtol=1e-6, atol=1e-7)


def test_fractional_positions(as_tensor):
    q = torch.tensor([0.5, 1.25, 7.0], dtype=torch.float64)
    k = torch.tensor([0.0, 0.75, 3.5, 7.0])
    bias = posenc.ALiBiBias(4, causal=False).bias(3, 4, q_positions=q, k_positions=k)
    expected = ref.alibi_bias(q.numpy(), k.numpy(), ref.alibi_slopes(4), causal=False)
    torch.testing.assert_close(bias, as_tensor(expected), rtol=1e-6, atol=1e-7)


def test_custom_slopes_are_used_and_round_trip(as_tensor):
    alibi = posenc.ALiBiBias(3, slopes=[0.5, 0.25, 0.0])
    expected = ref.alibi_bias(range(4), range(4), [0.5, 0.25, 0.0])
    assert torch.equal(alibi.bias(4), as_tensor(expected))
    rebuilt = posenc.build(alibi.to_config())
    assert rebuilt.to_config() == alibi.to_config()
    assert torch.equal(rebuilt.bias(4), alibi.bias(4))


def test_pure_function_equals_module():
    q, k = torch.arange(3, 8), torch.arange(8)
    module = posenc.ALiBiBias(5, causal=False)
    pure = alibi_bias(q, k, posenc.alibi_slopes(5), causal=False)
    assert torch.equal(pure, module.bias(5, 8, q_positions=q, k_positions=k))


@settings(max_examples=25)
@given(
    shift=st.integers(-10_000, 10_000),
    q_len=st.integers(1, 6),
    extra=st.integers(0, 6),
    causal=st.booleans(),
)
def test_bias_depends_only_on_the_offset(shift, q_len, extra, causal):
    alibi = posenc.ALiBiBias(4, causal=causal)  # power-of-two slopes: exact products
    k_len = q_len + extra
    base = alibi.bias(q_len, k_len)
    q = torch.arange(extra, k_len) + shift
    k = torch.arange(k_len) + shift
    assert torch.equal(alibi.bias(q_len, k_len, q_positions=q, k_positions=k), base)


# --- score_mod ------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_score_mod_equals_bias(causal, grid_score_mod):
    alibi = posenc.ALiBiBias(6, causal=causal)
    q, k = torch.arange(4, 9), torch.arange(9)
    expected = alibi.bias(5, 9, q_positions=q, k_positions=k)
    got = grid_score_mod(alibi.score_mod(q, k), 2, 6, 5, 9)
    assert torch.equal(got, expected.expand(2, 6, 5, 9))


def test_score_mod_equals_bias_batched(grid_score_mod):
    alibi = posenc.ALiBiBias(3)
    pos = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])
    expected = alibi.bias(5, q_positions=pos, k_positions=pos)
    got = grid_score_mod(alibi.score_mod(pos, pos), 2, 3, 5, 5)
    assert torch.equal(got, expected)
    # A batch-1 position tensor serves every batch row.
    got = grid_score_mod(alibi.score_mod(pos[:1], pos[:1]), 2, 3, 5, 5)
    assert torch.equal(got, expected[:1].expand(2, 3, 5, 5))


def test_score_mod_adds_to_the_score():
    alibi = posenc.ALiBiBias(2)
    pos = torch.arange(4)
    score = torch.randn(1, 2, 4, 4)
    idx = (
        torch.zeros(1, 1, 1, 1, dtype=torch.long),
        torch.arange(2)[None, :, None, None],
        torch.arange(4)[None, None, :, None],
        torch.arange(4)[None, None, None, :],
    )
    got = alibi.score_mod(pos, pos)(score, *idx)
    torch.testing.assert_close(got, score + alibi.bias(4)[None], rtol=0, atol=1e-6)


# --- module behaviour -----------------------------------------------------------


def test_slopes_stay_float32_and_out_of_state_dict():
    alibi = posenc.ALiBiBias(12)
    assert alibi.state_dict() == {}
    alibi.to(torch.bfloat16)
    assert alibi.slopes.dtype == torch.float32
    assert torch.equal(alibi.slopes, posenc.alibi_slopes(12))
    assert alibi.bias(3).dtype == torch.float32


def test_meta_device_then_to_empty():
    with torch.device("meta"):
        alibi = posenc.ALiBiBias(6)
    assert alibi.slopes.is_meta
    alibi.to_empty(device="cpu")
    assert torch.equal(alibi.slopes, posenc.alibi_slopes(6))


def test_registry_builds_alibi():
    alibi = posenc.build("alibi", num_heads=8, causal=False)
    assert isinstance(alibi, posenc.ALiBiBias) and alibi.kind == "bias"
    assert alibi.to_config() == {"name": "alibi", "num_heads": 8, "causal": False, "slopes": None}


# --- bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: posenc.alibi_slopes(0), "num_heads must be >= 1, got 0"),
        (lambda: posenc.alibi_slopes(2.0), "num_heads must be an integer"),
        (lambda: posenc.ALiBiBias(0), "num_heads must be >= 1, got 0"),
        (lambda: posenc.ALiBiBias(4, causal="yes"), "causal must be one of True, False"),
        (
            lambda: posenc.ALiBiBias(4, slopes=[0.5, 0.25]),
            r"slopes must have num_heads \(4\) values, got 2",
        ),
        (
            lambda: posenc.ALiBiBias(2, slopes=[0.5, -1.0]),
            r"slopes\[1\] must be finite and >= 0, got -1.0",
        ),
        (lambda: posenc.ALiBiBias(2, slopes=[0.5, float("nan")]), r"slopes\[1\] must be finite"),
        (lambda: posenc.ALiBiBias(2, slopes="ab"), "slopes must be a sequence of numbers"),
        (
            lambda: posenc.ALiBiBias(2, slopes=torch.ones(2, 1)),
            r"slopes must be a 1-D \[h\] tensor",
        ),
        (lambda: posenc.ALiBiBias(2).bias(0), "q_len must be >= 1, got 0"),
        (lambda: posenc.ALiBiBias(2).bias(3, 0), "k_len must be >= 1, got 0"),
        (
            lambda: posenc.ALiBiBias(2).bias(3, q_positions=torch.arange(4)),
            r"q_positions must have length 3 \(the sequence length\)",
        ),
        (
            lambda: posenc.ALiBiBias(2).bias(2, 5, k_positions=torch.arange(4)),
            r"k_positions must have length 5",
        ),
        (
            lambda: posenc.ALiBiBias(2).bias(2, q_positions=torch.zeros(1, 1, 2)),
            r"q_positions must be \[s\] or \[b, s\]",
        ),
        (
            lambda: posenc.ALiBiBias(2).bias(
                2, q_positions=torch.zeros(2, 2), k_positions=torch.zeros(3, 2)
            ),
            "q_positions and k_positions must have the same batch size",
        ),
        (
            lambda: posenc.ALiBiBias(2).bias(2, q_positions=torch.tensor([0.0, float("nan")])),
            "q_positions must be finite",
        ),
        (
            lambda: posenc.ALiBiBias(2).score_mod(torch.arange(2), torch.tensor([True, False])),
            "k_positions must be an integer or floating tensor",
        ),
        (
            lambda: alibi_bias(torch.arange(2), torch.arange(2), torch.ones(2, 2)),
            r"slopes must be a non-empty \[h\] tensor",
        ),
        (
            lambda: alibi_bias(torch.arange(2), torch.arange(2), torch.arange(2)),
            "slopes must have a floating-point dtype",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()
