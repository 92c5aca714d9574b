"""FIRE: the bias against the float64 reference, the normalised distance's properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import PosEncError
from posenc import reference as ref
from posenc.bias import fire_bias, fire_normalized_distance

TOL = {"rtol": 1e-5, "atol": 1e-5}


def reference_bias(fire, q_positions, k_positions):
    first, last = fire.mlp[0], fire.mlp[2]
    weights = [
        t.detach().double().numpy() for t in (first.weight, first.bias, last.weight, last.bias)
    ]
    return ref.fire_bias(
        q_positions,
        k_positions,
        *weights,
        c=float(fire.c.detach()),
        threshold=float(fire.threshold.detach()),
        eps=fire.eps,
    )


@pytest.mark.parametrize(
    "options",
    [{}, {"init_threshold": 4.0, "init_c": 0.7}, {"mlp_width": 5, "init_c": 2.0}],
    ids=["defaults", "short-threshold", "narrow"],
)
def test_bias_equals_reference(options, as_tensor):
    fire = posenc.FIREBias(3, **options)
    got = fire.bias(10)
    assert got.shape == (3, 10, 10) and got.dtype == torch.float32
    torch.testing.assert_close(got, as_tensor(reference_bias(fire, range(10), range(10))), **TOL)


def test_decoding_and_batched_positions(as_tensor):
    fire = posenc.FIREBias(2, init_threshold=3.0)
    step = fire.bias(2, 9)
    assert torch.equal(step, fire.bias(9)[:, -2:, :])
    torch.testing.assert_close(step, as_tensor(reference_bias(fire, [7, 8], range(9))), **TOL)
    pos = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    got = fire.bias(6, q_positions=pos, k_positions=pos)
    assert got.shape == (2, 2, 6, 6)
    torch.testing.assert_close(
        got, as_tensor(reference_bias(fire, pos.numpy(), pos.numpy())), **TOL
    )


def test_normalized_distance_equals_reference(as_tensor):
    q, k = torch.arange(3, 12), torch.arange(12)
    got = fire_normalized_distance(q, k, c=0.3, threshold=5.0)
    expected = ref.fire_normalized_distance(q.numpy(), k.numpy(), c=0.3, threshold=5.0)
    torch.testing.assert_close(got, as_tensor(expected), rtol=1e-6, atol=1e-6)


@settings(max_examples=30)
@given(
    q_len=st.integers(1, 40),
    start=st.integers(0, 5000),
    c=st.floats(1e-3, 10.0),
    threshold=st.floats(1.0, 2048.0),
)
def test_normalized_distance_of_causal_pairs_is_in_unit_interval(q_len, start, c, threshold):
    q = torch.arange(start, start + q_len)
    k = torch.arange(start + q_len)
    x = fire_normalized_distance(q, k, c=c, threshold=threshold)
    causal = k[None, :] <= q[:, None]
    assert bool((x[causal] >= 0).all()) and bool((x[causal] <= 1).all())
    assert bool((x.diagonal(offset=start) == 0).all())  # distance 0


def test_distance_is_interpolated_past_the_threshold():
    # Past L the farthest key (j = 0) sits at ~1 whatever the query position.
    for i in (20, 200, 2000):
        x = fire_normalized_distance(torch.tensor([i]), torch.tensor([0]), c=0.1, threshold=10.0)
        torch.testing.assert_close(x, torch.ones(1, 1), rtol=0, atol=1e-5)
    # Below L the normaliser is psi(L): distances stay short.
    x = fire_normalized_distance(torch.tensor([5]), torch.tensor([0]), c=0.1, threshold=10.0)
    assert float(x) < 0.6


def test_pure_function_with_any_mlp(as_tensor):
    mlp = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    got = fire_bias(torch.arange(6), torch.arange(6), mlp, c=0.5, threshold=3.0)
    weights = [
        t.detach().double().numpy()
        for t in (mlp[0].weight, mlp[0].bias, mlp[2].weight, mlp[2].bias)
    ]
    expected = ref.fire_bias(range(6), range(6), *weights, c=0.5, threshold=3.0)
    torch.testing.assert_close(got, as_tensor(expected), **TOL)


@pytest.mark.parametrize("batched", [False, True], ids=["shared", "batched"])
def test_score_mod_equals_bias(batched, grid_score_mod):
    fire = posenc.FIREBias(3, init_threshold=4.0)
    pos = (
        torch.tensor([[0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6]]) if batched else torch.arange(7)
    )
    expected = fire.bias(7, q_positions=pos, k_positions=pos)
    with torch.no_grad():
        got = grid_score_mod(fire.score_mod(pos, pos), 2, 3, 7, 7)
    torch.testing.assert_close(got, expected.detach().expand(2, 3, 7, 7), **TOL)


def test_gradients_reach_every_parameter():
    fire = posenc.FIREBias(2, init_threshold=2.0)
    fire.bias(6).pow(2).sum().backward()
    for name, p in fire.named_parameters():
        assert p.grad is not None and bool(p.grad.abs().sum() > 0), name


def test_config_round_trip_and_dtype():
    fire = posenc.build("fire", num_heads=4, mlp_width=8, init_c=0.2, init_threshold=64.0)
    assert fire.to_config() == {
        "name": "fire",
        "num_heads": 4,
        "mlp_width": 8,
        "init_c": 0.2,
        "init_threshold": 64.0,
        "eps": 1e-6,
    }
    rebuilt = posenc.build(fire.to_config())
    rebuilt.load_state_dict(fire.state_dict())
    assert torch.equal(rebuilt.bias(5), fire.bias(5))
    assert fire.to(torch.bfloat16).bias(5).dtype == torch.float32


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: posenc.FIREBias(0), "num_heads must be >= 1, got 0"),
        (lambda: posenc.FIREBias(2, mlp_width=0), "mlp_width must be >= 1, got 0"),
        (lambda: posenc.FIREBias(2, init_c=0.0), "init_c must be > 0.0, got 0.0"),
        (lambda: posenc.FIREBias(2, init_threshold=-1.0), "init_threshold must be > 0.0"),
        (lambda: posenc.FIREBias(2, eps=-1.0), "eps must be >= 0.0, got -1.0"),
        (
            lambda: posenc.FIREBias(2).bias(3, q_positions=torch.arange(2)),
            "q_positions must have length 3",
        ),
        (
            lambda: fire_normalized_distance(torch.arange(2), torch.arange(2), c=torch.ones(2)),
            "c must be a number or a one-element floating tensor",
        ),
        (
            lambda: fire_normalized_distance(
                torch.arange(2), torch.arange(2), threshold=float("inf")
            ),
            "threshold must be finite",
        ),
        (
            lambda: fire_bias(torch.arange(2), torch.arange(2), lambda x: x.sum(-1)),
            r"mlp must map \[\.\.\., 1\] to \[\.\.\., h\]",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()
