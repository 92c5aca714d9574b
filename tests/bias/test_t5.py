"""T5 buckets against transformers' T5, the bias against T5Attention and the reference."""

from __future__ import annotations

import warnings

import pytest
import torch

import posenc
from posenc import PosEncError
from posenc import reference as ref
from posenc.bias import t5_relative_bias

# (num_buckets, max_distance, causal): T5's defaults, smaller and larger tables,
# max_distance at its smallest allowed value, odd bucket counts, the fewest buckets.
OPTIONS = [
    *[
        (nb, md, causal)
        for nb, md in [(32, 128), (16, 64), (8, 16), (64, 256), (10, 20), (6, 100)]
        for causal in (False, True)
    ],
    (32, 16, False),
    (32, 17, True),
    (19, 16, True),
    (4, 2, False),
    (4, 3, True),
    (2, 2, True),
]
# Relative positions past max_distance in both directions, and very far ones.
RELATIVE = torch.cat([torch.arange(-600, 601), torch.tensor([-(10**6), -4097, 4097, 10**6])])


def hf_bucket(rel, causal, num_buckets, max_distance):
    """transformers' T5 buckets (its spelling: ``bidirectional = not causal``)."""
    from transformers.models.t5.modeling_t5 import T5Attention

    return T5Attention._relative_position_bucket(
        rel, bidirectional=not causal, num_buckets=num_buckets, max_distance=max_distance
    )


def options_ids(opt):
    direction = "" if len(opt) == 2 else ("-causal" if opt[2] else "-noncausal")
    return f"buckets{opt[0]}-dist{opt[1]}{direction}"


@pytest.mark.parametrize("options", OPTIONS, ids=options_ids)
def test_bucket_equals_transformers(options):
    num_buckets, max_distance, causal = options
    expected = hf_bucket(RELATIVE, causal, num_buckets, max_distance)
    got = posenc.t5_relative_bucket(
        RELATIVE, causal=causal, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(got, expected)
    # The module's lookup table gives the same buckets (query at 0, keys at the offsets).
    module = posenc.T5RelativeBias(
        2, num_buckets=num_buckets, max_distance=max_distance, causal=causal
    )
    table = module.buckets(1, RELATIVE.numel(), q_positions=torch.tensor([0]), k_positions=RELATIVE)
    assert torch.equal(table[0], expected)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("options", [(32, 128), (16, 64), (8, 16), (64, 256)], ids=options_ids)
def test_bucket_equals_reference(options, causal):
    num_buckets, max_distance = options
    options = dict(causal=causal, num_buckets=num_buckets, max_distance=max_distance)
    expected = torch.tensor([ref.t5_relative_bucket(int(r), **options) for r in RELATIVE])
    got = posenc.t5_relative_bucket(
        RELATIVE, causal=causal, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(got, expected)


def test_float32_boundary_follows_t5_not_exact_arithmetic():
    # log(12 / 9) / log(16 / 9) * 10 is exactly 5 (12/9 = (16/9)^(1/2)); T5's float32
    # logarithm lands just above it. posenc follows T5 (checkpoint parity); the exact
    # reference gives the bucket one lower.
    rel = torch.tensor([-12])
    got = posenc.t5_relative_bucket(rel, causal=True, num_buckets=19, max_distance=16)
    assert torch.equal(got, hf_bucket(rel, True, 19, 16))
    assert int(got) == 14
    assert ref.t5_relative_bucket(-12, causal=True, num_buckets=19, max_distance=16) == 13


def test_buckets_are_in_range_and_monotone_in_distance():
    for causal in (False, True):
        b = posenc.t5_relative_bucket(RELATIVE, causal=causal)
        assert int(b.min()) >= 0 and int(b.max()) <= 31
        distance = torch.arange(2000)
        for sign in (-1, 1):  # keys before, then after the query
            b = posenc.t5_relative_bucket(sign * distance, causal=causal)
            assert bool((b[1:] >= b[:-1]).all())


def test_int32_relative_positions():
    rel = RELATIVE.to(torch.int32)
    assert torch.equal(posenc.t5_relative_bucket(rel), hf_bucket(RELATIVE, False, 32, 128))


def hf_attention(num_heads, num_buckets, max_distance, causal, weight):
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    config = T5Config(
        d_model=16,
        d_kv=4,
        num_heads=num_heads,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=causal,
    )
    attention = T5Attention(config, has_relative_attention_bias=True)
    with torch.no_grad():
        attention.relative_attention_bias.weight.copy_(weight)
    return attention


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("options", [(32, 128), (8, 16)], ids=options_ids)
def test_bias_equals_t5_attention(options, causal):
    num_buckets, max_distance = options
    t5 = posenc.T5RelativeBias(4, num_buckets=num_buckets, max_distance=max_distance, causal=causal)
    with torch.no_grad():
        t5.weight.normal_()
    hf = hf_attention(4, num_buckets, max_distance, causal, t5.weight)
    expected = hf.compute_bias(40, 40)[0]  # [h, q, k]
    assert torch.equal(t5.bias(40), expected)
    # Decoding: 3 new queries after 37 cached positions.
    expected = hf.compute_bias(3, 40, past_seen_tokens=37)[0]
    assert torch.equal(t5.bias(3, 40), expected)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_bias_equals_reference(causal, as_tensor):
    t5 = posenc.T5RelativeBias(3, num_buckets=8, max_distance=12, causal=causal)
    table = t5.weight.detach().double().numpy()
    q, k = torch.arange(14, 20), torch.arange(20)
    expected = ref.t5_relative_bias(q.numpy(), k.numpy(), table, causal=causal, max_distance=12)
    got = t5.bias(6, 20)
    assert got.dtype == torch.float32
    assert torch.equal(got, as_tensor(expected))


def test_batched_positions_equal_reference(as_tensor):
    t5 = posenc.T5RelativeBias(2, num_buckets=16, max_distance=32)
    table = t5.weight.detach().double().numpy()
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    pos = posenc.positions.from_attention_mask(mask)
    got = t5.bias(6, q_positions=pos, k_positions=pos)
    assert got.shape == (2, 2, 6, 6)
    expected = ref.t5_relative_bias(pos.numpy(), pos.numpy(), table, max_distance=32)
    assert torch.equal(got, as_tensor(expected))
    # Shared keys, batched queries.
    got = t5.bias(1, 6, q_positions=torch.tensor([[5], [40]]), k_positions=torch.arange(6))
    expected = ref.t5_relative_bias([[5], [40]], range(6), table, max_distance=32)
    assert torch.equal(got, as_tensor(expected))


def test_pure_function_equals_module():
    t5 = posenc.T5RelativeBias(3, num_buckets=16, max_distance=50, causal=True)
    q, k = torch.arange(100, 130), torch.arange(130)
    pure = t5_relative_bias(q, k, t5.weight, causal=True, max_distance=50)
    assert torch.equal(pure, t5.bias(30, 130))


def test_bias_is_constant_within_a_bucket():
    t5 = posenc.T5RelativeBias(3, num_buckets=16, max_distance=40)
    bias = t5.bias(60)
    buckets = t5.buckets(60)
    # Bucket 8 (distance 0 after the query) is never used: T5 puts distance 0 before it.
    assert set(buckets.unique().tolist()) == set(range(16)) - {8}
    for bucket in range(16):
        where = buckets == bucket
        for h in range(3):
            values = bias[h][where]
            assert torch.equal(values, t5.weight[bucket, h].detach().expand_as(values))


def test_gradient_reaches_exactly_the_used_buckets():
    t5 = posenc.T5RelativeBias(2, num_buckets=32, max_distance=128)
    t5.bias(5).sum().backward()
    used = t5.buckets(5).unique()
    counts = torch.bincount(t5.buckets(5).flatten(), minlength=32).float()
    assert torch.equal(t5.weight.grad, counts[:, None].expand(32, 2))
    assert used.numel() == 9  # distances -4 .. 4


# --- score_mod ------------------------------------------------------------------


def test_score_mod_equals_bias(grid_score_mod):
    t5 = posenc.T5RelativeBias(4, num_buckets=16, max_distance=20, causal=True)
    q, k = torch.arange(30, 35), torch.arange(35)
    expected = t5.bias(5, 35, q_positions=q, k_positions=k)
    got = grid_score_mod(t5.score_mod(q, k), 2, 4, 5, 35)
    assert torch.equal(got, expected.expand(2, 4, 5, 35))


def test_score_mod_equals_bias_batched(grid_score_mod):
    t5 = posenc.T5RelativeBias(2, num_buckets=8, max_distance=10)
    pos = torch.tensor([[0, 0, 1, 2, 3, 4, 5, 6], [0, 3, 6, 9, 12, 15, 18, 21]])
    expected = t5.bias(8, q_positions=pos, k_positions=pos)
    got = grid_score_mod(t5.score_mod(pos, pos), 2, 2, 8, 8)
    assert torch.equal(got, expected)


# --- module behaviour -----------------------------------------------------------


def test_state_dict_holds_only_the_table():
    t5 = posenc.T5RelativeBias(4)
    assert list(t5.state_dict()) == ["weight"]
    assert t5.weight.shape == (32, 4) and t5.weight.requires_grad
    lut = t5.bucket_lut.clone()
    t5.to(torch.bfloat16)
    assert t5.bucket_lut.dtype == torch.long and torch.equal(t5.bucket_lut, lut)
    assert t5.bias(4).dtype == torch.float32


def test_meta_device_then_to_empty():
    with torch.device("meta"):
        t5 = posenc.T5RelativeBias(2, num_buckets=8, max_distance=16)
    t5.to_empty(device="cpu")
    expected = posenc.t5_relative_bucket(torch.arange(-16, 17), num_buckets=8, max_distance=16)
    assert torch.equal(t5.bucket_lut, expected)


def test_config_round_trip():
    t5 = posenc.build("t5", num_heads=6, num_buckets=16, max_distance=64, causal=True)
    assert isinstance(t5, posenc.T5RelativeBias)
    config = t5.to_config()
    assert config == {
        "name": "t5",
        "num_heads": 6,
        "num_buckets": 16,
        "max_distance": 64,
        "causal": True,
    }
    rebuilt = posenc.build(config)
    rebuilt.load_state_dict(t5.state_dict())
    assert torch.equal(rebuilt.bias(7), t5.bias(7))


# --- causal, and the deprecated bidirectional of posenc 0.1.0 --------------------


def test_default_is_both_directions():
    t5 = posenc.T5RelativeBias(2)
    assert t5.causal is False and t5.to_config()["causal"] is False
    assert torch.equal(t5.bucket_lut, posenc.t5_relative_bucket(torch.arange(-128, 129)))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_bidirectional_still_works_with_a_warning(bidirectional, as_tensor):
    causal = not bidirectional
    rel = torch.arange(-40, 41)
    with pytest.warns(DeprecationWarning, match="bidirectional= is deprecated, use causal="):
        t5 = posenc.T5RelativeBias(3, num_buckets=8, max_distance=12, bidirectional=bidirectional)
    assert t5.causal is causal and t5.to_config()["causal"] is causal
    assert "bidirectional" not in t5.to_config()
    with pytest.warns(DeprecationWarning, match="use causal"):
        assert t5.bidirectional is bidirectional
    with pytest.warns(DeprecationWarning, match="bidirectional= is deprecated"):
        got = posenc.t5_relative_bucket(rel, bidirectional=bidirectional)
    assert torch.equal(got, posenc.t5_relative_bucket(rel, causal=causal))
    q, k = torch.arange(14, 20), torch.arange(20)
    with pytest.warns(DeprecationWarning, match="bidirectional= is deprecated"):
        got = t5_relative_bias(q, k, t5.weight, bidirectional=bidirectional, max_distance=12)
    assert torch.equal(got, t5.bias(6, 20))
    table = t5.weight.detach().double().numpy()
    with pytest.warns(DeprecationWarning, match="bidirectional= is deprecated"):
        expected = ref.t5_relative_bias(q, k, table, bidirectional=bidirectional, max_distance=12)
    assert torch.equal(got, as_tensor(expected))
    with pytest.warns(DeprecationWarning, match="bidirectional= is deprecated"):
        assert ref.t5_relative_bucket(-5, bidirectional=bidirectional) == int(
            posenc.t5_relative_bucket(torch.tensor([-5]), causal=causal)
        )


@pytest.mark.parametrize("bidirectional", [True, False])
def test_a_saved_0_1_0_config_loads_without_a_warning(bidirectional):
    saved = {"name": "t5", "num_heads": 4, "num_buckets": 16, "max_distance": 64}
    saved["bidirectional"] = bidirectional
    args = {k: v for k, v in saved.items() if k != "name"}
    name, upgraded = posenc.T5RelativeBias.upgrade_config(args)
    assert name == "t5"
    assert upgraded == {"num_heads": 4, "num_buckets": 16, "max_distance": 64} | {
        "causal": not bidirectional
    }
    assert "bidirectional" in args  # the caller's dict is left as it was
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t5 = posenc.T5RelativeBias(**upgraded)
        built = posenc.build(saved)
    assert t5.causal is (not bidirectional) and built.to_config() == t5.to_config()


def test_upgrade_config_leaves_new_and_conflicting_configs_alone():
    new = {"num_heads": 4, "causal": True}
    assert posenc.T5RelativeBias.upgrade_config(new) == ("t5", new)
    both = {"num_heads": 4, "causal": True, "bidirectional": True}
    assert posenc.T5RelativeBias.upgrade_config(both) == ("t5", both)
    with pytest.raises(PosEncError, match="bidirectional must be one of True, False"):
        posenc.T5RelativeBias.upgrade_config({"num_heads": 4, "bidirectional": "no"})


# --- bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: posenc.T5RelativeBias(0), "num_heads must be >= 1, got 0"),
        (lambda: posenc.T5RelativeBias(2, num_buckets=1), "num_buckets must be >= 2, got 1"),
        (
            lambda: posenc.T5RelativeBias(2, num_buckets=3),
            "num_buckets must be >= 4 when causal=False",
        ),
        (
            lambda: posenc.T5RelativeBias(2, num_buckets=32, max_distance=15),
            r"max_distance must be >= num_buckets / 2 \(16\), got 15",
        ),
        (
            lambda: posenc.T5RelativeBias(2, num_buckets=8, max_distance=4, causal=True),
            r"max_distance must be > 4 \(the distances with exact buckets\) for "
            r"num_buckets=8, causal=True",
        ),
        (lambda: posenc.T5RelativeBias(2, causal="no"), "causal must be one of"),
        (
            lambda: posenc.T5RelativeBias(2, causal=True, bidirectional=False),
            "give causal or the deprecated bidirectional",
        ),
        (
            lambda: posenc.t5_relative_bucket(torch.tensor([1]), causal=False, bidirectional=True),
            "give causal or the deprecated bidirectional",
        ),
        (
            lambda: posenc.t5_relative_bucket(torch.tensor([1.0])),
            "relative_position must be an integer tensor, got dtype torch.float32",
        ),
        (lambda: posenc.t5_relative_bucket([1, 2]), "relative_position must be a torch.Tensor"),
        (
            lambda: posenc.t5_relative_bucket(torch.tensor([1]), num_buckets=32, max_distance=8),
            r"max_distance must be >= num_buckets / 2 \(16\), got 8",
        ),
        (
            lambda: posenc.T5RelativeBias(2).bias(3, q_positions=torch.tensor([0.0, 1.0, 2.0])),
            "q_positions must be an integer tensor for T5 buckets",
        ),
        (
            lambda: posenc.T5RelativeBias(2).score_mod(torch.arange(2), torch.arange(2.0)),
            "k_positions must be an integer tensor for T5 buckets",
        ),
        (
            lambda: posenc.T5RelativeBias(2).bias(3, k_positions=torch.arange(4)),
            r"k_positions must have length 3",
        ),
        (
            lambda: t5_relative_bias(torch.arange(2), torch.arange(2), torch.zeros(8)),
            r"table must be \[num_buckets, h\]",
        ),
        (
            lambda: t5_relative_bias(torch.arange(2), torch.arange(2), torch.zeros(2, 2)),
            "num_buckets must be >= 4 when causal=False",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()
