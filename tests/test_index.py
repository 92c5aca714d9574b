"""posenc.index: the naive baseline against the reference, and the flaws it is kept to show."""

from __future__ import annotations

import pytest
import torch

import posenc
from conftest import ATOL
from posenc import reference
from posenc.index import NORMALIZE, index_table


def _ref(positions, dim, **kwargs) -> torch.Tensor:
    return torch.from_numpy(
        reference.index_table(torch.as_tensor(positions).double().numpy(), dim, **kwargs)
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("normalize", NORMALIZE)
@pytest.mark.parametrize("dim", [1, 3, 8])
@pytest.mark.parametrize(
    "positions",
    [torch.arange(-3, 20), torch.tensor([0.5, 2.25, 1e4]), torch.arange(12).reshape(3, 4)],
    ids=["int", "float", "batched"],
)
def test_table_matches_reference(positions, dim, normalize, dtype):
    length = 7 if normalize == "length" else None
    out = index_table(positions, dim, normalize=normalize, length=length, dtype=dtype)
    ref = _ref(positions, dim, normalize=normalize, length=length)
    assert out.shape == (*positions.shape, dim) and out.dtype == dtype
    torch.testing.assert_close(
        out, ref.to(dtype), atol=0, rtol=0
    )  # formed in float64, rounded once
    torch.testing.assert_close(out.double(), ref, atol=ATOL[dtype], rtol=2**-8)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
def test_module_adds_the_index(dtype):
    x = torch.randn(2, 5, 4).to(dtype)
    out = posenc.IndexEmbedding(4)(x)
    expected = (x.double() + _ref(torch.arange(5), 4)).to(dtype)
    assert out.dtype == dtype and torch.equal(out, expected)
    batched = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    assert torch.equal(
        posenc.IndexEmbedding(4)(x, batched), (x.double() + _ref(batched, 4)).to(dtype)
    )


def test_module_normalize_length_uses_offset_plus_s():
    pe = posenc.IndexEmbedding(3, normalize="length")
    x = torch.zeros(1, 4, 3, dtype=torch.float64)
    assert torch.equal(pe(x), _ref(torch.arange(4), 3, normalize="length", length=4)[None])
    # decoding with a cache: tokens 6..9 of a 10-token sequence
    assert torch.equal(
        pe(x, offset=6), _ref(torch.arange(6, 10), 3, normalize="length", length=10)[None]
    )


def test_normalize_length_is_not_unique_across_lengths():
    """The flaw: position 5 of 10 tokens gets the encoding of position 10 of 20."""
    pe = posenc.IndexEmbedding(2, normalize="length")
    short = pe(torch.zeros(1, 10, 2))[0, 5]
    long = pe(torch.zeros(1, 20, 2))[0, 10]
    assert torch.equal(short, long)


def test_unnormalized_grows_without_bound():
    """The flaw: at position 1000 the encoding dwarfs unit-scale token embeddings."""
    x = torch.randn(1, 1001, 16)
    out = posenc.IndexEmbedding(16)(x)
    assert torch.equal(out[0, 1000] - x[0, 1000], torch.full((16,), 1000.0))


def test_no_state_and_config_round_trip():
    pe = posenc.IndexEmbedding(6, normalize="length")
    assert pe.state_dict() == {} and pe.kind == "additive"
    again = posenc.build(pe.to_config())
    assert isinstance(again, posenc.IndexEmbedding) and again.to_config() == pe.to_config()
    assert pe.to_config() == {"name": "index", "dim": 6, "normalize": "length"}


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: index_table(torch.arange(3), 0), "dim must be >= 1, got 0"),
        (
            lambda: index_table(torch.arange(3), 2, normalize="max"),
            "normalize must be one of None, 'length', got 'max'",
        ),
        (
            lambda: index_table(torch.arange(3), 2, normalize="length"),
            "length must be given with normalize='length'",
        ),
        (
            lambda: index_table(torch.arange(3), 2, normalize="length", length=0),
            "length must be >= 1, got 0",
        ),
        (
            lambda: index_table(torch.arange(3), 2, length=3),
            "length applies only with normalize='length'",
        ),
        (lambda: index_table(torch.tensor([float("nan")]), 2), "positions must be finite"),
        (
            lambda: index_table(torch.tensor([True]), 2),
            "positions must be an integer or floating tensor",
        ),
        (lambda: index_table(["x"], 2), "positions must be a tensor of numbers"),
        (
            lambda: index_table(torch.arange(3), 2, dtype=torch.int32),
            "dtype must be a floating-point dtype",
        ),
        (lambda: posenc.IndexEmbedding(0), "dim must be >= 1, got 0"),
        (
            lambda: posenc.IndexEmbedding(4, normalize="sqrt"),
            "normalize must be one of None, 'length'",
        ),
        (lambda: posenc.IndexEmbedding(4)(torch.zeros(1, 2, 5)), "x must have last dimension 4"),
        (
            lambda: posenc.IndexEmbedding(4)(torch.zeros(1, 2, 4, dtype=torch.long)),
            "x must have a floating-point dtype",
        ),
        (
            lambda: posenc.IndexEmbedding(4)(torch.zeros(1, 2, 4), torch.arange(3)),
            "positions must have length 2",
        ),
        (lambda: posenc.IndexEmbedding(4)(torch.zeros(2, 2, 4), torch.zeros(3, 2)), "b == 2"),
        (
            lambda: posenc.IndexEmbedding(4)(
                torch.zeros(1, 2, 4), torch.tensor([0.0, float("inf")])
            ),
            "positions must be finite",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(posenc.PosEncError, match=match):
        call()
