"""Shaw et al. relative keys and values against the float64 reference."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import PosEncError
from posenc import reference as ref
from posenc.bias import shaw_relative_logits, shaw_relative_values

F64 = {"rtol": 1e-5, "atol": 1e-6}


def tables(shaw):
    rel_v = None if shaw.rel_v is None else shaw.rel_v.detach().double().numpy()
    return shaw.rel_k.detach().double().numpy(), rel_v


def randomized(shaw):
    """Tables of size ~1, so a wrong row shows."""
    with torch.no_grad():
        for p in shaw.parameters():
            p.normal_()
    return shaw


@pytest.mark.parametrize("max_distance", [1, 3, 16])
def test_logits_equal_reference(max_distance, as_tensor):
    shaw = randomized(posenc.ShawRelativeBias(3, 8, max_distance=max_distance))
    q = torch.randn(2, 3, 7, 8)
    got = shaw.bias(7, q=q)
    assert got.shape == (2, 3, 7, 7) and got.dtype == torch.float32
    rel_k, _ = tables(shaw)
    expected = ref.shaw_relative_logits(q.double().numpy(), rel_k, range(7), range(7))
    torch.testing.assert_close(got, as_tensor(expected), **F64)


@pytest.mark.parametrize("max_distance", [2, 16])
def test_values_equal_reference(max_distance, as_tensor):
    shaw = randomized(posenc.ShawRelativeBias(2, 4, max_distance=max_distance, values=True))
    probs = torch.rand(2, 2, 6, 6).softmax(-1)
    got = shaw.value_bias(probs)
    assert got.shape == (2, 2, 6, 4) and got.dtype == torch.float32
    _, rel_v = tables(shaw)
    expected = ref.shaw_relative_values(probs.double().numpy(), rel_v, range(6), range(6))
    torch.testing.assert_close(got, as_tensor(expected), **F64)


def test_decoding_queries_are_the_last_positions(as_tensor):
    shaw = randomized(posenc.ShawRelativeBias(2, 4, max_distance=3, values=True))
    q = torch.randn(1, 2, 2, 4)
    probs = torch.rand(1, 2, 2, 9).softmax(-1)
    rel_k, rel_v = tables(shaw)
    expected = ref.shaw_relative_logits(q.double().numpy(), rel_k, [7, 8], range(9))
    torch.testing.assert_close(shaw.bias(2, 9, q=q), as_tensor(expected), **F64)
    expected = ref.shaw_relative_values(probs.double().numpy(), rel_v, [7, 8], range(9))
    torch.testing.assert_close(shaw.value_bias(probs), as_tensor(expected), **F64)


def test_batched_positions(as_tensor):
    shaw = randomized(posenc.ShawRelativeBias(2, 4, max_distance=2, values=True))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    pos = posenc.positions.from_attention_mask(mask)
    q = torch.randn(2, 2, 6, 4)
    probs = torch.rand(2, 2, 6, 6).softmax(-1)
    rel_k, rel_v = tables(shaw)
    got = shaw.bias(6, q=q, q_positions=pos, k_positions=pos)
    expected = ref.shaw_relative_logits(q.double().numpy(), rel_k, pos.numpy(), pos.numpy())
    torch.testing.assert_close(got, as_tensor(expected), **F64)
    got = shaw.value_bias(probs, q_positions=pos, k_positions=pos)
    expected = ref.shaw_relative_values(probs.double().numpy(), rel_v, pos.numpy(), pos.numpy())
    torch.testing.assert_close(got, as_tensor(expected), **F64)


def test_distances_beyond_max_distance_share_the_edge_rows():
    shaw = randomized(posenc.ShawRelativeBias(1, 4, max_distance=2))
    q = torch.randn(1, 1, 1, 4)
    k = torch.tensor([-30, -3, -2, 2, 3, 30])
    logits = shaw.bias(1, 6, q=q, q_positions=torch.tensor([0]), k_positions=k)[0, 0, 0]
    edge = q[0, 0, 0] @ shaw.rel_k.detach().t()  # [5]: distances -2 .. 2
    torch.testing.assert_close(logits, edge[[0, 0, 0, 4, 4, 4]], rtol=0, atol=0)


def test_pure_functions_equal_module():
    shaw = randomized(posenc.ShawRelativeBias(2, 4, max_distance=3, values=True))
    q, probs = torch.randn(1, 2, 5, 4), torch.rand(1, 2, 5, 5)
    pos = torch.arange(5)
    assert torch.equal(shaw_relative_logits(q, shaw.rel_k, pos, pos), shaw.bias(5, q=q))
    assert torch.equal(shaw_relative_values(probs, shaw.rel_v, pos, pos), shaw.value_bias(probs))


def test_bfloat16_queries_give_float32():
    shaw = posenc.ShawRelativeBias(2, 4, max_distance=3).to(torch.bfloat16)
    q = torch.randn(1, 2, 3, 4, dtype=torch.bfloat16)
    got = shaw.bias(3, q=q)
    assert got.dtype == torch.float32
    expected = ref.shaw_relative_logits(
        q.double().numpy(), shaw.rel_k.detach().double().numpy(), range(3), range(3)
    )
    torch.testing.assert_close(got, torch.from_numpy(expected).float(), **F64)


def test_gradients_reach_the_tables():
    shaw = posenc.ShawRelativeBias(2, 4, max_distance=1, values=True)
    q = torch.randn(1, 2, 4, 4, requires_grad=True)
    probs = torch.rand(1, 2, 4, 4, requires_grad=True)
    (shaw.bias(4, q=q).sum() + shaw.value_bias(probs).sum()).backward()
    for grad in (shaw.rel_k.grad, shaw.rel_v.grad, q.grad, probs.grad):
        assert grad is not None and bool(grad.abs().sum() > 0)


def test_flags_and_config():
    keys = posenc.ShawRelativeBias(4, 8)
    both = posenc.build("shaw", num_heads=4, head_dim=8, max_distance=5, values=True)
    assert keys.query_dependent and both.query_dependent
    assert not keys.value_dependent and both.value_dependent
    assert keys.score_mod(torch.arange(3), torch.arange(3)) is None
    assert keys.rel_v is None and list(keys.state_dict()) == ["rel_k"]
    assert both.to_config() == {
        "name": "shaw",
        "num_heads": 4,
        "head_dim": 8,
        "max_distance": 5,
        "values": True,
    }
    rebuilt = posenc.build(both.to_config())
    rebuilt.load_state_dict(both.state_dict())
    q = torch.randn(1, 4, 3, 8)
    assert torch.equal(rebuilt.bias(3, q=q), both.bias(3, q=q))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: posenc.ShawRelativeBias(0, 8), "num_heads must be >= 1, got 0"),
        (lambda: posenc.ShawRelativeBias(2, 0), "head_dim must be >= 1, got 0"),
        (lambda: posenc.ShawRelativeBias(2, 8, max_distance=0), "max_distance must be >= 1, got 0"),
        (lambda: posenc.ShawRelativeBias(2, 8, values="yes"), "values must be one of True, False"),
        (
            lambda: posenc.ShawRelativeBias(2, 4).bias(3),
            "q must be given: ShawRelativeBias is query-dependent",
        ),
        (
            lambda: posenc.ShawRelativeBias(2, 4).bias(3, q=torch.randn(1, 3, 3, 4)),
            r"q must have 2 heads \(num_heads\)",
        ),
        (
            lambda: posenc.ShawRelativeBias(2, 4).bias(3, q=torch.randn(1, 2, 3, 5)),
            r"q must have head_dim \(4\) channels in dim 3, got shape \(1, 2, 3, 5\)",
        ),
        (
            lambda: posenc.ShawRelativeBias(2, 4).bias(3, q=torch.randn(1, 2, 4, 4)),
            r"q must have q_len \(3\) queries",
        ),
        (
            lambda: posenc.ShawRelativeBias(2, 4).bias(3, q=torch.randn(2, 3, 4)),
            r"q must be \[b, h, q, d\]",
        ),
        (
            lambda: posenc.ShawRelativeBias(2, 4).bias(
                3, q=torch.randn(1, 2, 3, 4), q_positions=torch.tensor([0.0, 1.0, 2.0])
            ),
            "q_positions must be an integer tensor for Shaw relative positions",
        ),
        (
            lambda: posenc.ShawRelativeBias(2, 4).bias(
                3, q=torch.randn(2, 2, 3, 4), q_positions=torch.zeros(3, 3, dtype=torch.long)
            ),
            r"q_positions of shape \[b, s\] must have b == 2",
        ),
        (
            lambda: posenc.ShawRelativeBias(2, 4).value_bias(torch.rand(1, 2, 3, 3)),
            "value_bias needs relative value vectors: build ShawRelativeBias with values=True",
        ),
        (
            lambda: posenc.ShawRelativeBias(2, 4, values=True).value_bias(torch.rand(1, 2, 3)),
            r"probs must be \[b, h, q, k\]",
        ),
        (
            lambda: posenc.ShawRelativeBias(2, 4, values=True).value_bias(
                torch.rand(1, 2, 3, 3), k_positions=torch.arange(4)
            ),
            "k_positions must have length 3",
        ),
        (
            lambda: shaw_relative_logits(
                torch.randn(1, 1, 2, 4), torch.zeros(4, 4), torch.arange(2), torch.arange(2)
            ),
            r"table must be \[2 \* max_distance \+ 1, d\] \(an odd number of rows\)",
        ),
        (
            lambda: shaw_relative_values(
                torch.rand(1, 1, 2, 2), torch.zeros(3, 4), torch.arange(2), torch.arange(3)
            ),
            "q_positions and k_positions must have lengths 2 and 2",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()
