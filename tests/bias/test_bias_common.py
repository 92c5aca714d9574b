"""What every registered bias encoding shares: the BiasEncoding contract, configs, positions."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import PosEncError
from posenc._base import BiasEncoding

# Registry name -> constructor arguments (4 heads everywhere).
BIASES = {
    "alibi": {"num_heads": 4},
    "t5": {"num_heads": 4, "num_buckets": 8, "max_distance": 16},
    "shaw": {"num_heads": 4, "head_dim": 8, "max_distance": 3, "values": True},
    "fire": {"num_heads": 4, "mlp_width": 8, "init_threshold": 4.0},
    "kerple": {"num_heads": 4},
}


def call_bias(enc, q_len, k_len=None, **positions):
    if enc.query_dependent:
        q = torch.randn(2, enc.num_heads, q_len, 8, generator=torch.Generator().manual_seed(3))
        return enc.bias(q_len, k_len, q=q, **positions)
    return enc.bias(q_len, k_len, **positions)


def test_every_bias_is_registered():
    assert {"alibi", "t5", "shaw", "fire", "kerple"} <= set(posenc.registry.names())
    for name in BIASES:
        assert name in posenc.__all__ or posenc.registry.get(name).__name__ in posenc.__all__


@pytest.mark.parametrize("name", list(BIASES))
def test_contract(name):
    enc = posenc.build(name, **BIASES[name])
    assert isinstance(enc, BiasEncoding) and enc.kind == "bias" and enc.name == name
    assert enc.num_heads == 4
    full = call_bias(enc, 6)
    lead = (2,) if enc.query_dependent else ()
    assert full.shape == (*lead, 4, 6, 6) and full.dtype == torch.float32
    assert bool(torch.isfinite(full).all())
    # Decoding: the queries are the last positions; explicit positions give the same.
    step = call_bias(enc, 2, 6)
    assert step.shape == (*lead, 4, 2, 6)
    explicit = call_bias(enc, 2, 6, q_positions=torch.arange(4, 6), k_positions=torch.arange(6))
    assert torch.equal(step, explicit)
    # More queries than keys and no positions: queries at arange(q_len) (cross-attention),
    # the rule of posenc.positions.resolve_pair (also RotaryEmbedding's and attention's).
    cross = call_bias(enc, 5, 3)
    assert torch.equal(cross, call_bias(enc, 5, 3, q_positions=torch.arange(5)))


@pytest.mark.parametrize("name", list(BIASES))
def test_config_round_trip_and_state_dict(name):
    enc = posenc.build(name, **BIASES[name])
    config = enc.to_config()
    rebuilt = posenc.build(config)
    assert rebuilt.to_config() == config
    rebuilt.load_state_dict(enc.state_dict(), strict=True)
    assert torch.equal(call_bias(rebuilt, 5), call_bias(enc, 5))


@pytest.mark.parametrize("name", list(BIASES))
def test_bfloat16_module_gives_float32_bias(name):
    enc = posenc.build(name, **BIASES[name])
    assert call_bias(enc.to(torch.bfloat16), 4).dtype == torch.float32


@pytest.mark.parametrize("name", [n for n in BIASES if n != "shaw"])
def test_score_mod_exists_for_query_independent_biases(name):
    enc = posenc.build(name, **BIASES[name])
    assert callable(enc.score_mod(torch.arange(3), torch.arange(3)))


@pytest.mark.parametrize("name", list(BIASES))
def test_num_heads_must_be_positive(name):
    with pytest.raises(PosEncError, match="num_heads must be >= 1, got 0"):
        posenc.build(name, **{**BIASES[name], "num_heads": 0})
    with pytest.raises(PosEncError, match="num_heads must be an integer"):
        posenc.build(name, **{**BIASES[name], "num_heads": "4"})


def test_unknown_argument_is_rejected():
    with pytest.raises(PosEncError, match="cannot build 'alibi'"):
        posenc.build("alibi", num_heads=4, slope=0.5)
