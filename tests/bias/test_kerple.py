"""KERPLE (logarithmic): the bias against the float64 reference and its shape in distance."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import PosEncError
from posenc import reference as ref
from posenc.bias import kerple_bias

TOL = {"rtol": 1e-6, "atol": 1e-6}


def params(kerple):
    eps = kerple.eps
    return (
        kerple.r1.detach().clamp(min=eps).double().numpy(),
        kerple.r2.detach().clamp(min=eps).double().numpy(),
    )


def test_bias_equals_reference(as_tensor):
    kerple = posenc.KerpleBias(4)
    got = kerple.bias(9)
    assert got.shape == (4, 9, 9) and got.dtype == torch.float32
    torch.testing.assert_close(
        got, as_tensor(ref.kerple_bias(range(9), range(9), *params(kerple))), **TOL
    )


def test_decoding_batched_and_fractional_positions(as_tensor):
    kerple = posenc.KerpleBias(3)
    step = kerple.bias(2, 8)
    assert torch.equal(step, kerple.bias(8)[:, -2:, :])
    torch.testing.assert_close(
        step, as_tensor(ref.kerple_bias([6, 7], range(8), *params(kerple))), **TOL
    )
    pos = torch.tensor([[0, 0, 1, 2], [0, 1, 2, 3]])
    got = kerple.bias(4, q_positions=pos, k_positions=pos)
    expected = ref.kerple_bias(pos.numpy(), pos.numpy(), *params(kerple))
    torch.testing.assert_close(got, as_tensor(expected), **TOL)
    q, k = torch.tensor([0.5, 2.25]), torch.tensor([0.0, 1.0, 2.0])
    got = kerple.bias(2, 3, q_positions=q, k_positions=k)
    torch.testing.assert_close(
        got, as_tensor(ref.kerple_bias(q.numpy(), k.numpy(), *params(kerple))), **TOL
    )


def test_parameters_are_clamped_to_eps(as_tensor):
    kerple = posenc.KerpleBias(2, eps=0.05)
    with torch.no_grad():
        kerple.r1.copy_(torch.tensor([-1.0, 0.5]))
        kerple.r2.copy_(torch.tensor([0.3, -2.0]))
    expected = ref.kerple_bias(range(5), range(5), [0.05, 0.5], [0.3, 0.05])
    torch.testing.assert_close(kerple.bias(5), as_tensor(expected), **TOL)


@settings(max_examples=30)
@given(
    r1=st.floats(1e-2, 10.0),
    r2=st.floats(1e-2, 10.0),
    start=st.integers(-1000, 1000),
)
def test_bias_is_zero_at_distance_zero_and_non_increasing_in_distance(r1, r2, start):
    distances = torch.arange(0, 300)
    bias = kerple_bias(
        torch.tensor([start]), start - distances, torch.tensor([r1]), torch.tensor([r2])
    )[0, 0]
    assert float(bias[0]) == 0.0
    assert bool((bias[1:] <= bias[:-1]).all())
    # Symmetric: keys after the query see the same distance.
    after = kerple_bias(
        torch.tensor([start]), start + distances, torch.tensor([r1]), torch.tensor([r2])
    )
    assert torch.equal(after[0, 0], bias)


@pytest.mark.parametrize("batched", [False, True], ids=["shared", "batched"])
def test_score_mod_equals_bias(batched, grid_score_mod):
    kerple = posenc.KerpleBias(3)
    pos = torch.tensor([[0, 0, 1, 2, 3], [0, 2, 4, 6, 8]]) if batched else torch.arange(5)
    expected = kerple.bias(5, q_positions=pos, k_positions=pos).detach()
    with torch.no_grad():
        got = grid_score_mod(kerple.score_mod(pos, pos), 2, 3, 5, 5)
    torch.testing.assert_close(got, expected.expand(2, 3, 5, 5), **TOL)


def test_gradients_and_config():
    kerple = posenc.build("kerple", num_heads=3, eps=0.02)
    assert kerple.to_config() == {"name": "kerple", "num_heads": 3, "eps": 0.02}
    kerple.bias(5).sum().backward()
    assert bool(kerple.r1.grad.abs().sum() > 0) and bool(kerple.r2.grad.abs().sum() > 0)
    rebuilt = posenc.build(kerple.to_config())
    rebuilt.load_state_dict(kerple.state_dict())
    assert torch.equal(rebuilt.bias(4), kerple.bias(4))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: posenc.KerpleBias(0), "num_heads must be >= 1, got 0"),
        (lambda: posenc.KerpleBias(2, eps=0.0), "eps must be > 0.0, got 0.0"),
        (
            lambda: posenc.KerpleBias(2).bias(2, 3, q_positions=torch.arange(3)),
            "q_positions must have length 2",
        ),
        (
            lambda: kerple_bias(torch.arange(2), torch.arange(2), torch.ones(2), torch.ones(3)),
            "r1 and r2 must have the same shape",
        ),
        (
            lambda: kerple_bias(torch.arange(2), torch.arange(2), torch.ones(2), -torch.ones(2)),
            "r1 and r2 must be finite and > 0",
        ),
        (
            lambda: kerple_bias(
                torch.arange(2), torch.arange(2), torch.ones(2, 1), torch.ones(2, 1)
            ),
            r"r1 must be a non-empty \[h\] tensor",
        ),
        (
            lambda: kerple_bias(
                torch.arange(2), torch.arange(2), torch.ones(2), torch.tensor([1.0, float("nan")])
            ),
            "r1 and r2 must be finite and > 0",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()
